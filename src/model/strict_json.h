// Reading the JSON files that octet writes for its users to keep and edit (calibration files, precision
// maps): strict parsing (bounded nesting, a key given twice refused, an object at the top) and typed fields
// whose refusals name the file and the field, each one clear invalid_input error. Internal to the engine
// (nlohmann's JSON is not part of octet's public headers).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace octet {

class StrictJsonReader {
 public:
  using Json = nlohmann::ordered_json;

  // `file` names the file in every message: "calibration file configs/x.calibration.json".
  explicit StrictJsonReader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& what) const;
  // The object `text` holds, refused when it is nested deeper than `max_depth` (the levels of a `kind`: "a
  // calibration file"), is not JSON, gives a key twice in one object (rather than silently taking one of
  // them) or is not an object.
  Json parse(std::string_view text, int64_t max_depth, std::string_view kind) const;

  // object[key], where `where` names the object in messages ("layers[3]").
  const Json& member(const Json& object, const std::string& where, const char* key) const;
  std::string text(const Json& object, const std::string& where, const char* key) const;
  int64_t integer(const Json& object, const std::string& where, const char* key, int64_t low,
                  int64_t high) const;
  bool boolean(const Json& object, const std::string& where, const char* key) const;
  // A finite number within [low, high]; with `nullable`, null too (read as NaN).
  double number(const Json& object, const std::string& where, const char* key, double low, double high,
                bool nullable = false) const;

 private:
  std::string file_;
};

}  // namespace octet
