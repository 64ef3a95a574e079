// Checkpoints of shards: the layout a run whose optimizer state is sharded over N ranks saves. Every rank
// writes its own shard of the AdamW moments (optimizer-RRRRR-of-NNNNN.bin), rank 0 the files of the whole
// model (model.safetensors, parameters.safetensors, state.json; the parameters are replicated on every rank
// under ZeRO-1, so one writer suffices) and, last, the manifest shards.json, which records the layout: the
// number of ranks, each shard's element range (dist::shard_range), every file's size and digest, the
// parameter buffer's size and the format's version. save_checkpoint and load_checkpoint (checkpoint.h) use
// it; see docs/checkpoints.md ("Checkpoints of shards").
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace octet {

inline constexpr const char* kShardManifestFile = "shards.json";
// The float32 master weights in octet's layout (a tensor per parameter), as optimizer.safetensors holds them
// in a whole checkpoint.
inline constexpr const char* kParametersFile = "parameters.safetensors";

// A file of a checkpoint: its name in the checkpoint's directory, its size and its digest
// (CheckpointDigest).
struct CheckpointFileRecord {
  std::string name;
  int64_t bytes = 0;
  uint64_t digest = 0;
};

// One rank's shard of one kind of state: elements [begin, end) of the parameter buffer, in `file`.
struct CheckpointShard {
  int rank = 0;
  int64_t begin = 0;
  int64_t end = 0;
  CheckpointFileRecord file;
};

// What shards.json holds. Shards come in kinds, each a field of the manifest's "shards" object: today
// "optimizer" (each rank's AdamW moments: m, then v, of its elements, float32 little-endian, 8 bytes an
// element). Sharded parameters (FSDP) will add a "parameters" kind in place of parameters.safetensors.
struct ShardManifest {
  int64_t step = 0;
  int ranks = 1;
  int64_t parameter_count = 0;
  std::string octet_version;
  std::vector<CheckpointFileRecord> files;  // the whole files rank 0 wrote, state.json among them
  std::vector<CheckpointShard> optimizer;   // one per rank, in rank order
};

// optimizer-00001-of-00004.bin: rank 1's shard of the moments of a run of 4 ranks.
std::string optimizer_shard_file_name(int rank, int ranks);

// The manifest as JSON text (ends with a newline).
std::string shard_manifest_text(const ShardManifest& manifest);

// Parses and checks a manifest; `file` names it in messages. Everything octet never writes is refused with
// one invalid_input error naming the file and the field: other format or version, a shard count other than
// the ranks, a shard whose range is not dist::shard_range's for its rank, a file name other than the one
// its rank writes or one that leaves the directory, a shard's size other than 8 bytes an element, a file
// listed twice, a required file (model.safetensors, parameters.safetensors, state.json) not listed, an
// unknown shard kind, malformed digests.
ShardManifest parse_shard_manifest(std::string_view text, const std::string& file);

// Reads DIR/shards.json (a regular file of bounded size) and parses it.
ShardManifest read_shard_manifest(const std::filesystem::path& checkpoint_dir);

// What is wrong with the files the manifest lists, found without reading them: the first that is not in
// `checkpoint_dir` as a regular file of the recorded size ("optimizer-00001-of-00002.bin is missing"), or
// empty when every one is.
std::string shard_files_problem(const std::filesystem::path& checkpoint_dir, const ShardManifest& manifest);

// A 64-bit checksum of a file's bytes, fast enough for gigabytes: h starts at 14695981039346656037; for each
// little-endian 64-bit word w of the bytes (the last one padded with zero bytes), h = (h xor w) times
// 1099511628211 modulo 2^64, then h = h xor (h >> 32); finally the byte count is folded in the same way. It
// detects damage, not tampering.
class CheckpointDigest {
 public:
  void update(const void* data, size_t bytes);
  uint64_t finish() const;

 private:
  uint64_t hash_ = 14695981039346656037ull;
  uint64_t total_ = 0;
  unsigned char pending_[8] = {};
  size_t pending_count_ = 0;
};

uint64_t checkpoint_digest(std::string_view bytes);
// The digest of a file's whole content, read in pieces; throws invalid_input naming the file when it cannot
// be read.
uint64_t checkpoint_file_digest(const std::filesystem::path& path);

// Elements [begin, end) of the moments in a checkpoint of shards, read from the shards that hold them (and
// only those): each shard file that overlaps the range is read once, its digest and size checked against the
// manifest, and its overlap copied out. Every moment read must be finite and every second moment at least 0.
// Throws invalid_input naming the file and the problem.
struct MomentRange {
  std::vector<float> m, v;  // end - begin elements each
};
MomentRange read_moment_range(const std::filesystem::path& checkpoint_dir, const ShardManifest& manifest,
                              int64_t begin, int64_t end);

}  // namespace octet
