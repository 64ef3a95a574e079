// Hugging Face's safetensors format, for float32 tensors: an unsigned 64-bit little-endian header length N,
// N bytes of JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ..., "__metadata__": {string:
// string}}, padded with spaces to a multiple of 8), then the raw little-endian data, offsets counted from the
// start of the data section. Checkpoints write and read F32 only; the Hugging Face import also reads BF16,
// F16 and F8_E4M3 (widened to float32, exactly) and the FP8 export writes F8_E4M3 codes as raw bytes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "octet/numerics/minifloat.h"

namespace octet::io {

// One tensor to write: its data stays owned by the caller.
struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> data;  // product(shape) floats, row-major
};

// One tensor to write as stored bytes of `dtype` (f32, bf16, f16 or e4m3: safetensors' F32, BF16, F16 and
// F8_E4M3), little-endian, row-major.
struct SafetensorsRawEntry {
  std::string name;
  Dtype dtype = Dtype::f32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;  // product(shape) elements of dtype
};

struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // the stored values, widened to float32 where they were narrower
  Dtype stored = Dtype::f32;
};

// Which stored dtypes a read accepts: F32 only (checkpoints), or also BF16, F16 and F8_E4M3.
struct SafetensorsReadOptions {
  bool widen_narrow_floats = false;
};

// safetensors' name of a dtype ("F32", "BF16", "F16", "F8_E4M3"); throws for dtypes it has no name for here.
std::string_view safetensors_dtype_name(Dtype dtype);

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
// The same for tensors given as stored bytes of any dtype above.
void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsRawEntry> tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads a whole file, validating everything before returning anything: the header length lies within the
// file, the header is JSON of the expected form, every dtype is F32 (or one that `options` accepts), every
// shape's size times the dtype's width equals its offset span, and the tensors tile the data section exactly (no overlap, no gap, nothing truncated, nothing
// trailing). Throws invalid_input naming the file and the problem.
SafetensorsFile read_safetensors(const std::filesystem::path& path, const SafetensorsReadOptions& options = {});

}  // namespace octet::io
