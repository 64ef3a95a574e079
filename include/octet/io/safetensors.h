// Hugging Face's safetensors format, for float32 tensors: an unsigned 64-bit little-endian header length N,
// N bytes of JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ..., "__metadata__": {string:
// string}}, padded with spaces to a multiple of 8), then the raw little-endian data, offsets counted from the
// start of the data section. octet writes and reads F32 only; other dtypes are refused by name.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace octet::io {

// One tensor to write: its data stays owned by the caller.
struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> data;  // product(shape) floats, row-major
};

struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct SafetensorsFile {
  std::vector<SafetensorsTensor> tensors;  // in the order of their data offsets
  std::map<std::string, std::string> metadata;
  // The tensor named `name`, or null.
  const SafetensorsTensor* find(std::string_view name) const;
};

// Writes the tensors (in the given order) and metadata to `path` and flushes the file to disk (fsync). Throws
// invalid_input when a name repeats, a shape does not match its data, or the file cannot be written.
void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsEntry> tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads a whole file, validating everything before returning anything: the header length lies within the
// file, the header is JSON of the expected form, every dtype is F32, every shape's size times 4 equals its
// offset span, and the tensors tile the data section exactly (no overlap, no gap, nothing truncated, nothing
// trailing). Throws invalid_input naming the file and the problem.
SafetensorsFile read_safetensors(const std::filesystem::path& path);

}  // namespace octet::io
