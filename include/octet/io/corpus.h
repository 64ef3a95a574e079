// Turning text files into train and validation token shards: documents, the end-of-text separator, the
// deterministic validation split and the shard naming that the data loader finds again.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "octet/io/tokenizer.h"

namespace octet::io {

enum class DataSplit { train, validation };

// The file-name prefix of a split's shards: "train" or "val".
std::string_view split_prefix(DataSplit split);
// out_dir/train_000000.bin, out_dir/val_000003.bin, ...
std::filesystem::path shard_path(const std::filesystem::path& directory, DataSplit split, int64_t index);
// The shards of `split` in `directory` (files named <prefix>_<six digits>.bin), sorted by name. Throws
// invalid_input when there are none, or when `directory` does not exist or is a file.
std::vector<std::filesystem::path> find_shards(const std::filesystem::path& directory, DataSplit split);
// The regular files in `directory` whose names end in `extension` (e.g. ".txt"), sorted by name.
std::vector<std::filesystem::path> list_files(const std::filesystem::path& directory,
                                              std::string_view extension);

// What one document is.
enum class DocumentBoundary {
  file,        // each input file is one document
  blank_line,  // each paragraph (text between blank lines) is one document
};

struct PrepareOptions {
  DocumentBoundary document_boundary = DocumentBoundary::file;
  // Every validation_every-th document (the validation_every-th, 2*validation_every-th, ... in input order)
  // goes to the validation split; 20 means 5%. 0 writes no validation split.
  int64_t validation_every = 20;
  // A split's tokens go to shards of at most this many tokens, numbered from 000000.
  int64_t max_tokens_per_shard = 100'000'000;
};

struct PrepareSummary {
  int64_t train_documents = 0;
  int64_t validation_documents = 0;
  int64_t train_tokens = 0;
  int64_t validation_tokens = 0;
  std::vector<std::filesystem::path> train_shards;
  std::vector<std::filesystem::path> validation_shards;
};

// Tokenizes `files` (read as bytes, in the order given) into out_dir/train_NNNNNN.bin and
// out_dir/val_NNNNNN.bin. Each document's tokens are preceded by the tokenizer's end-of-text token, as in
// llm.c. Shards left in out_dir by an earlier run with more shards are removed, so that find_shards sees
// exactly this run's output. Throws invalid_input when a file cannot be read, a document contains the
// end-of-text token, or a split would be empty or the files hold no text (those two before any shard is
// written).
PrepareSummary prepare_text_shards(std::span<const std::filesystem::path> files, const Tokenizer& tokenizer,
                                   const std::filesystem::path& out_dir, const PrepareOptions& options);

}  // namespace octet::io
