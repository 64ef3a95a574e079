// See toml_text_check.h.
#include "toml_text_check.h"

#include <vector>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet {
namespace {

constexpr int kMaxKeyParts = 8;
constexpr size_t kMaxValueDepth = 16;

}  // namespace

int64_t check_toml_text(std::string_view text, const std::string& origin) {
  int64_t non_ascii_line = 0;
  bool line_start = true;  // only whitespace so far on this line, outside any array or inline table
  int64_t line = 1;
  std::vector<char> open;  // the arrays and inline tables the scan is inside
  bool in_key = true;      // before a key's '=' (or in a [table] header)
  int key_parts = 1;
  auto refuse = [&](const std::string& what) {
    throw Error(ErrorKind::invalid_input, fmt::format("{}:{}: {}", origin, line, what));
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      if (open.empty()) in_key = true, key_parts = 1, line_start = true;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r') continue;
    const bool header = line_start && c == '[';
    line_start = false;
    if (header) {
      // toml++ 3.3 assumes (TOML_ASSUME, undefined behaviour when false) that a table header's brackets are
      // followed by a key: anything else is refused here.
      size_t j = i + 1;
      if (j < text.size() && text[j] == '[') ++j;
      while (j < text.size() && (text[j] == ' ' || text[j] == '\t')) ++j;
      const char k = j < text.size() ? text[j] : '\n';
      const bool key_start = (k >= 'A' && k <= 'Z') || (k >= 'a' && k <= 'z') || (k >= '0' && k <= '9') ||
                             k == '_' || k == '-' || k == '"' || k == '\'';
      if (!key_start) refuse("not valid TOML: a table header must name a table, as in [train]");
      i = j - 1;
      continue;
    }
    if (c == '#') {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      const bool multiline = text.substr(i, 3) == std::string(3, c);
      const std::string_view close = multiline ? text.substr(i, 3) : text.substr(i, 1);
      size_t j = i + close.size();
      while (j < text.size() && text.substr(j, close.size()) != close) {
        if (c == '"' && text[j] == '\\') ++j;  // an escape: the next byte cannot end the string
        if (j < text.size() && text[j] == '\n') ++line;
        if (!multiline && j < text.size() && text[j] == '\n') break;
        ++j;
      }
      if (j >= text.size() || text[j] == '\n') return non_ascii_line;  // unterminated: the parser says where
      i = j + close.size() - 1;
      if (multiline) {  // """a"""" is valid: up to two more quotes belong to the string
        while (i + 1 < text.size() && text[i + 1] == c) ++i;
      }
    } else if (static_cast<unsigned char>(c) >= 0x80) {
      if (non_ascii_line == 0) non_ascii_line = line;
    } else if (in_key) {
      if (c == '.' && ++key_parts > kMaxKeyParts) {
        refuse(fmt::format("a key nested more than {} levels deep; octet's keys are section.key", kMaxKeyParts));
      } else if (c == '=') {
        in_key = false;
        key_parts = 1;
      } else if (c == '}' && !open.empty()) {
        open.pop_back();
        in_key = false;
      }
    } else if (c == '[' || c == '{') {
      open.push_back(c);
      if (open.size() > kMaxValueDepth) {
        refuse(fmt::format("arrays or inline tables nested more than {} deep; octet's values are flat",
                           kMaxValueDepth));
      }
      if (c == '{') in_key = true, key_parts = 1;
    } else if ((c == ']' || c == '}') && !open.empty()) {
      open.pop_back();
    } else if (c == ',' && !open.empty() && open.back() == '{') {
      in_key = true;
      key_parts = 1;
    }
  }
  return non_ascii_line;
}

}  // namespace octet
