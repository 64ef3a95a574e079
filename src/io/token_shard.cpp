// Writing token shards atomically and mapping them for reading, with the validation that turns a damaged or
// foreign file into one clear error naming the file.
#include "octet/io/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "octet/check.h"
#include "octet/io/input.h"

// The format is little-endian and the tokens are read in place from the mapping.
static_assert(std::endian::native == std::endian::little,
              "token shards are read in place: needs a little-endian host");

namespace octet::io {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// Closes a file descriptor on every path out of a function.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now and reports whether the close succeeded (a failed close can mean lost writes).
  bool close() {
    int fd = std::exchange(fd_, -1);
    return fd < 0 || ::close(fd) == 0;
  }

 private:
  int fd_;
};

void write_all(int fd, const void* data, size_t bytes, const std::filesystem::path& path) {
  const char* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t written = ::write(fd, cursor, bytes);
    if (written < 0 && errno == EINTR) continue;
    OCTET_REQUIRE(written > 0, "token shard {}: cannot write: {}", path.string(), errno_text());
    cursor += written;
    bytes -= static_cast<size_t>(written);
  }
}

// Converts `tokens` to the on-disk width in blocks, so that a shard of any size is written with a small
// buffer. Every token is checked to fit before it is narrowed.
template <typename Stored>
void write_tokens(int fd, std::span<const int32_t> tokens, const std::filesystem::path& final_path,
                  const std::filesystem::path& temp_path) {
  constexpr size_t kBlock = size_t{1} << 20;
  constexpr int64_t kMax = std::numeric_limits<Stored>::max();
  std::vector<Stored> block;
  block.reserve(std::min(kBlock, tokens.size()));
  for (size_t begin = 0; begin < tokens.size(); begin += kBlock) {
    size_t end = std::min(tokens.size(), begin + kBlock);
    block.clear();
    for (size_t i = begin; i < end; ++i) {
      int32_t token = tokens[i];
      OCTET_REQUIRE(token >= 0 && token <= kMax,
                    "token shard {}: token {} at index {} does not fit a {}-byte token", final_path.string(),
                    token, i, sizeof(Stored));
      block.push_back(static_cast<Stored>(token));
    }
    write_all(fd, block.data(), block.size() * sizeof(Stored), temp_path);
  }
}

}  // namespace

TokenWidth token_width_for_vocab(int64_t vocab_size) {
  OCTET_REQUIRE(vocab_size > 0, "a vocabulary needs at least one token, got size {}", vocab_size);
  return vocab_size <= 65536 ? TokenWidth::uint16 : TokenWidth::uint32;
}

void write_token_shard(const std::filesystem::path& path, std::span<const int32_t> tokens, TokenWidth width) {
  OCTET_REQUIRE(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                "token shard {}: {} tokens do not fit the header's int32 token count", path.string(),
                tokens.size());
  std::array<int32_t, kShardHeaderInts> header{};
  bool narrow = width == TokenWidth::uint16;
  header[0] = narrow ? kShardMagicUint16 : kShardMagicUint32;
  header[1] = narrow ? kShardVersionUint16 : kShardVersionUint32;
  header[2] = static_cast<int32_t>(tokens.size());

  // The temporary file lives in the target directory because rename is only atomic within one file system.
  std::filesystem::path directory =
      path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  std::string temp_name = (directory / fmt::format(".{}.tmp.XXXXXX", path.filename().string())).string();
  FileDescriptor fd(::mkstemp(temp_name.data()));
  OCTET_REQUIRE(fd.get() >= 0, "token shard {}: cannot create a temporary file in {}: {}", path.string(),
                directory.string(), errno_text());
  std::filesystem::path temp_path(temp_name);
  try {
    write_all(fd.get(), header.data(), sizeof(header), temp_path);
    if (narrow) {
      write_tokens<uint16_t>(fd.get(), tokens, path, temp_path);
    } else {
      write_tokens<uint32_t>(fd.get(), tokens, path, temp_path);
    }
    // mkstemp creates the file 0600; a shard is ordinary data that others may read.
    OCTET_REQUIRE(::fchmod(fd.get(), 0644) == 0, "token shard {}: cannot set permissions: {}", path.string(),
                  errno_text());
    OCTET_REQUIRE(::fsync(fd.get()) == 0, "token shard {}: cannot flush to disk: {}", path.string(),
                  errno_text());
    OCTET_REQUIRE(fd.close(), "token shard {}: cannot close: {}", path.string(), errno_text());
    OCTET_REQUIRE(::rename(temp_name.c_str(), path.c_str()) == 0,
                  "token shard {}: cannot rename {} into place: {}", path.string(), temp_name, errno_text());
  } catch (...) {
    ::unlink(temp_name.c_str());
    throw;
  }
  // Flush the directory entry too, so that the rename survives a crash; failure here loses no data.
  FileDescriptor directory_fd(::open(directory.c_str(), O_RDONLY | O_DIRECTORY));
  if (directory_fd.get() >= 0) ::fsync(directory_fd.get());
}

uint32_t TokenView::operator[](int64_t index) const {
  OCTET_CHECK(index >= 0 && index < size_, "token index {} outside [0, {})", index, size_);
  return width_ == TokenWidth::uint16 ? as_uint16()[index] : as_uint32()[index];
}

std::span<const uint16_t> TokenView::as_uint16() const {
  OCTET_CHECK(width_ == TokenWidth::uint16, "asked for uint16 tokens of a uint32 shard");
  // The tokens start 1024 bytes into a page-aligned mapping, so the pointer is aligned for the token type.
  return {reinterpret_cast<const uint16_t*>(data_), static_cast<size_t>(size_)};
}

std::span<const uint32_t> TokenView::as_uint32() const {
  OCTET_CHECK(width_ == TokenWidth::uint32, "asked for uint32 tokens of a uint16 shard");
  return {reinterpret_cast<const uint32_t*>(data_), static_cast<size_t>(size_)};
}

TokenShard TokenShard::open(const std::filesystem::path& path) {
  const std::string name = path.string();
  // Opened without blocking and checked to be a regular file: a FIFO named like a shard must not hang.
  int64_t file_bytes = 0;
  FileDescriptor fd(open_regular_file(path, "token shard", file_bytes));
  OCTET_REQUIRE(
      file_bytes >= kShardHeaderBytes,
      "token shard {}: file is {} bytes, shorter than the {}-byte header: not a token shard or cut short",
      name, file_bytes, kShardHeaderBytes);

  const size_t mapped_bytes = static_cast<size_t>(file_bytes);
  void* mapping = ::mmap(nullptr, mapped_bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
  OCTET_REQUIRE(mapping != MAP_FAILED, "token shard {}: cannot map into memory: {}", name, errno_text());
  // From here the mapping is owned by `shard`, which unmaps it if validation below throws.
  TokenShard shard(path, mapping, mapped_bytes, TokenView());

  std::array<int32_t, 3> header{};
  std::memcpy(header.data(), mapping, sizeof(header));
  const int32_t magic = header[0], version = header[1], count = header[2];
  OCTET_REQUIRE(
      magic == kShardMagicUint16 || magic == kShardMagicUint32,
      "token shard {}: bad magic number {} (expected {} for uint16 tokens or {} for uint32 tokens): "
      "not an llm.c token shard",
      name, magic, kShardMagicUint16, kShardMagicUint32);
  const bool narrow = magic == kShardMagicUint16;
  const int32_t expected_version = narrow ? kShardVersionUint16 : kShardVersionUint32;
  OCTET_REQUIRE(version == expected_version,
                "token shard {}: unknown version {} for magic {} (expected version {})", name, version, magic,
                expected_version);
  OCTET_REQUIRE(count >= 0, "token shard {}: negative token count {} in the header", name, count);

  const TokenWidth width = narrow ? TokenWidth::uint16 : TokenWidth::uint32;
  const int64_t token_bytes_expected = int64_t{count} * token_bytes(width);
  const int64_t token_bytes_held = file_bytes - kShardHeaderBytes;
  OCTET_REQUIRE(
      token_bytes_held >= token_bytes_expected,
      "token shard {}: truncated: the header says {} tokens ({} bytes) but the file holds only {} bytes "
      "of tokens",
      name, count, token_bytes_expected, token_bytes_held);
  OCTET_REQUIRE(token_bytes_held == token_bytes_expected,
                "token shard {}: {} unexpected byte(s) after the {} tokens the header declares", name,
                token_bytes_held - token_bytes_expected, count);

  shard.tokens_ = TokenView(static_cast<const std::byte*>(mapping) + kShardHeaderBytes, count, width);
  return shard;
}

TokenShard::TokenShard(std::filesystem::path path, void* mapping, size_t mapped_bytes, TokenView tokens)
    : path_(std::move(path)), mapping_(mapping), mapped_bytes_(mapped_bytes), tokens_(tokens) {}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, TokenView())) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, TokenView());
  }
  return *this;
}

TokenShard::~TokenShard() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
}

void TokenShard::validate_tokens(int64_t vocab_size) const {
  auto check = [&](auto tokens) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      OCTET_REQUIRE(static_cast<int64_t>(tokens[i]) < vocab_size,
                    "token shard {}: token {} at index {} is outside the vocabulary of size {}",
                    path_.string(), tokens[i], i, vocab_size);
    }
  };
  if (width() == TokenWidth::uint16) {
    check(tokens_.as_uint16());
  } else {
    check(tokens_.as_uint32());
  }
}

}  // namespace octet::io
