// See cmd_train.h.
#include "cmd_train.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "number_parse.h"
#include "rank_launcher.h"
#include "octet/backend/registry.h"
#include "octet/dist/launch.h"
#include "octet/check.h"
#include "octet/config/run_config.h"
#include "octet/io/corpus.h"
#include "octet/io/input.h"
#include "octet/io/tokenizer.h"
#include "octet/train/checkpoint.h"
#include "octet/train/training_run.h"

namespace octet::cli {

WorkflowCommands::WorkflowCommands(CLI::App& root) {
  config_ = root.add_subcommand("config", "Inspect training configurations");
  config_show_ = config_->add_subcommand("show", "Print the fully resolved configuration, defaults included");
  config_show_->add_option("CONFIG", config_file_, "TOML configuration file")->required();
  config_show_->add_option("--set", overrides_, "Override a key: section.key=value (repeatable)");
  config_show_->footer(
      "Example:\n  octet config show configs/quickstart.toml --set train.mixed_precision=bf16");

  config_keys_ =
      config_->add_subcommand("keys", "List every configuration key with its type, default and valid values");

  data_ = root.add_subcommand("data", "Prepare training data");
  data_prepare_ =
      data_->add_subcommand("prepare", "Tokenize text files into llm.c token shards (train and validation)");
  data_prepare_->add_option("--tokenizer", tokenizer_, "bytes, gpt2 or llama3 (default bytes)");
  data_prepare_->add_option("--out", out_dir_, "Directory for train_NNNNNN.bin and val_NNNNNN.bin")
      ->required();
  data_prepare_->add_option(
      "--vocab", vocabulary_dir_,
      "gpt2: directory of encoder.json and vocab.bpe; llama3: directory of llama3.tiktoken (default: "
      "where scripts/fetch_tokenizer.sh puts them)");
  data_prepare_->add_option("FILES", text_files_, "Text files, one document each")->required();
  data_prepare_->footer(
      "Every 20th document goes to the validation split.\n"
      "Example:\n  octet data prepare --tokenizer bytes --out data/brown .cache/data/brown/text/*.txt");

  train_ = root.add_subcommand("train", "Train a GPT as a TOML configuration describes");
  train_->add_option("CONFIG", config_file_, "TOML configuration file (docs/config.md)")->required();
  train_->add_option("--set", overrides_, "Override a key: section.key=value (repeatable)");
  CLI::Option* resume = train_->add_flag("--resume", resume_,
                                         "Continue from the latest complete checkpoint in the run directory");
  CLI::Option* resume_from = train_->add_option(
      "--resume-from", resume_from_,
      "Continue from this checkpoint directory (of any run; a run directory: its latest) into "
      "logging.run_dir, which must not hold another run");
  CLI::Option* overwrite = train_->add_flag(
      "--overwrite", overwrite_,
      "Start afresh in a run directory that holds a run: remove octet's files of that run (config.toml, "
      "precision_map.json, metrics.jsonl, telemetry.sqlite*, checkpoints/); other files stay");
  CLI::Option* init_from = train_->add_option(
      "--init-from", init_from_,
      "Start a new run (step 0, fresh optimizer) from the weights of this checkpoint (of any run or of `octet "
      "import hf`; a run directory: its latest); its model must equal the configuration's [model]");
  resume->excludes(resume_from)->excludes(overwrite)->excludes(init_from);
  resume_from->excludes(init_from);
  CLI::Option* gpus = train_->add_option(
      "--gpus", gpus_,
      "Train on N GPUs of this machine, one process (rank) each, data parallel (docs/distributed.md); under "
      "mpirun, srun or torchrun, the number of ranks they start");
  CLI::Option* ranks = train_->add_option(
      "--ranks", ranks_,
      "Train as N processes of this machine on the device train.device names (CPU ranks: the GPU run's "
      "arithmetic, for tests and small runs)");
  gpus->excludes(ranks);
  train_->footer(
      "Writes config.toml, precision_map.json, metrics.jsonl (one JSON object per step, each line flushed) "
      "and\n"
      "checkpoints/ to logging.run_dir. A run directory that holds a run already is refused unless "
      "--resume,\n"
      "--overwrite or --resume-from says what to do with it; RUN_DIR/octet.lock keeps a second run out "
      "while\n"
      "one trains there.\n"
      "SIGINT or SIGTERM stops after the current step and saves a checkpoint.\n"
      "Exit codes: 0 done; 2 invalid configuration, data, checkpoint or run directory (one line on standard\n"
      "error, nothing written); 3 training could not go on (a checkpoint, metrics or telemetry write "
      "failed,\n"
      "too many non-finite steps, an FP8 alert with fp8.on_alert = \"stop\"); 130 or 143 stopped by SIGINT "
      "or\n"
      "SIGTERM (128 + the signal) after saving its checkpoint.\n"
      "Several ranks (--gpus N, or a launcher: mpirun, srun, torchrun): rank 0 prints and writes the run\n"
      "directory; a rank that fails stops every rank, and the exit code is the first failing rank's.\n"
      "Examples:\n  octet train configs/quickstart.toml --set train.steps=100\n"
      "  octet train configs/llama3-1B.toml --gpus 4\n"
      "  octet train configs/quickstart.toml --resume\n"
      "  octet train configs/quickstart.toml --resume-from runs/quickstart/checkpoints/step_000200 --set "
      "logging.run_dir=runs/branch\n"
      "  octet train imported/llama/config.toml --init-from imported/llama --set data.dir=data/mine");

  eval_ = root.add_subcommand("eval", "Validation loss and perplexity of a checkpoint");
  eval_
      ->add_option("CHECKPOINT", checkpoint_,
                   "A checkpoint directory, or a run directory (its latest checkpoint)")
      ->required();
  eval_->add_option("--data", eval_data_,
                    "Shard directory (default: the data.dir the checkpoint was trained with)");
  eval_->add_option("--batches", eval_batches_,
                    fmt::format("Validation batches to average over, 0 to {} (default: the run's "
                                "data.eval_batches)",
                                kMaxCount));
  eval_->add_option("--device", device_,
                    "auto, cpu or cuda (default: the run's train.device); prints where it runs on stderr");
  eval_->footer("Example:\n  octet eval runs/quickstart");

  generate_ = root.add_subcommand("generate", "Continue a prompt with a checkpoint's model");
  generate_
      ->add_option("CHECKPOINT", checkpoint_,
                   "A checkpoint directory, or a run directory (its latest checkpoint)")
      ->required();
  generate_->add_option("--prompt", prompt_, "Text to continue")->required();
  generate_->add_option("--max-tokens", max_tokens_,
                        fmt::format("Tokens to generate, 0 to {} (default 64)", kMaxCount));
  generate_->add_option("--temperature", temperature_,
                        "Sampling temperature; 0 always takes the likeliest token (default 0.8)");
  generate_->add_option("--top-k", top_k_, "Sample among the k likeliest tokens; 0 for all (default 40)");
  generate_->add_option("--seed", seed_, "Seed of the sampling (default 1)");
  generate_->add_option("--device", device_, "auto, cpu or cuda (default: the run's train.device)");
  generate_->footer("Example:\n  octet generate runs/quickstart --prompt \"The jury said\" --max-tokens 40");
}

// A count given on the command line: a decimal integer from 0 to kMaxCount, refused naming the option.
static int64_t parse_count(std::string_view option, const std::string& text) {
  int64_t value = 0;
  const char* first = text.data() + (text.size() > 1 && text[0] == '+' ? 1 : 0);
  const char* last = text.data() + text.size();
  const auto [end, error] = std::from_chars(first, last, value);
  const bool integer =
      !text.empty() && end == last && (error == std::errc() || error == std::errc::result_out_of_range);
  OCTET_REQUIRE(integer, "{} '{}' is not a whole number; give an integer from 0 to {}", option,
                quote_token(text), kMaxCount);
  OCTET_REQUIRE(error == std::errc() && value >= 0 && value <= kMaxCount,
                "{} {} is out of range; give an integer from 0 to {}", option, quote_token(text), kMaxCount);
  return value;
}

bool WorkflowCommands::selected() const {
  return config_->parsed() || data_->parsed() || train_->parsed() || eval_->parsed() || generate_->parsed();
}

std::filesystem::path resolve_checkpoint(const std::string& given) {
  const std::filesystem::path p(given);
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(p, ec);
  OCTET_REQUIRE(!ec || status.type() == std::filesystem::file_type::not_found, "{} cannot be used: {}", given,
                ec.message());
  if (std::filesystem::exists(p / "state.json", ec)) return p;
  const std::optional<std::filesystem::path> latest = checkpoint_to_continue(p);
  OCTET_REQUIRE(
      latest.has_value(),
      "{} is neither a checkpoint (a directory with state.json) nor a run directory with a complete "
      "checkpoint",
      given);
  return *latest;
}

bool WorkflowCommands::group_without_command() const {
  return (config_->parsed() && !config_show_->parsed() && !config_keys_->parsed()) ||
         (data_->parsed() && !data_prepare_->parsed());
}

int WorkflowCommands::run() const {
  if (config_show_->parsed()) {
    const RunConfig config = load_run_config(config_file_, overrides_);
    std::fputs(to_toml(config).c_str(), stdout);
    return 0;
  }
  if (config_keys_->parsed()) {
    // A Markdown table: docs/config.md holds this very output.
    std::puts("| key | type | default | valid values | meaning |");
    std::puts("|---|---|---|---|---|");
    for (const ConfigKeyInfo& k : config_keys()) {
      std::printf("| `%s` | %s | `%s` | %s | %s |\n", k.name.c_str(), k.type.c_str(), k.default_value.c_str(),
                  k.valid.c_str(), k.description.c_str());
    }
    return 0;
  }
  if (data_prepare_->parsed()) {
    const std::optional<io::TokenizerKind> kind = io::parse_tokenizer_kind(tokenizer_);
    OCTET_REQUIRE(kind.has_value(), "--tokenizer '{}' is not a tokenizer octet knows; valid: {}",
                  io::printable(tokenizer_), io::tokenizer_names());
    OCTET_REQUIRE(
        vocabulary_dir_.empty() || !io::tokenizer_files(*kind).empty(),
        "--vocab names the directory of a tokenizer's files (gpt2's encoder.json and vocab.bpe, "
        "llama3's llama3.tiktoken); the {} tokenizer has no files (drop --vocab, or use --tokenizer "
        "gpt2 or llama3)",
        tokenizer_);
    const std::filesystem::path vocabulary_dir =
        vocabulary_dir_.empty() ? io::default_vocabulary_dir(*kind) : std::filesystem::path(vocabulary_dir_);
    const std::unique_ptr<io::Tokenizer> tokenizer = io::make_tokenizer(*kind, vocabulary_dir);
    std::vector<std::filesystem::path> files(text_files_.begin(), text_files_.end());
    const io::PrepareSummary s = io::prepare_text_shards(files, *tokenizer, out_dir_, io::PrepareOptions{});
    // The tokenizer's files go with the data, so that training and generation find them from anywhere.
    io::copy_vocabulary(*kind, vocabulary_dir, out_dir_);
    std::printf(
        "%s: %lld train documents (%lld tokens) in %zu shard(s), %lld validation documents (%lld tokens)\n",
        out_dir_.c_str(), static_cast<long long>(s.train_documents), static_cast<long long>(s.train_tokens),
        s.train_shards.size(), static_cast<long long>(s.validation_documents),
        static_cast<long long>(s.validation_tokens));
    return 0;
  }
  if (eval_->parsed()) {
    const int64_t batches = parse_count("--batches", eval_batches_);
    const std::filesystem::path checkpoint = resolve_checkpoint(checkpoint_);
    const EvaluationResult r = evaluate_checkpoint(checkpoint, eval_data_, batches, device_);
    std::fprintf(stderr, "%s\n", r.device_line.c_str());
    std::printf("%s (step %lld, %s): validation loss %.4f, perplexity %.2f over %lld tokens\n",
                checkpoint.string().c_str(), static_cast<long long>(r.step),
                std::string(mixed_precision_name(r.mode)).c_str(), r.loss, r.perplexity,
                static_cast<long long>(r.tokens));
    return 0;
  }
  if (generate_->parsed()) {
    SamplingSettings s;
    s.max_new_tokens = parse_count("--max-tokens", max_tokens_);
    s.temperature = temperature_;
    s.top_k = top_k_;
    s.seed = seed_;
    const std::string text = generate_from_checkpoint(resolve_checkpoint(checkpoint_), prompt_, s, device_);
    std::printf("%s%s\n", prompt_.c_str(), text.c_str());
    return 0;
  }
  const RunConfig config = load_run_config(config_file_, overrides_);
  TrainingRunOptions options;
  options.interactive = ::isatty(::fileno(stdout)) == 1;
  options.resume = resume_;
  options.overwrite = overwrite_;
  if (!resume_from_.empty()) {
    try {
      options.resume_from = resolve_checkpoint(resume_from_);
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("--resume-from: {}", e.what()));
    }
  }
  if (!init_from_.empty()) {
    try {
      options.init_from = resolve_checkpoint(init_from_);
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("--init-from: {}", e.what()));
    }
  }
  const int64_t wanted = gpus_ > 0 ? gpus_ : ranks_;
  OCTET_REQUIRE(wanted >= 0 && wanted <= 4096, "{} {}: expected a number of ranks from 1 to 4096",
                gpus_ > 0 ? "--gpus" : "--ranks", wanted);
  options.ranks = dist::rank_environment();
  if (options.ranks && options.ranks->world == 1) options.ranks.reset();
  if (options.ranks) {
    // A rank of a launcher's run (this tool's own --gpus, mpirun, srun, torchrun).
    OCTET_REQUIRE(wanted <= 1 || wanted == options.ranks->world,
                  "{} {} but {} started {} ranks: give the launcher's number, or leave the option out",
                  gpus_ > 0 ? "--gpus" : "--ranks", wanted, options.ranks->launcher, options.ranks->world);
  } else if (wanted > 1) {
    if (gpus_ > 0) {
      OCTET_REQUIRE(config.device != "cpu",
                    "--gpus {} trains on GPUs, and train.device = \"cpu\"; use --ranks {} for CPU ranks",
                    gpus_, gpus_);
      const BackendFactory* cuda = find_backend("cuda");
      const int visible = cuda != nullptr ? cuda->device_count() : 0;
      OCTET_REQUIRE(visible >= gpus_, "--gpus {}: this machine shows {} CUDA GPU(s){}", gpus_, visible,
                    cuda == nullptr ? " (this octet was built without CUDA)" : "");
    }
    check_ranks(config, static_cast<int>(wanted));
    return launch_local_ranks(static_cast<int>(wanted));
  }
  const TrainingRunSummary summary = run_training(config, options);
  // A stopped run is no finished one: 128 + the signal, as a shell reports a process the signal ended.
  return summary.interrupted ? 128 + summary.stop_signal : 0;
}

}  // namespace octet::cli
