// The run configuration's keys whose value is a list of tables: train.precision_phases and optimizer.groups.
// Each may be written as an array of inline tables (`groups = [{ match = "h.*", lr_scale = 0.5 }]`) or as
// TOML's array of tables (`[[optimizer.groups]]`), which toml++ reads as the same array; the resolved
// configuration writes the inline form.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "config_key.h"
#include "octet/model/precision_policy.h"

namespace octet::config_detail {
namespace {

// Far more than a run needs; bounds what is read and printed.
constexpr size_t kMaxPhases = 64;
constexpr size_t kMaxGroups = 256;

// The array of tables a key holds, each table's keys among `fields`; refuses anything else, naming the
// entry (1-based) and the field.
const toml::array& tables_of(const toml::node& n, const std::string& where, const std::string& name,
                             size_t max_entries, const std::vector<std::string>& fields,
                             const std::string& example) {
  const toml::array* a = n.as_array();
  if (a == nullptr) {
    fail(fmt::format("{}: {} must be a list of tables such as {}, got {}", where, name, example,
                     describe_node(n)));
  }
  if (a->size() > max_entries)
    fail(fmt::format("{}: {} holds {} entries; at most {} are allowed", where, name, a->size(), max_entries));
  for (size_t i = 0; i < a->size(); ++i) {
    const toml::table* t = (*a)[i].as_table();
    if (t == nullptr) {
      fail(fmt::format("{}: entry {} of {} must be a table such as {}, got {}", where, i + 1, name, example,
                       describe_node((*a)[i])));
    }
    for (const auto& [key, value] : *t) {
      const std::string field(key.str());
      if (std::find(fields.begin(), fields.end(), field) == fields.end()) {
        fail(fmt::format("{}: entry {} of {} has an unknown key {}; its keys are {}", where, i + 1, name,
                         shown(field), fmt::join(fields, ", ")));
      }
    }
  }
  return *a;
}

// A float32 field of at least 0.
float non_negative(const toml::node& n, const std::string& where, const std::string& field) {
  if (!n.is_number())
    fail(fmt::format("{}: {} must be a number (at least 0), got {}", where, field, describe_node(n)));
  const double v = *n.value<double>();
  const auto f = static_cast<float>(v);
  if (!std::isfinite(f) || f < 0.0f)
    fail(fmt::format("{}: {} must be a finite number of at least 0, got {}", where, field, v));
  return f;
}

}  // namespace

Key precision_phases(std::string name, std::function<std::vector<PrecisionPhase>&(RunConfig&)> ref,
                     std::string description) {
  const std::string example = "{ mode = \"bf16\", steps = 200 }";
  return {
      name,
      "list of tables",
      "up to 64 tables { mode = \"fp32\", \"bf16\" or \"fp8\", steps = at least 1 (all but the last) }",
      std::move(description),
      [=](RunConfig& c, const toml::node& n, const std::string& where) {
        const toml::array& a = tables_of(n, where, name, kMaxPhases, {"mode", "steps"}, example);
        std::vector<PrecisionPhase> out;
        for (size_t i = 0; i < a.size(); ++i) {
          const toml::table& t = *a[i].as_table();
          const std::string entry = fmt::format("entry {} of {}", i + 1, name);
          const toml::node* mode = t.get("mode");
          if (mode == nullptr)
            fail(fmt::format("{}: {} has no mode; give one, as in {}", where, entry, example));
          const std::optional<MixedPrecision> parsed =
              mode->is_string() ? parse_mixed_precision(*mode->value<std::string>()) : std::nullopt;
          if (!parsed) {
            fail(fmt::format("{}: {} has mode = {}; expected one of \"fp32\", \"bf16\", \"fp8\"", where,
                             entry,
                             mode->is_string() ? quote(*mode->value<std::string>()) : describe_node(*mode)));
          }
          PrecisionPhase phase{*parsed, 0};
          if (const toml::node* steps = t.get("steps")) {
            if (!steps->is_integer() || *steps->value<int64_t>() < 1) {
              fail(fmt::format(
                  "{}: {} has steps = {}; a phase's steps are an integer of at least 1", where, entry,
                  steps->is_integer() ? std::to_string(*steps->value<int64_t>()) : describe_node(*steps)));
            }
            phase.steps = *steps->value<int64_t>();
          }
          out.push_back(phase);
        }
        ref(c) = std::move(out);
      },
      [=](const RunConfig& c) {
        std::vector<std::string> entries;
        for (const PrecisionPhase& p : ref(const_cast<RunConfig&>(c))) {
          entries.push_back(p.steps > 0 ? fmt::format("{{ mode = \"{}\", steps = {} }}",
                                                      mixed_precision_name(p.mode), p.steps)
                                        : fmt::format("{{ mode = \"{}\" }}", mixed_precision_name(p.mode)));
        }
        return fmt::format("[{}]", fmt::join(entries, ", "));
      }};
}

Key parameter_groups(std::string name, std::function<std::vector<ParameterGroup>&(RunConfig&)> ref,
                     std::string description) {
  const std::string example = "{ match = \"h.*.attn.*\", lr_scale = 0.5 }";
  return {
      name,
      "list of tables",
      "up to 256 tables { match = a parameter-name glob, lr_scale = at least 0, weight_decay = at least 0 "
      "(optional) }",
      std::move(description),
      [=](RunConfig& c, const toml::node& n, const std::string& where) {
        const toml::array& a =
            tables_of(n, where, name, kMaxGroups, {"match", "lr_scale", "weight_decay"}, example);
        std::vector<ParameterGroup> out;
        for (size_t i = 0; i < a.size(); ++i) {
          const toml::table& t = *a[i].as_table();
          const std::string entry = fmt::format("entry {} of {}", i + 1, name);
          const toml::node* match = t.get("match");
          if (match == nullptr || !match->is_string()) {
            fail(fmt::format("{}: {} needs match = a parameter-name glob, as in {}, got {}", where, entry,
                             example, match == nullptr ? "none" : describe_node(*match)));
          }
          ParameterGroup group;
          group.match = *match->value<std::string>();
          check_glob(group.match, where, entry);
          if (const toml::node* scale = t.get("lr_scale"))
            group.lr_scale = non_negative(*scale, where, entry + ": lr_scale");
          if (const toml::node* decay = t.get("weight_decay"))
            group.weight_decay = non_negative(*decay, where, entry + ": weight_decay");
          out.push_back(std::move(group));
        }
        ref(c) = std::move(out);
      },
      [=](const RunConfig& c) {
        std::vector<std::string> entries;
        for (const ParameterGroup& g : ref(const_cast<RunConfig&>(c))) {
          std::string e =
              fmt::format("{{ match = {}, lr_scale = {}", toml_string(g.match), format_number(g.lr_scale));
          if (g.weight_decay) e += fmt::format(", weight_decay = {}", format_number(*g.weight_decay));
          entries.push_back(e + " }");
        }
        return fmt::format("[{}]", fmt::join(entries, ", "));
      }};
}

}  // namespace octet::config_detail
