// safetensors: a round trip, the byte layout Hugging Face's reader expects, and every validation error.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "checkpoint_fixture.h"
#include "octet/check.h"
#include "octet/io/safetensors.h"
#include "files.h"

namespace octet {
namespace {

using io::read_safetensors;
using io::SafetensorsEntry;
using io::write_safetensors;
using testing::ScratchDir;

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A file made by hand from a header and a data section.
std::string file_with(const std::string& header, size_t data_bytes) {
  const uint64_t n = header.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  return bytes + header + std::string(data_bytes, '\0');
}

TEST(Safetensors, RoundTripsTensorsAndMetadataBitForBit) {
  ScratchDir dir;
  const std::vector<float> a = {1.0f, -2.5f, 3.25e-39f /* subnormal */, -0.0f, 65504.0f, 7.0f};
  const std::vector<float> b = {0.1f, 0.2f, 0.3f};
  const std::vector<SafetensorsEntry> tensors = {{"a", {2, 3}, a}, {"b.bias", {3}, b}, {"empty", {0, 4}, {}}};
  write_safetensors(dir.path() / "x.safetensors", tensors, {{"format", "pt"}, {"k", "v"}});
  const io::SafetensorsFile f = read_safetensors(dir.path() / "x.safetensors");
  ASSERT_EQ(f.tensors.size(), 3u);
  ASSERT_NE(f.find("a"), nullptr);
  EXPECT_EQ(f.find("a")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(f.find("a")->data.data(), a.data(), a.size() * 4), 0);
  EXPECT_EQ(f.find("b.bias")->data, b);
  EXPECT_EQ(f.find("empty")->shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.metadata.at("k"), "v");
  EXPECT_EQ(f.find("nope"), nullptr);
}

TEST(Safetensors, LayoutIsLengthPaddedJsonThenLittleEndianData) {
  ScratchDir dir;
  const std::vector<float> a = {1.0f, 2.0f};
  write_safetensors(dir.path() / "x.safetensors", std::vector<SafetensorsEntry>{{"w", {2}, a}});
  const std::string bytes = read_bytes(dir.path() / "x.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 8);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.rfind(R"({"w":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})", 0), 0u) << header;
  EXPECT_EQ(header.find_first_not_of(' ', header.find('}') + 2), std::string::npos) << "padding is spaces";
  EXPECT_EQ(bytes.substr(8 + n), std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8));
}

TEST(Safetensors, WriterRefusesRepeatedNamesAndWrongSizes) {
  ScratchDir dir;
  const std::vector<float> a = {1.0f, 2.0f};
  EXPECT_THROW(
      write_safetensors(dir.path() / "x", std::vector<SafetensorsEntry>{{"w", {2}, a}, {"w", {2}, a}}),
      Error);
  EXPECT_THROW(write_safetensors(dir.path() / "x", std::vector<SafetensorsEntry>{{"w", {3}, a}}), Error);
}

// The reader's message for a file, which must name the file; "" when it reads.
std::string error_for(const std::filesystem::path& path) {
  try {
    read_safetensors(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    return e.what();
  }
  return "";
}

struct BadFile {
  const char* what;
  std::string bytes;
  std::string expected;  // a part of the message
};

TEST(Safetensors, ReaderRefusesEveryKindOfBrokenFile) {
  ScratchDir dir;
  const auto entry = [](const char* name, const char* dtype, const char* shape, const char* offsets) {
    return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":{}}})", name, dtype, shape, offsets);
  };
  const std::string good =
      "{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[1]", "[8,12]") + "}";
  std::string too_long = file_with(good, 12);
  const uint64_t huge = 1u << 20;
  std::memcpy(too_long.data(), &huge, 8);
  const std::vector<BadFile> cases = {
      {"shorter than 8 bytes", "abc", "shorter than the 8-byte header length"},
      {"header length past the end", too_long, "runs past the end of the file"},
      {"header not JSON", file_with("{\"a\": ", 0), "not valid JSON"},
      {"header not an object", file_with("[1, 2]", 0), "not a JSON object"},
      {"entry without dtype", file_with(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4),
       "lacks dtype, shape or data_offsets"},
      {"BF16 dtype", file_with("{" + entry("a", "BF16", "[2]", "[0,4]") + "}", 4), "dtype BF16"},
      {"negative shape", file_with("{" + entry("a", "F32", "[-2]", "[0,8]") + "}", 8), "not a size"},
      {"shape and offsets disagree", file_with("{" + entry("a", "F32", "[3]", "[0,8]") + "}", 8),
       "needs 12 bytes"},
      {"offsets reversed", file_with("{" + entry("a", "F32", "[0]", "[8,4]") + "}", 8),
       "end before they begin"},
      {"offsets not two numbers", file_with("{" + entry("a", "F32", "[1]", "[0]") + "}", 4), "not two sizes"},
      {"truncated data", file_with(good, 10), "truncated"},
      {"overlapping tensors",
       file_with("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[1]", "[4,8]") + "}", 8),
       "overlaps"},
      {"a gap",
       file_with("{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[8,12]") + "}",
                 12),
       "belong to no tensor"},
      {"trailing bytes", file_with(good, 16), "the tensors cover 12"},
      {"metadata not strings", file_with(R"({"__metadata__":{"a":1}})", 0), "is not a string"},
      {"nested too deep", file_with("{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}", 0),
       "nested more than 64 deep"},
      {"a name with control characters, echoed escaped",
       file_with("{" + entry("a\\u001b[31m", "BF16", "[2]", "[0,4]") + "}", 4), "tensor 'a\\x1b[31m'"},
      {"a huge name, echoed cut short", file_with("{" + entry(std::string(5000, 'n').c_str(), "BF16", "[2]", "[0,4]") + "}", 4),
       std::string(60, 'n') + "...'"},
  };
  for (const BadFile& c : cases) {
    const std::filesystem::path path = dir.path() / "bad.safetensors";
    write_bytes(path, c.bytes);
    const std::string message = error_for(path);
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.what << ": " << message;
  }
  write_bytes(dir.path() / "good.safetensors", file_with(good, 12));
  EXPECT_EQ(error_for(dir.path() / "good.safetensors"), "");
  EXPECT_NE(error_for(dir.path() / "missing.safetensors").find("cannot open"), std::string::npos);
  // A FIFO is refused at once.
  const testing::FifoWithLateWriter fifo(dir.path() / "fifo.safetensors");
  const auto began = std::chrono::steady_clock::now();
  EXPECT_NE(error_for(fifo.path()).find("is a FIFO, not a regular file"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(2));
}

}  // namespace
}  // namespace octet
