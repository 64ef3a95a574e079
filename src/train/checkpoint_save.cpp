// Saving checkpoints (see checkpoint.h and docs/checkpoints.md): a whole checkpoint written by one rank, or
// a checkpoint of shards (checkpoint_shards.h) written by every rank of a sharded optimizer, each staged in a
// temporary directory and renamed into place.
#include "octet/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint_internal.h"
#include "octet/check.h"
#include "octet/dist/communicator.h"
#include "octet/io/atomic_file.h"
#include "octet/io/safetensors.h"
#include "octet/io/tokenizer.h"
#include "octet/train/checkpoint_shards.h"
#include "octet/version.h"

namespace octet {

namespace fs = std::filesystem;
using checkpoint_detail::kModelFile;
using checkpoint_detail::kOptimizerFile;
using checkpoint_detail::kStateFile;
using checkpoint_detail::model_json;
using checkpoint_detail::state_text;
using checkpoint_detail::to_host;
using checkpoint_detail::whole_moment;

namespace {

// ---- files ------------------------------------------------------------------------------------------------

void write_file_durably(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  OCTET_REQUIRE(fd >= 0, "cannot create {}: {}", path.string(), std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      OCTET_REQUIRE(false, "cannot write {}: {}", path.string(), std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  OCTET_REQUIRE(synced, "cannot flush {} to disk: {}", path.string(), std::strerror(errno));
}

// ---- staging and committing -------------------------------------------------------------------------------

fs::path staging_directory(const fs::path& final_dir) {
  return final_dir.parent_path() / (".tmp_" + final_dir.filename().string());
}

// The empty staging directory of a save of `final_dir`, made after removing the leftovers of interrupted
// saves (never complete checkpoints, so safe to remove).
fs::path prepare_staging(const fs::path& final_dir) {
  const fs::path root = final_dir.parent_path();
  std::error_code ec;
  fs::create_directories(root, ec);
  OCTET_REQUIRE(!ec, "cannot create {}: {}", root.string(), ec.message());
  for (const fs::directory_entry& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp_step_", 0) == 0 || name.rfind(".old_step_", 0) == 0) fs::remove_all(e.path());
  }
  const fs::path temporary = staging_directory(final_dir);
  fs::create_directory(temporary, ec);
  OCTET_REQUIRE(!ec, "cannot create {}: {}", temporary.string(), ec.message());
  return temporary;
}

// The files of the whole model, written into `temporary` by one rank: model.safetensors; the master weights,
// with the moments in optimizer.safetensors when `m` and `v` are given (a whole checkpoint), alone in
// parameters.safetensors otherwise (a checkpoint of shards); the tokenizer files; state.json. Returns the
// names of the files written.
std::vector<std::string> write_whole_files(const fs::path& temporary, Model& model, Trainer& trainer,
                                           const TrainingProgress& progress, const CheckpointOptions& options,
                                           const std::vector<float>& params, const std::vector<float>* m,
                                           const std::vector<float>* v) {
  std::vector<std::string> names;
  auto written = [&](const fs::path& file) {
    names.push_back(file.filename().string());
    if (options.after_file_written) options.after_file_written(file);
  };
  OCTET_CHECK(params.size() == static_cast<size_t>(model.parameter_count()), "the {} master weights, got {}",
              model.parameter_count(), params.size());
  std::vector<std::vector<float>> hf_data;
  std::vector<io::SafetensorsEntry> hf;
  for (const ParameterInfo& p : model.parameters()) hf_data.push_back(model.to_hf(p, params));
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    const ParameterInfo& p = model.parameters()[i];
    hf.push_back({model.hf_name(p), model.hf_shape(p), hf_data[i]});
  }
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"octet_version", kVersion}, {"config", model_json(model).dump()}};
  io::write_safetensors(temporary / kModelFile, hf, metadata);
  written(temporary / kModelFile);

  std::vector<std::pair<std::string, const std::vector<float>*>> sets = {{"", &params}};
  if (m != nullptr && v != nullptr) sets.insert(sets.end(), {{"m.", m}, {"v.", v}});
  std::vector<io::SafetensorsEntry> exact;
  for (const auto& [prefix, source] : sets) {
    for (const ParameterInfo& p : model.parameters()) {
      exact.push_back({prefix + p.name, p.shape,
                       std::span<const float>(source->data() + p.offset, static_cast<size_t>(p.count))});
    }
  }
  const fs::path exact_path = temporary / (sets.size() > 1 ? kOptimizerFile : kParametersFile);
  io::write_safetensors(exact_path, exact, {{"octet_version", kVersion}});
  written(exact_path);

  if (!progress.tokenizer_dir.empty()) {
    for (const io::TokenizerKind kind : {io::TokenizerKind::gpt2, io::TokenizerKind::llama3}) {
      if (!io::has_vocabulary(kind, progress.tokenizer_dir)) continue;
      io::copy_vocabulary(kind, progress.tokenizer_dir, temporary);
      for (const char* name : io::tokenizer_files(kind)) names.push_back(name);
    }
  }
  write_file_durably(temporary / kStateFile, state_text(model, trainer, progress));
  written(temporary / kStateFile);
  return names;
}

// Puts the staging directory in place of `final_dir` (the rename is the commit; a checkpoint of the same
// step, saved again after a resume, is replaced), then keeps only the newest keep_last complete checkpoints.
void commit_checkpoint(const fs::path& run_dir, const fs::path& temporary, const fs::path& final_dir,
                       int keep_last) {
  io::fsync_directory(temporary);
  const fs::path root = final_dir.parent_path();
  std::error_code ec;
  if (fs::exists(final_dir)) {
    const fs::path old = root / (".old_" + final_dir.filename().string());
    fs::rename(final_dir, old, ec);
    OCTET_REQUIRE(!ec, "cannot move the previous {} aside: {}", final_dir.string(), ec.message());
    fs::rename(temporary, final_dir, ec);
    OCTET_REQUIRE(!ec, "cannot move {} into place: {}", final_dir.string(), ec.message());
    fs::remove_all(old);
  } else {
    fs::rename(temporary, final_dir, ec);
    OCTET_REQUIRE(!ec, "cannot move {} into place: {}", final_dir.string(), ec.message());
  }
  io::fsync_directory(root);

  const std::vector<fs::path> complete = list_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < complete.size(); ++i) fs::remove_all(complete[i]);
}

// What one rank tells the others about its part of a save of shards: the shard it wrote, or why it could not.
// A fixed-size record, gathered from every rank with all_gather.
struct ShardReport {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t bytes = 0;
  uint64_t digest = 0;
  char failure[1024] = {};  // empty when the rank's part succeeded
};

// Every rank's report. When any rank failed, every rank throws the same error, naming the first that did, so
// that the ranks leave the save together.
std::vector<ShardReport> exchange_reports(dist::Communicator& ranks, const ShardReport& mine) {
  std::vector<ShardReport> all(static_cast<size_t>(ranks.size()));
  ranks.all_gather(std::as_bytes(std::span<const ShardReport>(&mine, 1)),
                   std::as_writable_bytes(std::span<ShardReport>(all)));
  for (int r = 0; r < ranks.size(); ++r) {
    const ShardReport& report = all[static_cast<size_t>(r)];
    if (report.failure[0] != '\0') {
      throw Error(ErrorKind::invalid_input,
                  fmt::format("rank {} of {}: {}", r, ranks.size(),
                              std::string(report.failure, strnlen(report.failure, sizeof(report.failure)))));
    }
  }
  return all;
}

// Runs `part`; a failure becomes the report's message.
template <typename Part>
void attempt(ShardReport& report, Part&& part) {
  if (report.failure[0] != '\0') return;
  try {
    part();
  } catch (const std::exception& e) {
    const std::string what = e.what()[0] != '\0' ? e.what() : "failed";
    std::snprintf(report.failure, sizeof(report.failure), "%s", what.c_str());
  }
}

// A save of shards (checkpoint_shards.h), on every rank of a sharded optimizer, `params` the master weights
// on rank 0 (Trainer::master_weights). Rank 0 prepares the staging directory; every rank writes its shard
// of the moments there (atomically, flushed) while rank 0 writes the whole model's files; the ranks exchange
// what they wrote; rank 0 writes the manifest last and renames the directory into place; every rank returns
// once it is there, or throws with the others when any part failed.
// With a hybrid layout the shards are a shard group's: the ranks of the first group (ranks 0 .. size - 1,
// topology.h) write them, and the other groups, which hold the same state, take part in the agreement only.
fs::path save_shards(const fs::path& run_dir, const fs::path& final_dir, Model& model, Trainer& trainer,
                     const TrainingProgress& progress, const CheckpointOptions& options,
                     const std::vector<float>& params) {
  dist::Communicator& ranks = *trainer.parallel().communicator;
  const int rank = trainer.parallel().shard_rank(), size = static_cast<int>(trainer.parallel().shard_ranks());
  const bool writes_shard = ranks.rank() < size;
  const fs::path temporary = staging_directory(final_dir);

  ShardReport prepared;
  if (ranks.rank() == 0) attempt(prepared, [&] { prepare_staging(final_dir); });
  exchange_reports(ranks, prepared);

  ShardReport mine;
  AdamW& optimizer = trainer.optimizer();
  const dist::ShardRange& shard = optimizer.shard();
  mine.begin = shard.begin;
  mine.end = shard.end;
  if (writes_shard)
    attempt(mine, [&] {
      const dist::ShardRange expected = dist::shard_range(model.parameter_count(), rank, size);
      OCTET_CHECK(shard.begin == expected.begin && shard.end == expected.end,
                  "rank {}'s shard [{}, {}) is dist::shard_range's", rank, shard.begin, shard.end);
      // m, then v, of the shard's elements.
      const size_t n = static_cast<size_t>(shard.size());
      std::string bytes(2 * n * sizeof(float), '\0');
      model.backend().copy_to_host(bytes.data(), optimizer.first_moment(), n * sizeof(float));
      model.backend().copy_to_host(bytes.data() + n * sizeof(float), optimizer.second_moment(),
                                   n * sizeof(float));
      const fs::path file = temporary / optimizer_shard_file_name(rank, size);
      io::write_file_atomically(file, bytes);
      mine.bytes = static_cast<int64_t>(bytes.size());
      mine.digest = checkpoint_digest(bytes);
      if (options.after_file_written) options.after_file_written(file);
    });
  std::vector<CheckpointFileRecord> whole;
  if (ranks.rank() == 0) {
    attempt(mine, [&] {
      for (const std::string& name :
           write_whole_files(temporary, model, trainer, progress, options, params, nullptr, nullptr)) {
        const fs::path path = temporary / name;
        whole.push_back({name, static_cast<int64_t>(fs::file_size(path)), checkpoint_file_digest(path)});
      }
    });
  }
  const std::vector<ShardReport> reports = exchange_reports(ranks, mine);

  ShardReport committed;
  if (ranks.rank() == 0) {
    attempt(committed, [&] {
      ShardManifest manifest;
      manifest.step = trainer.steps_done();
      manifest.ranks = size;
      manifest.parameter_count = model.parameter_count();
      manifest.octet_version = kVersion;
      manifest.files = whole;
      for (int r = 0; r < size; ++r) {
        const ShardReport& report = reports[static_cast<size_t>(r)];
        manifest.optimizer.push_back(
            {r, report.begin, report.end, {optimizer_shard_file_name(r, size), report.bytes, report.digest}});
      }
      // The manifest is the last file of the checkpoint: a directory without it is no checkpoint of shards.
      write_file_durably(temporary / kShardManifestFile, shard_manifest_text(manifest));
      if (options.after_file_written) options.after_file_written(temporary / kShardManifestFile);
      commit_checkpoint(run_dir, temporary, final_dir, options.keep_last);
    });
  }
  exchange_reports(ranks, committed);
  return final_dir;
}

}  // namespace

fs::path save_checkpoint(const fs::path& run_dir, Model& model, Trainer& trainer,
                         const TrainingProgress& progress, const CheckpointOptions& options) {
  OCTET_REQUIRE(options.keep_last >= 1, "checkpoint keep_last must be at least 1, got {}", options.keep_last);
  const fs::path final_dir = checkpoint_directory(run_dir, trainer.steps_done());
  // A sharded optimizer's ranks each write their shard of the moments, under one manifest; rank 0 writes the
  // parameters, gathered from the ranks' shards (FP8 weight gathers leave the float32 masters outside a
  // rank's shard stale on the device).
  // The master weights first, on every rank together (whole on rank 0's host only: the device's stale
  // masters stay given back).
  if (trainer.optimizer().sharded()) {
    const std::vector<float> params = trainer.master_weights(trainer.parallel().communicator->rank() == 0);
    return save_shards(run_dir, final_dir, model, trainer, progress, options, params);
  }
  // Otherwise every rank holds the same parameters, moments and scaling state: rank 0 writes the one whole
  // checkpoint, the files one rank would write, and the others wait until it is in place.
  dist::Communicator* ranks = trainer.parallel().communicator;
  if (ranks != nullptr && ranks->rank() != 0) {
    ranks->barrier();
    return final_dir;
  }
  const std::vector<float> m = whole_moment(model, trainer, trainer.optimizer().first_moment());
  const std::vector<float> v = whole_moment(model, trainer, trainer.optimizer().second_moment());
  const fs::path temporary = prepare_staging(final_dir);
  const std::vector<float> params = to_host(model.backend(), model.params(), model.parameter_count());
  write_whole_files(temporary, model, trainer, progress, options, params, &m, &v);
  commit_checkpoint(run_dir, temporary, final_dir, options.keep_last);
  if (ranks != nullptr) ranks->barrier();
  return final_dir;
}

}  // namespace octet
