// Helpers for the data-layer tests: a temporary directory that removes itself, small file utilities, and a
// check that a call fails with octet's invalid-input error.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "octet/check.h"

namespace octet::testing {

// A fresh directory under the system's temporary directory, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

void write_file(const std::filesystem::path& path, std::string_view bytes);
std::string read_file_bytes(const std::filesystem::path& path);
// Names of the entries of a directory, sorted.
std::vector<std::string> directory_listing(const std::filesystem::path& directory);

// Runs `call`, expects it to throw octet::Error of kind invalid_input (exit code 2), and returns the message
// (empty, with a test failure recorded, when it did not).
std::string invalid_input_message(const std::function<void()>& call);

}  // namespace octet::testing
