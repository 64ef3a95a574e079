// The run configuration's key type (internal to src/config/): each key knows its type, its valid values,
// how to set it from a TOML node and how to print it back. One builder per value type makes a key; the
// table of keys is in config_keys.cpp, and the helpers that format values and messages are shared with
// run_config.cpp.
#pragma once

#define TOML_HEADER_ONLY 1
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "octet/config/run_config.h"

namespace octet::config_detail {

// Throws octet::Error (invalid_input) with `message`.
[[noreturn]] void fail(const std::string& message);

// Input echoed into a message: cut short, control characters and invalid bytes escaped.
std::string shown(std::string_view s, size_t max_chars = 60);

// A string value in a message.
std::string quote(std::string_view s);

// A string as a TOML basic string that parses back to exactly `s` (quotes, backslashes and control
// characters escaped).
std::string toml_string(std::string_view s);

// A node's type and value as a message shows what it got ("integer 3", "an array").
std::string describe_node(const toml::node& n);

// Refuses a glob (a name pattern of `name`) that is not printable UTF-8 text of at most 256 bytes.
void check_glob(const std::string& value, const std::string& where, const std::string& name);

// Numbers are float32 settings: the shortest text that reads back as the same float ("0.1", not
// "0.10000000149011612").
std::string format_number(float v);

struct Key {
  std::string name;  // section.key
  std::string type;
  std::string valid;
  std::string description;
  std::function<void(RunConfig&, const toml::node&, const std::string& where)> set;
  std::function<std::string(const RunConfig&)> get;
};

// The single table of keys (config_keys.cpp).
const std::vector<Key>& keys();

template <typename T>
Key integer(std::string name, std::function<T&(RunConfig&)> ref, int64_t lo, int64_t hi,
            std::string description) {
  std::string valid = hi == std::numeric_limits<int64_t>::max() ? fmt::format("at least {}", lo)
                                                                : fmt::format("{} to {}", lo, hi);
  return {
      name,
      "integer",
      valid,
      std::move(description),
      [=](RunConfig& c, const toml::node& n, const std::string& where) {
        if (!n.is_integer())
          fail(fmt::format("{}: {} must be an integer ({}), got {}", where, name, valid, describe_node(n)));
        const int64_t v = *n.value<int64_t>();
        if (v < lo || v > hi) fail(fmt::format("{}: {} must be {}, got {}", where, name, valid, v));
        ref(c) = static_cast<T>(v);
      },
      [=](const RunConfig& c) { return fmt::format("{}", ref(const_cast<RunConfig&>(c))); }};
}

Key number(std::string name, std::function<float&(RunConfig&)> ref, double lo, bool lo_open, double hi,
           bool hi_open, std::string description);

Key boolean(std::string name, std::function<bool&(RunConfig&)> ref, std::string description);

Key text(std::string name, std::function<std::string(const RunConfig&)> get,
         std::function<void(RunConfig&, std::string)> put, std::string description);

template <typename E>
Key choice(std::string name, std::function<E&(RunConfig&)> ref,
           std::vector<std::pair<std::string, E>> options, std::string description) {
  std::string valid;
  for (size_t i = 0; i < options.size(); ++i) valid += (i ? ", " : "") + quote(options[i].first);
  return {name,
          "string",
          "one of " + valid,
          std::move(description),
          [=](RunConfig& c, const toml::node& n, const std::string& where) {
            const std::string seen = n.is_string() ? quote(*n.value<std::string>()) : describe_node(n);
            if (n.is_string()) {
              for (const auto& [spelling, value] : options) {
                if (*n.value<std::string>() == spelling) {
                  ref(c) = value;
                  return;
                }
              }
            }
            fail(fmt::format("{}: {} = {} is not valid; expected one of {}", where, name, seen, valid));
          },
          [=](const RunConfig& c) {
            for (const auto& [spelling, value] : options) {
              if (ref(const_cast<RunConfig&>(c)) == value) return toml_string(spelling);
            }
            return std::string("\"?\"");
          }};
}

Key strings(std::string name, std::function<std::vector<std::string>&(RunConfig&)> ref,
            std::string description);

// train.precision_phases: a list of tables {mode, steps} (config_tables.cpp).
Key precision_phases(std::string name, std::function<std::vector<PrecisionPhase>&(RunConfig&)> ref,
                     std::string description);
// optimizer.groups: a list of tables {match, lr_scale, weight_decay} (config_tables.cpp).
Key parameter_groups(std::string name, std::function<std::vector<ParameterGroup>&(RunConfig&)> ref,
                     std::string description);

// The checks of a precision schedule against the rest of the configuration (precision_phases.cpp).
void check_precision_phases(const RunConfig& config, const std::string& origin);

}  // namespace octet::config_detail
