// Writing a small file so that a reader sees either the previous file or the whole new one, never a part.
#pragma once

#include <filesystem>
#include <string_view>

namespace octet::io {

// Writes `contents` to a temporary file in the same directory (rename is atomic only within one file
// system), flushes it to disk, renames it over `path` and flushes the directory. The file's mode is that of
// any new file: 0666 minus the umask. Throws octet::Error
// (invalid input) naming the file when any step fails; the temporary is removed then.
void write_file_atomically(const std::filesystem::path& path, std::string_view contents);

// Flushes directory `dir` (its entries: files created, renamed or removed in it) to disk. Throws
// octet::Error (invalid input) naming the directory when it cannot be opened or flushed.
void fsync_directory(const std::filesystem::path& dir);

}  // namespace octet::io
