// The key builders and the value and message helpers of the run configuration (see config_key.h).
#include "config_key.h"

#include <algorithm>
#include <cmath>

#include "octet/check.h"
#include "octet/io/input.h"

namespace octet::config_detail {
namespace {

// Bounds of string values: longer paths name nothing a file system holds, and octet's layer names are
// short. They also bound the text to_toml writes (escapes at most double a string).
constexpr size_t kMaxPathBytes = 4096;
constexpr size_t kMaxGlobs = 256;
constexpr size_t kMaxGlobBytes = 256;

}  // namespace

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorKind::invalid_input, message);
}

std::string shown(std::string_view s, size_t max_chars) {
  return io::printable(s, max_chars);
}

std::string quote(std::string_view s) {
  return fmt::format("\"{}\"", shown(s));
}

std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7F) {
      out += fmt::format("\\u{:04X}", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string describe_node(const toml::node& n) {
  if (n.is_string()) return fmt::format("string {}", quote(*n.value<std::string>()));
  if (n.is_integer()) return fmt::format("integer {}", *n.value<int64_t>());
  if (n.is_floating_point()) return fmt::format("number {}", *n.value<double>());
  if (n.is_boolean()) return fmt::format("boolean {}", *n.value<bool>() ? "true" : "false");
  if (n.is_array()) return "an array";
  if (n.is_table()) return "a table";
  return "a date or time";
}

void check_glob(const std::string& value, const std::string& where, const std::string& name) {
  const size_t invalid = io::first_invalid_utf8(value);
  if (invalid != std::string::npos) {
    fail(fmt::format("{}: {} holds a string that is not valid UTF-8 (byte {} of {})", where, name, invalid,
                     quote(value)));
  }
  const bool control = std::any_of(value.begin(), value.end(), [](char ch) {
    return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7F;
  });
  if (value.size() > kMaxGlobBytes || control) {
    fail(fmt::format("{}: {} holds {}; a glob is printable text of at most {} bytes", where, name,
                     quote(value), kMaxGlobBytes));
  }
}

std::string format_number(float v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // keep it a TOML float
  return s;
}

Key number(std::string name, std::function<float&(RunConfig&)> ref, double lo, bool lo_open, double hi,
           bool hi_open, std::string description) {
  std::string valid;
  const bool unbounded = hi == std::numeric_limits<double>::infinity();
  if (unbounded) {
    valid = fmt::format("{} {}", lo_open ? "greater than" : "at least", lo);
  } else {
    valid = fmt::format("{}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  }
  return {name,
          "number",
          valid,
          std::move(description),
          [=](RunConfig& c, const toml::node& n, const std::string& where) {
            if (!n.is_number())
              fail(fmt::format("{}: {} must be a number ({}), got {}", where, name, valid, describe_node(n)));
            const double v = *n.value<double>();
            // The setting is a float32: the range applies to the value it will hold, and a number that only
            // a double can hold (1e300, 1e-50) is refused rather than trained on as inf or 0.
            const float f = static_cast<float>(v);
            const double held = f;
            const bool ok = std::isfinite(held) && (lo_open ? held > lo : held >= lo) &&
                            (hi_open ? held < hi : held <= hi);
            if (!ok) {
              const std::string as_float =
                  std::isfinite(v) && held != v ? fmt::format(", which is {} as float32", f) : "";
              fail(fmt::format("{}: {} must be {}, got {}{}", where, name, valid, v, as_float));
            }
            ref(c) = f;
          },
          [=](const RunConfig& c) { return format_number(ref(const_cast<RunConfig&>(c))); }};
}

Key boolean(std::string name, std::function<bool&(RunConfig&)> ref, std::string description) {
  return {name,
          "boolean",
          "true or false",
          std::move(description),
          [=](RunConfig& c, const toml::node& n, const std::string& where) {
            if (!n.is_boolean())
              fail(fmt::format("{}: {} must be true or false, got {}", where, name, describe_node(n)));
            ref(c) = *n.value<bool>();
          },
          [=](const RunConfig& c) {
            return ref(const_cast<RunConfig&>(c)) ? std::string("true") : std::string("false");
          }};
}

Key text(std::string name, std::function<std::string(const RunConfig&)> get,
         std::function<void(RunConfig&, std::string)> put, std::string description) {
  return {name,
          "string",
          "a path: UTF-8 text without control characters, at most 4096 bytes",
          std::move(description),
          [=](RunConfig& c, const toml::node& n, const std::string& where) {
            if (!n.is_string())
              fail(fmt::format("{}: {} must be a string, got {}", where, name, describe_node(n)));
            const std::string value = *n.value<std::string>();
            if (value.size() > kMaxPathBytes) {
              fail(fmt::format("{}: {} is {} bytes long; a path has at most {}", where, name, value.size(),
                               kMaxPathBytes));
            }
            // A path that TOML cannot hold back, or that the file system would cut at a NUL, would make the
            // saved config.toml unreadable or name another file.
            const size_t invalid = io::first_invalid_utf8(value);
            if (invalid != std::string::npos) {
              fail(fmt::format("{}: {} is not valid UTF-8 (byte {} of the value); paths must be UTF-8 text",
                               where, name, invalid));
            }
            const auto control = std::find_if(value.begin(), value.end(), [](char ch) {
              return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7F;
            });
            if (control != value.end()) {
              fail(fmt::format(
                  "{}: {} holds a control character (byte {} of the value); paths must be printable text",
                  where, name, control - value.begin()));
            }
            put(c, value);
          },
          [=](const RunConfig& c) { return toml_string(get(c)); }};
}

Key strings(std::string name, std::function<std::vector<std::string>&(RunConfig&)> ref,
            std::string description) {
  return {name,
          "list of strings",
          "up to 256 layer-name globs such as \"h.0.*\" or \"*.mlp.*\", each at most 256 bytes",
          std::move(description),
          [=](RunConfig& c, const toml::node& n, const std::string& where) {
            const toml::array* a = n.as_array();
            if (a == nullptr)
              fail(fmt::format("{}: {} must be a list of strings, got {}", where, name, describe_node(n)));
            if (a->size() > kMaxGlobs) {
              fail(fmt::format("{}: {} holds {} globs; at most {} are allowed", where, name, a->size(),
                               kMaxGlobs));
            }
            std::vector<std::string> out;
            for (const toml::node& e : *a) {
              if (!e.is_string())
                fail(fmt::format("{}: {} must hold strings only, got {}", where, name, describe_node(e)));
              const std::string value = *e.value<std::string>();
              check_glob(value, where, name);
              out.push_back(value);
            }
            ref(c) = std::move(out);
          },
          [=](const RunConfig& c) {
            std::string s = "[";
            const auto& v = ref(const_cast<RunConfig&>(c));
            for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + toml_string(v[i]);
            return s + "]";
          }};
}

}  // namespace octet::config_detail
