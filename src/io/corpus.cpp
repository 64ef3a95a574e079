// Text files to train and validation shards: reading and splitting documents, the validation rule, and
// writing numbered shards of bounded size.
#include "octet/io/corpus.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include "octet/check.h"
#include "octet/io/token_shard.h"

namespace octet::io {
namespace {

std::string read_file(const std::filesystem::path& path) {
  std::error_code error;
  OCTET_REQUIRE(std::filesystem::is_regular_file(path, error),
                "text file {}: not found or not a regular file", path.string());
  std::ifstream in(path, std::ios::binary);
  OCTET_REQUIRE(in.good(), "text file {}: cannot open for reading", path.string());
  std::string content;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  OCTET_REQUIRE(size >= 0, "text file {}: cannot read (is it a regular file?)", path.string());
  content.resize(static_cast<size_t>(size));
  in.seekg(0, std::ios::beg);
  in.read(content.data(), size);
  OCTET_REQUIRE(in.good() || (in.eof() && in.gcount() == size), "text file {}: read failed", path.string());
  return content;
}

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// The documents of one file's text: the whole text, or each run of non-blank lines (without the newline
// that ends its last line).
std::vector<std::string_view> split_documents(std::string_view text, DocumentBoundary boundary) {
  if (boundary == DocumentBoundary::file) return {text};
  std::vector<std::string_view> documents;
  size_t paragraph_begin = std::string_view::npos, paragraph_end = 0;
  for (size_t line_begin = 0; line_begin < text.size();) {
    size_t newline = text.find('\n', line_begin);
    size_t line_end = newline == std::string_view::npos ? text.size() : newline;
    if (is_blank(text.substr(line_begin, line_end - line_begin))) {
      if (paragraph_begin != std::string_view::npos) {
        documents.push_back(text.substr(paragraph_begin, paragraph_end - paragraph_begin));
        paragraph_begin = std::string_view::npos;
      }
    } else {
      if (paragraph_begin == std::string_view::npos) paragraph_begin = line_begin;
      paragraph_end = line_end;
    }
    line_begin = line_end + 1;
  }
  if (paragraph_begin != std::string_view::npos) {
    documents.push_back(text.substr(paragraph_begin, paragraph_end - paragraph_begin));
  }
  return documents;
}

// The index of a shard named <prefix>_<six digits>.bin, or -1 for any other name.
int64_t shard_index_of(const std::string& filename, std::string_view prefix) {
  const size_t digits = 6;
  if (filename.size() != prefix.size() + 1 + digits + 4) return -1;
  if (filename.compare(0, prefix.size(), prefix) != 0 || filename[prefix.size()] != '_') return -1;
  if (filename.compare(filename.size() - 4, 4, ".bin") != 0) return -1;
  const char* first = filename.data() + prefix.size() + 1;
  int64_t index = -1;
  auto [end, error] = std::from_chars(first, first + digits, index);
  if (error != std::errc() || end != first + digits || *first == '-' || *first == '+') return -1;
  return index;
}

// Appends documents to one split and writes a numbered shard each time max_tokens_per_shard is reached, so
// that memory stays bounded by one shard whatever the size of the corpus.
class SplitWriter {
 public:
  SplitWriter(std::filesystem::path directory, DataSplit split, TokenWidth width, int64_t max_tokens)
      : directory_(std::move(directory)), split_(split), width_(width), max_tokens_(max_tokens) {}

  void append(std::span<const int32_t> tokens) {
    while (!tokens.empty()) {
      size_t room = static_cast<size_t>(max_tokens_) - buffer_.size();
      size_t take = std::min(room, tokens.size());
      buffer_.insert(buffer_.end(), tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(take));
      tokens = tokens.subspan(take);
      if (buffer_.size() == static_cast<size_t>(max_tokens_)) flush();
    }
  }

  void finish() {
    if (!buffer_.empty()) flush();
  }

  int64_t tokens() const { return tokens_; }
  const std::vector<std::filesystem::path>& shards() const { return shards_; }

 private:
  void flush() {
    std::filesystem::path path = shard_path(directory_, split_, static_cast<int64_t>(shards_.size()));
    write_token_shard(path, buffer_, width_);
    tokens_ += static_cast<int64_t>(buffer_.size());
    shards_.push_back(std::move(path));
    buffer_.clear();
  }

  std::filesystem::path directory_;
  DataSplit split_;
  TokenWidth width_;
  int64_t max_tokens_;
  std::vector<int32_t> buffer_;
  int64_t tokens_ = 0;
  std::vector<std::filesystem::path> shards_;
};

// Removes shards of `split` numbered `first_stale` or above, left by an earlier run that wrote more.
void remove_stale_shards(const std::filesystem::path& directory, DataSplit split, int64_t first_stale) {
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (shard_index_of(entry.path().filename().string(), split_prefix(split)) >= first_stale) {
      std::filesystem::remove(entry.path());
    }
  }
}

}  // namespace

std::string_view split_prefix(DataSplit split) {
  return split == DataSplit::train ? "train" : "val";
}

std::filesystem::path shard_path(const std::filesystem::path& directory, DataSplit split, int64_t index) {
  OCTET_CHECK(index >= 0 && index <= 999'999, "shard index {} outside the six-digit range", index);
  return directory / fmt::format("{}_{:06d}.bin", split_prefix(split), index);
}

std::vector<std::filesystem::path> find_shards(const std::filesystem::path& directory, DataSplit split) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(directory, error);
  OCTET_REQUIRE(!std::filesystem::is_regular_file(status),
                "data directory {} is a file, not a directory of token shards (point data.dir at the --out "
                "directory of `octet data prepare`)",
                directory.string());
  OCTET_REQUIRE(std::filesystem::is_directory(status), "data directory {} does not exist", directory.string());
  std::vector<std::filesystem::path> shards;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (shard_index_of(entry.path().filename().string(), split_prefix(split)) >= 0)
      shards.push_back(entry.path());
  }
  OCTET_REQUIRE(!shards.empty(), "data directory {} holds no {} shards ({}_NNNNNN.bin)", directory.string(),
                split_prefix(split), split_prefix(split));
  std::sort(shards.begin(), shards.end());
  return shards;
}

std::vector<std::filesystem::path> list_files(const std::filesystem::path& directory,
                                              std::string_view extension) {
  std::error_code error;
  OCTET_REQUIRE(std::filesystem::is_directory(directory, error), "directory {} does not exist",
                directory.string());
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (entry.is_regular_file() && entry.path().extension() == extension) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

PrepareSummary prepare_text_shards(std::span<const std::filesystem::path> files, const Tokenizer& tokenizer,
                                   const std::filesystem::path& out_dir, const PrepareOptions& options) {
  OCTET_REQUIRE(!files.empty(), "no text files to prepare");
  OCTET_REQUIRE(options.validation_every == 0 || options.validation_every >= 2,
                "validation_every must be 0 (no validation split) or at least 2, got {}",
                options.validation_every);
  OCTET_REQUIRE(
      options.max_tokens_per_shard > 0 && options.max_tokens_per_shard <= std::numeric_limits<int32_t>::max(),
      "max_tokens_per_shard must be in [1, 2^31-1], got {}", options.max_tokens_per_shard);

  // A first pass counts the documents, so that an empty split is reported before any shard is written.
  int64_t documents = 0, text_bytes = 0;
  for (const auto& file : files) {
    const std::string text = read_file(file);
    for (std::string_view document : split_documents(text, options.document_boundary)) {
      ++documents;
      text_bytes += static_cast<int64_t>(document.size());
    }
  }
  OCTET_REQUIRE(documents > 0, "the {} text file(s) hold no documents", files.size());
  // Shards of separators alone would train on nothing.
  OCTET_REQUIRE(text_bytes > 0, "the {} text file(s) hold no text: every one is empty", files.size());
  const bool has_validation = options.validation_every > 0;
  OCTET_REQUIRE(
      !has_validation || documents >= options.validation_every,
      "{} document(s) in {} file(s) leave the validation split empty: it takes every {}th document; use "
      "more documents, a smaller validation_every, or one document per paragraph",
      documents, files.size(), options.validation_every);

  std::error_code error;
  std::filesystem::create_directories(out_dir, error);
  OCTET_REQUIRE(!error, "cannot create the output directory {}: {}", out_dir.string(), error.message());

  const TokenWidth width = token_width_for_vocab(tokenizer.vocab_size());
  const int32_t end_of_text = tokenizer.end_of_text();
  SplitWriter train(out_dir, DataSplit::train, width, options.max_tokens_per_shard);
  SplitWriter validation(out_dir, DataSplit::validation, width, options.max_tokens_per_shard);
  PrepareSummary summary;
  int64_t document_index = 0;
  std::vector<int32_t> tokens;
  for (const auto& file : files) {
    const std::string text = read_file(file);
    for (std::string_view document : split_documents(text, options.document_boundary)) {
      tokens = tokenizer.encode(document);
      auto separator = std::find(tokens.begin(), tokens.end(), end_of_text);
      OCTET_REQUIRE(
          separator == tokens.end(),
          "text file {}: the document at byte offset {} contains the end-of-text token {} (tokenizer "
          "'{}') at token index {}; it is reserved as the document separator",
          file.string(), document.data() - text.data(), end_of_text, tokenizer.name(),
          separator - tokens.begin());
      tokens.insert(tokens.begin(), end_of_text);
      ++document_index;
      const bool to_validation = has_validation && document_index % options.validation_every == 0;
      (to_validation ? validation : train).append(tokens);
      ++(to_validation ? summary.validation_documents : summary.train_documents);
    }
  }
  train.finish();
  validation.finish();
  remove_stale_shards(out_dir, DataSplit::train, static_cast<int64_t>(train.shards().size()));
  remove_stale_shards(out_dir, DataSplit::validation, static_cast<int64_t>(validation.shards().size()));

  summary.train_tokens = train.tokens();
  summary.validation_tokens = validation.tokens();
  summary.train_shards = train.shards();
  summary.validation_shards = validation.shards();
  return summary;
}

}  // namespace octet::io
