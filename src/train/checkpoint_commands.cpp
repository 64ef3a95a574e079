// `octet eval` and `octet generate`: a run rebuilt from its checkpoint (see training_run.h).
#include <cmath>
#include <filesystem>
#include <optional>

#include "octet/check.h"
#include "octet/io/data_loader.h"
#include "octet/io/tokenizer.h"
#include "octet/model/model.h"
#include "octet/model/sampling.h"
#include "octet/train/checkpoint.h"
#include "octet/train/precision_schedule.h"
#include "octet/train/trainer.h"
#include "octet/train/training_run.h"
#include "run_device.h"

namespace octet {
namespace {

namespace fs = std::filesystem;

// A model (and the trainer that owns its optimizer state) rebuilt from a checkpoint's saved configuration.
struct Restored {
  RunConfig config;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Trainer> trainer;
};

Restored restore(const fs::path& checkpoint, int64_t batch, int64_t seq_len, const std::string& device,
                 std::string* device_line) {
  Restored r;
  r.config = parse_run_config(checkpoint_config(checkpoint), (checkpoint / "state.json").string());
  // A run with a precision schedule is evaluated in the mode its checkpoint's step trained in.
  r.config = config_in_mode(r.config, precision_at(r.config, checkpoint_step(checkpoint)));
  if (!device.empty()) {
    OCTET_REQUIRE(device == "auto" || device == "cpu" || device == "cuda",
                  "--device must be \"auto\", \"cpu\" or \"cuda\", got \"{}\"", device);
    r.config.device = device;
  }
  const DeviceChoice choice = choose_device(r.config);
  r.backend = make_backend(choice, r.config);
  if (device_line != nullptr) *device_line = choice.line;
  const int64_t B = batch > 0 ? batch : r.config.train.batch_size;
  const int64_t T = seq_len > 0 ? seq_len : r.config.train.seq_len;
  TrainSettings settings = r.config.train;
  settings.batch_size = B;
  settings.seq_len = T;
  allocate_or_refuse(r.config, [&] {
    r.model = make_model(r.config.model, *r.backend,
                         PrecisionPolicy(r.config.precision, r.config.model, B * T), B, T);
    r.trainer = std::make_unique<Trainer>(*r.model, settings);
  });
  load_checkpoint(checkpoint, *r.model, *r.trainer);
  return r;
}

}  // namespace

EvaluationResult evaluate_checkpoint(const fs::path& checkpoint, const fs::path& data_dir, int64_t batches,
                                     const std::string& device) {
  OCTET_REQUIRE(batches >= 0,
                "the number of batches must be at least 1 (0: the run's data.eval_batches), got {}", batches);
  EvaluationResult result;
  Restored r = restore(checkpoint, 0, 0, device, &result.device_line);
  if (batches == 0) batches = r.config.eval_batches;
  const fs::path dir = data_dir.empty() ? r.config.data_dir : data_dir;
  const int64_t B = r.config.train.batch_size, T = r.config.train.seq_len;
  io::DataLoader loader(dir, io::DataSplit::validation,
                        io::DataLoaderOptions{B, T, false, 0, r.config.model.vocab_size});
  const BatchSource data = [&](int32_t* tokens, int32_t* targets) {
    loader.next_batch({tokens, static_cast<size_t>(B * T)}, {targets, static_cast<size_t>(B * T)});
  };
  result.loss = r.trainer->evaluate(data, batches);
  result.perplexity = std::exp(result.loss);
  result.tokens = batches * B * T;
  result.step = r.trainer->steps_done();
  result.mode = r.config.precision.mode;
  return result;
}

std::string generate_from_checkpoint(const fs::path& checkpoint, std::string_view prompt,
                                     const SamplingSettings& settings, const std::string& device) {
  const RunConfig config =
      parse_run_config(checkpoint_config(checkpoint), (checkpoint / "state.json").string());
  const std::optional<io::TokenizerKind> kind = io::parse_tokenizer_kind(config.tokenizer);
  OCTET_REQUIRE(kind.has_value(), "the checkpoint's tokenizer '{}' is not one octet knows", config.tokenizer);
  // A BPE tokenizer's files come with the checkpoint (or the data directory, or the default place), so that
  // generation works from any directory.
  const std::unique_ptr<io::Tokenizer> tokenizer =
      io::tokenizer_files(*kind).empty()
          ? io::make_tokenizer(*kind)
          : io::make_tokenizer(*kind, checkpoint_tokenizer_files(*kind, checkpoint, config.data_dir));
  const std::vector<int32_t> tokens = tokenizer->encode(prompt);
  OCTET_REQUIRE(!tokens.empty(), "the prompt is empty: give some text to continue");
  Restored r = restore(checkpoint, 1, config.model.max_seq_len, device, nullptr);
  const std::vector<int32_t> continuation = generate(*r.model, tokens, settings, tokenizer->end_of_text());
  return tokenizer->decode(continuation);
}

}  // namespace octet
