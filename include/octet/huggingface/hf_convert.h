// `octet import hf` and `octet export --format hf|hf-fp8`: a Hugging Face model directory (config.json and
// model.safetensors, or shards with model.safetensors.index.json) turned into an octet checkpoint at step 0
// with a fresh optimizer, and a checkpoint turned into a directory that transformers' from_pretrained loads:
// float32 weights, or the linear layers' weights as E4M3 codes with 128x128 block scales (transformers'
// "fp8" quantization). Every input is read and validated before anything is written; the output is written
// into a temporary directory beside its place and renamed into it at the end, so that it is either complete
// or absent. Refusals are octet::Error (invalid_input) naming the file and the problem. See
// docs/huggingface.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "octet/model/config.h"

namespace octet::hf {

struct ImportOptions {
  // The tokenizer the checkpoint's config names (data.tokenizer): "bytes", "gpt2" or "llama3"; empty picks
  // gpt2 for a 50257-token GPT-2, llama3 for a Llama with Llama 3's 128256 tokens and bytes otherwise.
  std::string tokenizer;
  bool replace = false;  // replace an existing non-empty output directory (--force)
};

struct ImportSummary {
  std::string architecture;  // the Hugging Face class
  ModelConfig model;
  std::string tokenizer;
  int64_t tensors = 0;               // tensors read into parameters
  std::vector<std::string> notes;    // lines for the caller to print (ignored buffers, the tokenizer)
};

// Imports `hf_dir` into the checkpoint directory `out` (model.safetensors, optimizer.safetensors with zero
// moments, state.json at step 0 with "imported_from", config.toml: the run configuration with the model's
// [model] section, and the tokenizer's files where octet has them). Tensors may be F32, BF16 or F16; every
// parameter must be present with its Hugging Face shape and finite, and no other tensor may be (the buffers
// that transformers used to save, attn.bias and rotary_emb.inv_freq, and a tied lm_head.weight equal to
// the embedding are skipped with a note). A Mixtral's experts may be stored per expert (block_sparse_moe, as
// every transformers version saves them) or fused per layer (transformers 5's mlp.experts.gate_up_proj and
// down_proj); see hf_tensor_map.h.
ImportSummary import_checkpoint(const std::filesystem::path& hf_dir, const std::filesystem::path& out,
                                const ImportOptions& options);

enum class ExportFormat : uint8_t {
  float32,  // --format hf
  fp8,      // --format hf-fp8: attention and MLP (or expert) projections as E4M3 with block scales
};

struct ExportSummary {
  std::string architecture;
  int64_t tensors = 0;             // tensors written to model.safetensors
  int64_t fp8_tensors = 0;         // of which E4M3
  std::vector<std::string> files;  // file names written, sorted
  std::vector<std::string> notes;
};

// Exports the checkpoint directory `checkpoint` to `out`: config.json, model.safetensors and the
// tokenizer's files (GPT-2: vocab.json, merges.txt, tokenizer_config.json; Llama 3: llama3.tiktoken, see
// docs/huggingface.md) when the checkpoint's run used a tokenizer whose files are found. An existing `out`
// that is not an empty directory is refused unless `replace`. A mixture of experts is written as a
// MixtralForCausalLM with its experts per expert (block_sparse_moe.experts.E.w1, w3, w2); one with a
// shared expert is refused.
ExportSummary export_checkpoint(const std::filesystem::path& checkpoint, const std::filesystem::path& out,
                                ExportFormat format, bool replace);

}  // namespace octet::hf
