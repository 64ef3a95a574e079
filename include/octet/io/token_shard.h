// Token shards in llm.c's file format, so that data prepared by octet trains llm.c and the other way round:
// a 1024-byte header of 256 little-endian int32 ([0] magic, [1] version, [2] token count, the rest zero)
// followed by the tokens. Magic 20240520 / version 1 holds uint16 tokens (GPT-2's layout); magic 20240801 /
// version 7 holds uint32 tokens (the layout llm.c writes for vocabularies above 65536, e.g. Llama 3).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>

namespace octet::io {

inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;
inline constexpr int32_t kShardMagicUint16 = 20240520;
inline constexpr int32_t kShardVersionUint16 = 1;
inline constexpr int32_t kShardMagicUint32 = 20240801;
inline constexpr int32_t kShardVersionUint32 = 7;

// How many bytes one token takes on disk.
enum class TokenWidth { uint16 = 2, uint32 = 4 };

inline int64_t token_bytes(TokenWidth width) {
  return static_cast<int64_t>(width);
}
// The narrowest width that holds every token of a vocabulary of `vocab_size` tokens (ids 0..vocab_size-1).
TokenWidth token_width_for_vocab(int64_t vocab_size);

// Writes `tokens` as a shard at `path`, atomically: the bytes go to a temporary file in the same directory,
// which is flushed to disk and then renamed over `path`, so a reader never sees a partial shard. Throws
// invalid_input when a token does not fit `width` or the file cannot be written.
void write_token_shard(const std::filesystem::path& path, std::span<const int32_t> tokens, TokenWidth width);

// A read-only view of a shard's tokens whatever their width on disk.
class TokenView {
 public:
  TokenView() = default;
  TokenView(const std::byte* data, int64_t size, TokenWidth width)
      : data_(data), size_(size), width_(width) {}

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  TokenWidth width() const { return width_; }
  // The raw token value (a uint32 token is returned as read, without a vocabulary check).
  uint32_t operator[](int64_t index) const;
  // The tokens when they are stored with that width; an internal error for the other width.
  std::span<const uint16_t> as_uint16() const;
  std::span<const uint32_t> as_uint32() const;

 private:
  const std::byte* data_ = nullptr;
  int64_t size_ = 0;
  TokenWidth width_ = TokenWidth::uint16;
};

// A shard mapped into memory (read-only). Opening validates the header and the file size; the tokens are
// paged in from disk as they are read. Move-only: it owns the mapping.
class TokenShard {
 public:
  // Throws invalid_input, naming the file, when it is not a regular file (it is opened without blocking, so
  // a FIFO is refused rather than waited on), is shorter than the header, has a bad magic number or an
  // unknown version, or its size does not match the token count in its header.
  static TokenShard open(const std::filesystem::path& path);

  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  ~TokenShard();

  const std::filesystem::path& path() const { return path_; }
  TokenWidth width() const { return tokens_.width(); }
  int64_t size() const { return tokens_.size(); }
  TokenView tokens() const { return tokens_; }

  // Throws invalid_input naming the file, the first token outside [0, vocab_size), its index and the
  // vocabulary size. Reads the whole shard.
  void validate_tokens(int64_t vocab_size) const;

 private:
  TokenShard(std::filesystem::path path, void* mapping, size_t mapped_bytes, TokenView tokens);

  std::filesystem::path path_;
  void* mapping_ = nullptr;
  size_t mapped_bytes_ = 0;
  TokenView tokens_;
};

}  // namespace octet::io
