// See strict_json.h.
#include "strict_json.h"

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/io/input.h"

namespace octet {

void StrictJsonReader::fail(const std::string& what) const {
  throw Error(ErrorKind::invalid_input, fmt::format("{}: {}", file_, what));
}

StrictJsonReader::Json StrictJsonReader::parse(std::string_view text, int64_t max_depth,
                                               std::string_view kind) const {
  if (io::json_nesting_depth(text, max_depth) > max_depth) {
    fail(fmt::format("nested deeper than the {} levels of {}", max_depth, kind));
  }
  Json root;
  std::string duplicate;
  std::vector<std::set<std::string>> keys;  // of each object being parsed, innermost last
  try {
    root = Json::parse(text, [&](int, Json::parse_event_t event, Json& parsed) {
      if (event == Json::parse_event_t::object_start) keys.emplace_back();
      if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
      if (event == Json::parse_event_t::key && !keys.empty() &&
          !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
      return true;
    });
  } catch (const Json::exception& e) {
    fail(fmt::format("not valid JSON ({})", io::printable(e.what(), 120)));
  }
  if (!duplicate.empty()) fail(fmt::format("the key \"{}\" appears twice in one object", io::printable(duplicate)));
  if (!root.is_object()) fail(fmt::format("must hold a JSON object, got {}", root.type_name()));
  return root;
}

const StrictJsonReader::Json& StrictJsonReader::member(const Json& object, const std::string& where,
                                                       const char* key) const {
  if (!object.is_object()) fail(fmt::format("{} must be an object, got {}", where, object.type_name()));
  const auto it = object.find(key);
  if (it == object.end()) fail(fmt::format("{} has no \"{}\"", where, key));
  return *it;
}

std::string StrictJsonReader::text(const Json& object, const std::string& where, const char* key) const {
  const Json& v = member(object, where, key);
  if (!v.is_string()) fail(fmt::format("{}.{} must be a string, got {}", where, key, v.type_name()));
  return v.get<std::string>();
}

int64_t StrictJsonReader::integer(const Json& object, const std::string& where, const char* key, int64_t low,
                                  int64_t high) const {
  const Json& v = member(object, where, key);
  if (!v.is_number_integer()) fail(fmt::format("{}.{} must be a whole number, got {}", where, key, v.type_name()));
  // A number beyond int64 reads as an unsigned integer: refused as out of range.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(high)) {
    fail(fmt::format("{}.{} must be from {} to {}, got {}", where, key, low, high, v.dump()));
  }
  const int64_t value = v.get<int64_t>();
  if (value < low || value > high) {
    fail(fmt::format("{}.{} must be from {} to {}, got {}", where, key, low, high, value));
  }
  return value;
}

bool StrictJsonReader::boolean(const Json& object, const std::string& where, const char* key) const {
  const Json& v = member(object, where, key);
  if (!v.is_boolean()) fail(fmt::format("{}.{} must be true or false, got {}", where, key, v.type_name()));
  return v.get<bool>();
}

double StrictJsonReader::number(const Json& object, const std::string& where, const char* key, double low,
                                double high, bool nullable) const {
  const Json& v = member(object, where, key);
  if (nullable && v.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (!v.is_number()) {
    fail(fmt::format("{}.{} must be a number{}, got {}", where, key, nullable ? " or null" : "", v.type_name()));
  }
  const double d = v.get<double>();
  if (!(std::isfinite(d) && d >= low && d <= high)) {
    fail(fmt::format("{}.{} = {} must be from {} to {}", where, key, v.dump(), low, high));
  }
  return d;
}

}  // namespace octet
