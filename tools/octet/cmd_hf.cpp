// See cmd_hf.h.
#include "cmd_hf.h"

#include <cstdio>

#include <fmt/format.h>

#include "cmd_train.h"
#include "octet/check.h"
#include "octet/huggingface/hf_convert.h"
#include "octet/io/input.h"

namespace octet::cli {

HuggingFaceCommands::HuggingFaceCommands(CLI::App& root) {
  import_ = root.add_subcommand("import", "Import a model from another format into an octet checkpoint");
  import_hf_ = import_->add_subcommand(
      "hf",
      "A Hugging Face GPT2LMHeadModel, LlamaForCausalLM or MixtralForCausalLM directory into a checkpoint at "
      "step 0");
  import_hf_->add_option("DIR", source_, "Directory with config.json and model.safetensors (or shards and "
                                         "model.safetensors.index.json)")
      ->required();
  import_hf_->add_option("--out", out_, "Checkpoint directory to create")->required();
  import_hf_->add_option("--tokenizer", tokenizer_,
                         "The tokenizer the checkpoint's config names: bytes, gpt2 or llama3 (default: gpt2 for "
                         "a 50257-token GPT-2, llama3 for a 128256-token Llama, bytes otherwise)");
  import_hf_->add_flag("--force", force_, "Replace --out if it exists and is not empty");
  import_hf_->footer(
      "Writes model.safetensors, optimizer.safetensors (zero moments), state.json (step 0, \"imported_from\") "
      "and\n"
      "config.toml (the model's [model] section with octet's defaults) to --out, all or nothing. Tensors may "
      "be\n"
      "F32, BF16 or F16. Exit code 2 and nothing written on any problem with the input (docs/huggingface.md).\n"
      "Example:\n"
      "  octet import hf ~/models/Llama-3.2-1B --out imported/llama-1b\n"
      "  octet train imported/llama-1b/config.toml --init-from imported/llama-1b --set data.dir=data/mine");

  export_ = root.add_subcommand("export", "Export a checkpoint to another format");
  export_
      ->add_option("CHECKPOINT", source_, "A checkpoint directory, or a run directory (its latest checkpoint)")
      ->required();
  export_
      ->add_option("--format", format_,
                   "hf: float32 weights transformers' from_pretrained loads; hf-fp8: Llama's and Mixtral's "
                   "linear layers as E4M3 with 128x128 block scales (transformers' \"fp8\" quantization)")
      ->required();
  export_->add_option("--out", out_, "Directory to create")->required();
  export_->add_flag("--force", force_, "Replace --out if it exists and is not empty");
  export_->footer(
      "Writes config.json, model.safetensors and the tokenizer's files where the checkpoint's run used a "
      "tokenizer\n"
      "whose files octet has, all or nothing.\n"
      "Example:\n  octet export runs/quickstart --format hf --out exported/quickstart");
}

bool HuggingFaceCommands::selected() const {
  return import_->parsed() || export_->parsed();
}

bool HuggingFaceCommands::group_without_command() const {
  return import_->parsed() && !import_hf_->parsed();
}

int HuggingFaceCommands::run() const {
  if (import_hf_->parsed()) {
    const hf::ImportSummary s = hf::import_checkpoint(source_, out_, hf::ImportOptions{tokenizer_, force_});
    for (const std::string& note : s.notes) std::fprintf(stderr, "%s\n", note.c_str());
    std::printf("%s: %s (%s) imported from %s: %lld tensors, tokenizer %s, step 0\n", out_.c_str(),
                s.architecture.c_str(), s.model.describe().c_str(), source_.c_str(),
                static_cast<long long>(s.tensors), s.tokenizer.c_str());
    return 0;
  }
  OCTET_REQUIRE(format_ == "hf" || format_ == "hf-fp8", "--format '{}' is not one octet writes; valid: hf, hf-fp8",
                io::printable(format_));
  std::filesystem::path checkpoint;
  try {
    checkpoint = resolve_checkpoint(source_);
  } catch (const Error& e) {
    throw Error(e.kind(), fmt::format("CHECKPOINT: {}", e.what()));
  }
  const hf::ExportFormat format = format_ == "hf" ? hf::ExportFormat::float32 : hf::ExportFormat::fp8;
  const hf::ExportSummary s = hf::export_checkpoint(checkpoint, out_, format, force_);
  for (const std::string& note : s.notes) std::fprintf(stderr, "%s\n", note.c_str());
  std::printf("%s: %s exported from %s: %lld tensors (%lld in E4M3), files %s\n", out_.c_str(),
              s.architecture.c_str(), checkpoint.string().c_str(), static_cast<long long>(s.tensors),
              static_cast<long long>(s.fp8_tensors), fmt::format("{}", fmt::join(s.files, ", ")).c_str());
  return 0;
}

}  // namespace octet::cli
