// Reading and writing safetensors files (see safetensors.h).
#include "octet/io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/io/input.h"
#include "octet/numerics/format.h"

namespace octet::io {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
// A header is an object of objects of arrays: depth 3. Deeper JSON is refused before it is parsed, since
// the JSON library's dump, copy and comparison recurse.
constexpr int64_t kMaxHeaderDepth = 64;

// A tensor or metadata name as shown in a message.
std::string shown(std::string_view name) {
  return io::printable(name);
}

// Writes all of `bytes` to `fd`, naming `path` on failure.
void write_all(int fd, const void* bytes, size_t size, const std::filesystem::path& path) {
  const char* p = static_cast<const char*>(bytes);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    OCTET_REQUIRE(n > 0, "cannot write {}: {}", path.string(), std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

// The number of elements of `shape`, or -1 when a dimension is negative or the product (in float32 bytes)
// overflows.
int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (const int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && count > std::numeric_limits<int64_t>::max() / 4 / d) return -1;
    count *= d;
  }
  return count;
}

int64_t dtype_bytes(Dtype dtype) {
  return dtype_info(dtype).storage_bits / 8;
}

// The dtype safetensors names `name`, among those octet reads; nullopt for any other.
std::optional<Dtype> dtype_of_name(std::string_view name) {
  for (const Dtype d : {Dtype::f32, Dtype::bf16, Dtype::f16, Dtype::e4m3}) {
    if (safetensors_dtype_name(d) == name) return d;
  }
  return std::nullopt;
}

// Stored little-endian elements of `dtype` widened to float32; every bf16, f16 and e4m3 value is exactly a
// float32.
void widen(const char* bytes, Dtype dtype, std::vector<float>& out) {
  const size_t width = static_cast<size_t>(dtype_bytes(dtype));
  if (dtype == Dtype::f32) {
    if (!out.empty()) std::memcpy(out.data(), bytes, out.size() * sizeof(float));
    return;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t code = 0;
    std::memcpy(&code, bytes + i * width, width);
    out[i] = decode(dtype, code);
  }
}

}  // namespace

std::string_view safetensors_dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::f32: return "F32";
    case Dtype::bf16: return "BF16";
    case Dtype::f16: return "F16";
    case Dtype::e4m3: return "F8_E4M3";
    default: break;
  }
  OCTET_CHECK(false, "a dtype safetensors names (f32, bf16, f16, e4m3), got {}", dtype_name(dtype));
  return {};
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  for (const SafetensorsTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsEntry> tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsRawEntry> raw;
  raw.reserve(tensors.size());
  for (const SafetensorsEntry& t : tensors) {
    const int64_t count = element_count(t.shape);
    OCTET_REQUIRE(count == static_cast<int64_t>(t.data.size()),
                  "cannot write {}: tensor '{}' has {} floats for a shape of {} elements", path.string(),
                  t.name, t.data.size(), count);
    raw.push_back({t.name, Dtype::f32, t.shape,
                   {reinterpret_cast<const uint8_t*>(t.data.data()), t.data.size_bytes()}});
  }
  write_safetensors(path, raw, metadata);
}

void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsRawEntry> tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsRawEntry& t : tensors) {
    OCTET_REQUIRE(t.name != "__metadata__" && names.insert(t.name).second,
                  "cannot write {}: tensor name '{}' is reserved or repeated", path.string(), t.name);
    const int64_t count = element_count(t.shape);
    const uint64_t bytes = static_cast<uint64_t>(count) * static_cast<uint64_t>(dtype_bytes(t.dtype));
    OCTET_REQUIRE(count >= 0 && bytes == t.bytes.size(),
                  "cannot write {}: tensor '{}' has {} bytes for a shape of {} elements of {}", path.string(),
                  t.name, t.bytes.size(), count, safetensors_dtype_name(t.dtype));
    header[t.name] = {{"dtype", std::string(safetensors_dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t length = text.size();

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  OCTET_REQUIRE(fd >= 0, "cannot create {}: {}", path.string(), std::strerror(errno));
  try {
    write_all(fd, &length, sizeof(length), path);
    write_all(fd, text.data(), text.size(), path);
    for (const SafetensorsRawEntry& t : tensors) write_all(fd, t.bytes.data(), t.bytes.size(), path);
    OCTET_REQUIRE(::fsync(fd) == 0, "cannot flush {} to disk: {}", path.string(), std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  OCTET_REQUIRE(::close(fd) == 0, "cannot close {}: {}", path.string(), std::strerror(errno));
}

SafetensorsFile read_safetensors(const std::filesystem::path& path, const SafetensorsReadOptions& options) {
  const std::string file = path.string();
  // Regular files only (a FIFO would block), and no larger than an index can address.
  const std::string bytes = read_regular_file(path, "safetensors file", std::numeric_limits<int64_t>::max());

  OCTET_REQUIRE(bytes.size() >= 8,
                "{} is not a safetensors file: {} bytes, shorter than the 8-byte header "
                "length",
                file, bytes.size());
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), sizeof(header_length));
  OCTET_REQUIRE(header_length <= kMaxHeaderBytes && header_length <= bytes.size() - 8,
                "{}: the header length {} runs past the end of the file ({} bytes)", file, header_length,
                bytes.size());
  const std::string_view header_text(bytes.data() + 8, header_length);
  OCTET_REQUIRE(json_nesting_depth(header_text, kMaxHeaderDepth) <= kMaxHeaderDepth,
                "{}: the header is nested more than {} deep; a safetensors header is an object of tensor "
                "entries",
                file, kMaxHeaderDepth);
  nlohmann::json header;
  try {
    header =
        nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(header_length));
  } catch (const nlohmann::json::exception& e) {
    OCTET_REQUIRE(false, "{}: the header is not valid JSON: {}", file, io::printable(e.what(), 200));
  }
  OCTET_REQUIRE(header.is_object(), "{}: the header is not a JSON object", file);
  const uint64_t data_size = bytes.size() - 8 - header_length;

  struct Span {
    uint64_t begin, end;
    size_t tensor;
  };
  SafetensorsFile result;
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      OCTET_REQUIRE(entry.is_object(), "{}: __metadata__ is not an object of strings", file);
      for (const auto& [key, value] : entry.items()) {
        OCTET_REQUIRE(value.is_string(), "{}: __metadata__ entry '{}' is not a string", file, shown(key));
        result.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    OCTET_REQUIRE(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                      entry.contains("data_offsets"),
                  "{}: tensor '{}' lacks dtype, shape or data_offsets", file, shown(name));
    const nlohmann::json& dtype = entry["dtype"];
    OCTET_REQUIRE(dtype.is_string(), "{}: tensor '{}' has a dtype that is not a string", file, shown(name));
    const std::optional<Dtype> stored = dtype_of_name(dtype.get<std::string>());
    const bool accepted =
        stored.has_value() && (*stored == Dtype::f32 || options.widen_narrow_floats);
    OCTET_REQUIRE(accepted, "{}: tensor '{}' has dtype {}; octet reads only {}", file, shown(name),
                  shown(dtype.get<std::string>()),
                  options.widen_narrow_floats ? "F32, BF16, F16 and F8_E4M3" : "F32");
    const nlohmann::json& shape = entry["shape"];
    OCTET_REQUIRE(shape.is_array(), "{}: tensor '{}' has a shape that is not an array", file, shown(name));
    SafetensorsTensor tensor;
    tensor.name = name;
    tensor.stored = *stored;
    const uint64_t width = static_cast<uint64_t>(dtype_bytes(*stored));
    for (const nlohmann::json& d : shape) {
      OCTET_REQUIRE(d.is_number_unsigned(), "{}: tensor '{}' has a shape entry {} that is not a size", file,
                    shown(name), shown(d.dump()));
      OCTET_REQUIRE(d.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                    "{}: tensor '{}' has a shape entry {} too large", file, shown(name), shown(d.dump()));
      tensor.shape.push_back(d.get<int64_t>());
    }
    const nlohmann::json& offsets = entry["data_offsets"];
    OCTET_REQUIRE(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                      offsets[1].is_number_unsigned(),
                  "{}: tensor '{}' has data_offsets {} that are not two sizes", file, shown(name),
                  shown(offsets.dump()));
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    OCTET_REQUIRE(begin <= end, "{}: tensor '{}' has data_offsets [{}, {}] that end before they begin", file,
                  shown(name), begin, end);
    const int64_t count = element_count(tensor.shape);
    OCTET_REQUIRE(count >= 0 && static_cast<uint64_t>(count) * width == end - begin,
                  "{}: tensor '{}' of shape [{}] needs {} bytes but its data_offsets [{}, {}] span {}", file,
                  shown(name), fmt::join(tensor.shape, ", "),
                  count < 0 ? -1 : count * static_cast<int64_t>(width), begin, end, end - begin);
    OCTET_REQUIRE(end <= data_size,
                  "{}: tensor '{}' ends at byte {} of the data section, which has only {} bytes (truncated "
                  "file?)",
                  file, shown(name), end, data_size);
    spans.push_back({begin, end, result.tensors.size()});
    result.tensors.push_back(std::move(tensor));
  }

  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (const Span& s : spans) {
    const std::string& name = result.tensors[s.tensor].name;
    OCTET_REQUIRE(s.begin >= covered, "{}: tensor '{}' at bytes [{}, {}] overlaps the tensor before it", file,
                  shown(name), s.begin, s.end);
    OCTET_REQUIRE(s.begin == covered, "{}: bytes [{}, {}] of the data section belong to no tensor", file,
                  covered, s.begin);
    covered = s.end;
  }
  OCTET_REQUIRE(covered == data_size, "{}: the data section has {} bytes but the tensors cover {}", file,
                data_size, covered);

  const char* data = bytes.data() + 8 + header_length;
  std::vector<SafetensorsTensor> ordered;
  ordered.reserve(spans.size());
  for (const Span& s : spans) {
    SafetensorsTensor& t = result.tensors[s.tensor];
    t.data.resize((s.end - s.begin) / static_cast<uint64_t>(dtype_bytes(t.stored)));
    widen(data + s.begin, t.stored, t.data);
    ordered.push_back(std::move(t));
  }
  result.tensors = std::move(ordered);
  return result;
}

}  // namespace octet::io
