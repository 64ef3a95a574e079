// Reading untrusted input: whole regular files of bounded size (a FIFO, device or directory is refused
// instead of blocking or reading forever), the nesting depth of JSON text (checked before a recursive
// consumer sees it), UTF-8 validation, and showing input in a one-line message (cut short, control
// characters and invalid bytes escaped).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace octet::io {

// The whole content of `path`, which must be a regular file of at most `max_bytes` bytes. The file is opened
// without blocking, so a FIFO never hangs the reader. `what` names the file's role in messages ("config
// file", "checkpoint state"). Throws invalid_input naming the file when it is missing, not a regular file
// (a directory is called one), larger than `max_bytes`, or unreadable.
std::string read_regular_file(const std::filesystem::path& path, std::string_view what, int64_t max_bytes);

// Opens `path` for reading without blocking and checks that it is a regular file; returns the descriptor
// (the caller closes it) and sets `size`. Throws invalid_input as read_regular_file does.
int open_regular_file(const std::filesystem::path& path, std::string_view what, int64_t& size);

// The deepest nesting of arrays and objects in JSON text (brackets inside strings do not count). Stops
// counting at `limit` + 1, so it runs in one pass over any input.
int64_t json_nesting_depth(std::string_view text, int64_t limit);

// The byte offset of the first byte of `text` that is not part of a well-formed UTF-8 sequence (no overlong
// forms, surrogates or code points past U+10FFFF), or npos when the whole text is valid.
size_t first_invalid_utf8(std::string_view text);
inline bool is_valid_utf8(std::string_view text) {
  return first_invalid_utf8(text) == std::string_view::npos;
}

// `text` as it may be shown inside a one-line message: printable ASCII and valid UTF-8 kept, control
// characters, DEL, backslashes and invalid bytes as \xNN, and text longer than `max_chars` characters cut
// to its first `max_chars` followed by "...".
std::string printable(std::string_view text, size_t max_chars = 60);

}  // namespace octet::io
