// The manifest of a checkpoint of shards, its digests and the reading of moment ranges across shards (see
// checkpoint_shards.h).
#include "octet/train/checkpoint_shards.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../model/strict_json.h"
#include "octet/check.h"
#include "octet/dist/communicator.h"
#include "octet/io/input.h"

namespace octet {

namespace fs = std::filesystem;

namespace {

static_assert(std::endian::native == std::endian::little, "checkpoint shards are little-endian float32");

constexpr const char* kManifestFormat = "octet-checkpoint-shards";
constexpr int64_t kManifestVersion = 1;
constexpr const char* kDigestName = "octet-digest64";
// A manifest lists a few files and one shard per rank: a megabyte holds tens of thousands of ranks.
constexpr int64_t kMaxManifestBytes = int64_t{16} << 20;
constexpr int64_t kMaxManifestDepth = 6;
constexpr int64_t kMaxRanks = int64_t{1} << 20;
constexpr int64_t kMaxParameters = int64_t{1} << 48;
constexpr int64_t kMomentBytes = 2 * int64_t{sizeof(float)};  // m and v of one element

std::string digest_text(uint64_t digest) {
  return fmt::format("{:016x}", digest);
}

// A plain file name of the checkpoint's directory: no path, nothing hidden.
bool plain_file_name(const std::string& name) {
  if (name.empty() || name.size() > 255 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

CheckpointFileRecord read_record(const StrictJsonReader& reader, const StrictJsonReader::Json& j,
                                 const std::string& where, const char* name_key) {
  CheckpointFileRecord r;
  r.name = reader.text(j, where, name_key);
  if (!plain_file_name(r.name)) {
    reader.fail(fmt::format("{}.{} must be a plain file name of the checkpoint's directory, got \"{}\"",
                            where, name_key, io::printable(r.name)));
  }
  r.bytes = reader.integer(j, where, "bytes", 0, std::numeric_limits<int64_t>::max());
  const std::string digest = reader.text(j, where, "digest");
  const bool hex = digest.size() == 16 && std::all_of(digest.begin(), digest.end(), [](char c) {
                     return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                   });
  if (!hex) {
    reader.fail(fmt::format("{}.digest must be 16 lowercase hexadecimal digits, got \"{}\"", where,
                            io::printable(digest)));
  }
  r.digest = std::stoull(digest, nullptr, 16);
  return r;
}

void require_keys(const StrictJsonReader& reader, const StrictJsonReader::Json& j, const std::string& where,
                  std::initializer_list<const char*> keys) {
  for (const auto& [key, value] : j.items()) {
    if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return key == k; })) {
      reader.fail(fmt::format("{} has an unknown member \"{}\"", where, io::printable(key)));
    }
  }
}

}  // namespace

std::string optimizer_shard_file_name(int rank, int ranks) {
  return fmt::format("optimizer-{:05d}-of-{:05d}.bin", rank, ranks);
}

std::string shard_manifest_text(const ShardManifest& manifest) {
  using Json = nlohmann::ordered_json;
  Json files = Json::array();
  for (const CheckpointFileRecord& f : manifest.files) {
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"digest", digest_text(f.digest)}});
  }
  Json shards = Json::array();
  for (const CheckpointShard& s : manifest.optimizer) {
    shards.push_back({{"rank", s.rank},
                      {"begin", s.begin},
                      {"end", s.end},
                      {"file", s.file.name},
                      {"bytes", s.file.bytes},
                      {"digest", digest_text(s.file.digest)}});
  }
  Json j;
  j["format"] = kManifestFormat;
  j["format_version"] = kManifestVersion;
  j["octet_version"] = manifest.octet_version;
  j["step"] = manifest.step;
  j["ranks"] = manifest.ranks;
  j["parameter_count"] = manifest.parameter_count;
  j["digest"] = kDigestName;
  j["files"] = files;
  j["shards"] = {{"optimizer", {{"tensors", {"m", "v"}}, {"dtype", "F32"}, {"shards", shards}}}};
  return j.dump(2) + "\n";
}

ShardManifest parse_shard_manifest(std::string_view text, const std::string& file) {
  const StrictJsonReader reader("checkpoint manifest " + file);
  const StrictJsonReader::Json j = reader.parse(text, kMaxManifestDepth, "a checkpoint manifest");
  require_keys(reader, j, "the manifest",
               {"format", "format_version", "octet_version", "step", "ranks", "parameter_count", "digest",
                "files", "shards"});
  if (reader.text(j, "the manifest", "format") != kManifestFormat) {
    reader.fail(fmt::format("is not an octet checkpoint manifest (no \"format\": \"{}\")", kManifestFormat));
  }
  const int64_t version = reader.integer(j, "the manifest", "format_version", 0, kMaxRanks);
  if (version != kManifestVersion) {
    reader.fail(fmt::format("has format_version {}; this octet reads {}", version, kManifestVersion));
  }
  ShardManifest m;
  m.octet_version = reader.text(j, "the manifest", "octet_version");
  m.step = reader.integer(j, "the manifest", "step", 0, std::numeric_limits<int64_t>::max());
  m.ranks = static_cast<int>(reader.integer(j, "the manifest", "ranks", 1, kMaxRanks));
  m.parameter_count = reader.integer(j, "the manifest", "parameter_count", 1, kMaxParameters);
  if (reader.text(j, "the manifest", "digest") != kDigestName) {
    reader.fail(fmt::format("digest must be \"{}\"", kDigestName));
  }

  std::set<std::string> names;
  const StrictJsonReader::Json& files = reader.member(j, "the manifest", "files");
  if (!files.is_array()) reader.fail(fmt::format("files must be an array, got {}", files.type_name()));
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string where = fmt::format("files[{}]", i);
    require_keys(reader, files[i], where, {"name", "bytes", "digest"});
    CheckpointFileRecord r = read_record(reader, files[i], where, "name");
    if (r.name == kShardManifestFile || !names.insert(r.name).second) {
      reader.fail(fmt::format("{}.name \"{}\" is listed twice or names the manifest", where, r.name));
    }
    m.files.push_back(std::move(r));
  }
  for (const char* required : {"model.safetensors", kParametersFile, "state.json"}) {
    if (names.count(required) == 0) reader.fail(fmt::format("files does not list {}", required));
  }

  const StrictJsonReader::Json& kinds = reader.member(j, "the manifest", "shards");
  if (!kinds.is_object()) reader.fail(fmt::format("shards must be an object, got {}", kinds.type_name()));
  for (const auto& [kind, value] : kinds.items()) {
    if (kind != "optimizer") {
      reader.fail(
          fmt::format("shards has the kind \"{}\", which this octet does not read (it reads "
                      "\"optimizer\")",
                      io::printable(kind)));
    }
  }
  const StrictJsonReader::Json& optimizer = reader.member(kinds, "shards", "optimizer");
  require_keys(reader, optimizer, "shards.optimizer", {"tensors", "dtype", "shards"});
  if (reader.member(optimizer, "shards.optimizer", "tensors") != StrictJsonReader::Json::array({"m", "v"})) {
    reader.fail("shards.optimizer.tensors must be [\"m\", \"v\"]");
  }
  if (reader.text(optimizer, "shards.optimizer", "dtype") != "F32") {
    reader.fail("shards.optimizer.dtype must be \"F32\"");
  }
  const StrictJsonReader::Json& list = reader.member(optimizer, "shards.optimizer", "shards");
  if (!list.is_array() || list.size() != static_cast<size_t>(m.ranks)) {
    reader.fail(fmt::format("shards.optimizer.shards must list one shard for each of the {} ranks, got {}",
                            m.ranks, list.is_array() ? std::to_string(list.size()) : list.type_name()));
  }
  for (int r = 0; r < m.ranks; ++r) {
    const std::string where = fmt::format("shards.optimizer.shards[{}]", r);
    const StrictJsonReader::Json& s = list[static_cast<size_t>(r)];
    require_keys(reader, s, where, {"rank", "begin", "end", "file", "bytes", "digest"});
    CheckpointShard shard;
    shard.rank = static_cast<int>(reader.integer(s, where, "rank", 0, kMaxRanks));
    shard.begin = reader.integer(s, where, "begin", 0, kMaxParameters);
    shard.end = reader.integer(s, where, "end", 0, kMaxParameters);
    shard.file = read_record(reader, s, where, "file");
    const dist::ShardRange expected = dist::shard_range(m.parameter_count, r, m.ranks);
    if (shard.rank != r) reader.fail(fmt::format("{}.rank must be {}, got {}", where, r, shard.rank));
    if (shard.begin != expected.begin || shard.end != expected.end) {
      reader.fail(fmt::format("{} holds elements [{}, {}); rank {} of {} owns [{}, {}) of {}", where,
                              shard.begin, shard.end, r, m.ranks, expected.begin, expected.end,
                              m.parameter_count));
    }
    if (shard.file.name != optimizer_shard_file_name(r, m.ranks)) {
      reader.fail(fmt::format("{}.file must be {}, got \"{}\"", where, optimizer_shard_file_name(r, m.ranks),
                              shard.file.name));
    }
    if (shard.file.bytes != (shard.end - shard.begin) * kMomentBytes) {
      reader.fail(fmt::format("{}.bytes must be {} (8 bytes for each of its {} elements), got {}", where,
                              (shard.end - shard.begin) * kMomentBytes, shard.end - shard.begin,
                              shard.file.bytes));
    }
    if (!names.insert(shard.file.name).second) {
      reader.fail(fmt::format("{}.file \"{}\" is listed twice", where, shard.file.name));
    }
    m.optimizer.push_back(std::move(shard));
  }
  return m;
}

ShardManifest read_shard_manifest(const fs::path& checkpoint_dir) {
  const fs::path path = checkpoint_dir / kShardManifestFile;
  return parse_shard_manifest(io::read_regular_file(path, "checkpoint manifest", kMaxManifestBytes),
                              path.string());
}

std::string shard_files_problem(const fs::path& dir, const ShardManifest& manifest) {
  auto problem = [&](const CheckpointFileRecord& f) -> std::string {
    std::error_code ec;
    if (!fs::is_regular_file(dir / f.name, ec)) return f.name + " is missing";
    const auto size = static_cast<int64_t>(fs::file_size(dir / f.name, ec));
    if (ec) return fmt::format("{} cannot be read: {}", f.name, ec.message());
    if (size != f.bytes) {
      return fmt::format("{} has {} bytes, {} records {}", f.name, size, kShardManifestFile, f.bytes);
    }
    return {};
  };
  for (const CheckpointFileRecord& f : manifest.files) {
    if (std::string p = problem(f); !p.empty()) return p;
  }
  for (const CheckpointShard& s : manifest.optimizer) {
    if (std::string p = problem(s.file); !p.empty()) return p;
  }
  return {};
}

void CheckpointDigest::update(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += bytes;
  auto mix = [this](uint64_t word) {
    hash_ = (hash_ ^ word) * 1099511628211ull;
    hash_ ^= hash_ >> 32;
  };
  while (pending_count_ > 0 && pending_count_ < 8 && bytes > 0) {
    pending_[pending_count_++] = *p++;
    --bytes;
  }
  if (pending_count_ == 8) {
    uint64_t word;
    std::memcpy(&word, pending_, 8);
    mix(word);
    pending_count_ = 0;
  }
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    mix(word);
  }
  for (; bytes > 0; --bytes) pending_[pending_count_++] = *p++;
}

uint64_t CheckpointDigest::finish() const {
  uint64_t hash = hash_;
  auto mix = [&hash](uint64_t word) {
    hash = (hash ^ word) * 1099511628211ull;
    hash ^= hash >> 32;
  };
  if (pending_count_ > 0) {
    unsigned char tail[8] = {};
    std::memcpy(tail, pending_, pending_count_);
    uint64_t word;
    std::memcpy(&word, tail, 8);
    mix(word);
  }
  mix(total_);
  return hash;
}

uint64_t checkpoint_digest(std::string_view bytes) {
  CheckpointDigest d;
  d.update(bytes.data(), bytes.size());
  return d.finish();
}

namespace {

// Reads `path` (of `expected_bytes` bytes) from start to end in pieces, handing each piece and its offset to
// `piece`; returns the digest of the whole.
template <typename Piece>
uint64_t stream_file(const fs::path& path, const char* what, int64_t expected_bytes, Piece&& piece) {
  int64_t size = 0;
  const int fd = io::open_regular_file(path, what, size);
  std::vector<char> buffer(size_t{8} << 20);
  CheckpointDigest digest;
  int64_t offset = 0;
  bool ok = expected_bytes < 0 || size == expected_bytes;
  int error = 0;
  while (ok && offset < size) {
    const size_t want =
        static_cast<size_t>(std::min<int64_t>(size - offset, static_cast<int64_t>(buffer.size())));
    const ssize_t n = ::pread(fd, buffer.data(), want, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : 0;
      ok = false;
      break;
    }
    digest.update(buffer.data(), static_cast<size_t>(n));
    piece(buffer.data(), offset, static_cast<int64_t>(n));
    offset += n;
  }
  ::close(fd);
  OCTET_REQUIRE(expected_bytes < 0 || size == expected_bytes, "{}: {} bytes, the manifest {} records {}",
                path.string(), size, kShardManifestFile, expected_bytes);
  OCTET_REQUIRE(ok, "cannot read {}: {}", path.string(),
                error != 0 ? std::strerror(error) : "it got shorter");
  return digest.finish();
}

}  // namespace

uint64_t checkpoint_file_digest(const fs::path& path) {
  return stream_file(path, "checkpoint file", -1, [](const char*, int64_t, int64_t) {});
}

MomentRange read_moment_range(const fs::path& dir, const ShardManifest& manifest, int64_t begin,
                              int64_t end) {
  OCTET_CHECK(0 <= begin && begin <= end && end <= manifest.parameter_count,
              "a range within the {} elements of the checkpoint, got [{}, {})", manifest.parameter_count,
              begin, end);
  MomentRange out;
  out.m.resize(static_cast<size_t>(end - begin));
  out.v.resize(static_cast<size_t>(end - begin));
  for (const CheckpointShard& s : manifest.optimizer) {
    const int64_t low = std::max(begin, s.begin), high = std::min(end, s.end);
    if (low >= high) continue;
    const fs::path path = dir / s.file.name;
    const int64_t n = s.end - s.begin;
    // The file holds m of the shard's n elements, then v: the bytes of each that this range needs, and where
    // they go.
    struct Wanted {
      int64_t from, to;
      char* into;
    };
    const int64_t f = static_cast<int64_t>(sizeof(float));
    const Wanted wanted[2] = {
        {(low - s.begin) * f, (high - s.begin) * f, reinterpret_cast<char*>(out.m.data() + (low - begin))},
        {(n + low - s.begin) * f, (n + high - s.begin) * f,
         reinterpret_cast<char*>(out.v.data() + (low - begin))}};
    const uint64_t digest =
        stream_file(path, "checkpoint shard", s.file.bytes, [&](const char* data, int64_t at, int64_t count) {
          for (const Wanted& w : wanted) {
            const int64_t a = std::max(w.from, at), b = std::min(w.to, at + count);
            if (a < b) std::memcpy(w.into + (a - w.from), data + (a - at), static_cast<size_t>(b - a));
          }
        });
    OCTET_REQUIRE(digest == s.file.digest,
                  "{}: its digest is {}, the manifest {} records {}: the file is damaged", path.string(),
                  digest_text(digest), kShardManifestFile, digest_text(s.file.digest));
    for (int64_t i = low; i < high; ++i) {
      const float mi = out.m[static_cast<size_t>(i - begin)], vi = out.v[static_cast<size_t>(i - begin)];
      OCTET_REQUIRE(std::isfinite(mi) && std::isfinite(vi) && vi >= 0.0f,
                    "{}: element {} holds m = {}, v = {}; AdamW moments must be finite and second moments at "
                    "least 0",
                    path.string(), i, mi, vi);
    }
  }
  return out;
}

}  // namespace octet
