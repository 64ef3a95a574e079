// `octet export --format hf|hf-fp8`: a checkpoint into a directory transformers loads (see hf_convert.h).
#include <algorithm>
#include <cstring>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "hf_tensor_map.h"
#include "hf_tokenizer.h"
#include "octet/backend/cpu_backend.h"
#include "octet/check.h"
#include "octet/config/run_config.h"
#include "octet/huggingface/hf_config.h"
#include "octet/huggingface/hf_convert.h"
#include "octet/io/atomic_file.h"
#include "octet/io/safetensors.h"
#include "octet/model/model.h"
#include "octet/numerics/minifloat.h"
#include "octet/numerics/quantize.h"
#include "octet/train/checkpoint.h"
#include "octet/version.h"
#include "staged_directory.h"

namespace octet::hf {

namespace fs = std::filesystem;

namespace {

// transformers' fine-grained FP8 layout: one float32 scale_inv per 128 x 128 block of a weight.
constexpr int64_t kBlock = 128;

// The linear layers that transformers' fine-grained FP8 replaces with its FP8 layers, by their Hugging Face
// weight name: Llama's and Mixtral's attention projections, Llama's MLP projections and each Mixtral
// expert's (w1, w3 and w2 of block_sparse_moe.experts.E). Not lm_head, nor Mixtral's router
// (block_sparse_moe.gate), which modules_to_not_convert keeps in the dtype they are stored in.
bool is_fp8_linear(std::string_view hf_name) {
  for (const char* suffix : {".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight",
                             ".self_attn.o_proj.weight", ".mlp.gate_proj.weight", ".mlp.up_proj.weight",
                             ".mlp.down_proj.weight"}) {
    if (hf_name.ends_with(suffix)) return true;
  }
  if (hf_name.find(".block_sparse_moe.experts.") == std::string_view::npos) return false;
  return hf_name.ends_with(".w1.weight") || hf_name.ends_with(".w2.weight") ||
         hf_name.ends_with(".w3.weight");
}

std::string quantization_config(HfArchitecture architecture) {
  nlohmann::json keep = nlohmann::json::array({"lm_head"});
  if (architecture == HfArchitecture::mixtral) {
    // The router: an nn.Linear named block_sparse_moe.gate in transformers 4, mlp.gate in 5 (where it is no
    // nn.Linear, but a model may still be loaded with either name).
    keep.push_back("block_sparse_moe.gate");
    keep.push_back("mlp.gate");
  }
  const nlohmann::json q = {{"quant_method", "fp8"},
                            {"activation_scheme", "dynamic"},
                            {"fmt", "e4m3"},
                            {"weight_block_size", {kBlock, kBlock}},
                            {"modules_to_not_convert", keep}};
  return q.dump();
}

// One tensor of model.safetensors with the bytes it owns.
struct OutputTensor {
  std::string name;
  Dtype dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// x rounded to BF16 (to nearest even), as little-endian bytes.
std::vector<uint8_t> bf16_bytes(const std::vector<float>& x) {
  std::vector<uint8_t> bytes(x.size() * 2);
  const MinifloatSpec bf16 = minifloat_spec(Dtype::bf16);
  for (size_t i = 0; i < x.size(); ++i) {
    const uint32_t code = encode(bf16, x[i], Overflow::non_saturating);
    bytes[2 * i] = static_cast<uint8_t>(code & 0xFF);
    bytes[2 * i + 1] = static_cast<uint8_t>(code >> 8);
  }
  return bytes;
}

std::vector<uint8_t> float_bytes(const std::vector<float>& x) {
  std::vector<uint8_t> bytes(x.size() * sizeof(float));
  if (!x.empty()) std::memcpy(bytes.data(), x.data(), bytes.size());
  return bytes;
}

}  // namespace

ExportSummary export_checkpoint(const fs::path& checkpoint, const fs::path& out, ExportFormat format,
                                bool replace) {
  StagedDirectory staged(out, replace);  // checks the output before anything is read
  const fs::path state_path = checkpoint / "state.json";
  RunConfig config;
  try {
    config = parse_run_config(checkpoint_config(checkpoint), state_path.string());
  } catch (const Error& e) {
    OCTET_REQUIRE(false, "{} is not a checkpoint octet can export: {}", checkpoint.string(), e.what());
  }
  ExportSummary summary;
  const HfArchitecture architecture = hf_architecture(config.model);
  summary.architecture = std::string(architecture_class(architecture));
  OCTET_REQUIRE(
      format != ExportFormat::fp8 || config.model.arch == ModelArchitecture::llama,
      "--format hf-fp8 exports Llama and Mixtral models (transformers' FP8 layers replace nn.Linear, "
      "and GPT-2's layers are Conv1D); {} holds a {}",
      checkpoint.string(), summary.architecture);
  OCTET_REQUIRE(
      !(config.model.moe() && config.model.shared_expert),
      "{} holds a mixture of experts with a shared expert (model.shared_expert); octet exports mixtures "
      "of experts as MixtralForCausalLM, which has no shared expert",
      checkpoint.string());

  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::unique_ptr<Model> model =
      make_model(config.model, *backend, PrecisionPolicy(PrecisionSettings{}, config.model, 1), 1, 1);
  load_checkpoint_weights(checkpoint, *model);
  const std::vector<float> params(model->params(), model->params() + model->parameter_count());

  std::vector<OutputTensor> tensors;
  for (const ParameterInfo& p : model->parameters()) {
    // The classic place: a whole tensor, in Model::hf_shape's layout, that every transformers version reads.
    const TensorPlace place = tensor_places(*model, p, config.model, architecture).front();
    const std::string& name = place.tensor;
    const std::vector<int64_t>& shape = place.shape;
    std::vector<float> values = model->to_hf(p, params);
    if (format == ExportFormat::fp8 && name.ends_with(".block_sparse_moe.gate.weight")) {
      // transformers' FP8 model computes in BF16 and keeps a module it does not convert in its stored
      // dtype: a float32 router would meet BF16 hidden states.
      tensors.push_back({name, Dtype::bf16, shape, bf16_bytes(values)});
      continue;
    }
    if (format != ExportFormat::fp8 || !is_fp8_linear(name)) {
      tensors.push_back({name, Dtype::f32, shape, float_bytes(values)});
      continue;
    }
    const int64_t rows = shape[0], cols = shape[1];
    OCTET_REQUIRE(rows % kBlock == 0 && cols % kBlock == 0,
                  "--format hf-fp8: {} is [{}, {}]; transformers' FP8 layers need both dimensions to be "
                  "multiples of the {} x {} block",
                  name, rows, cols, kBlock, kBlock);
    ScalingState unused;
    const QuantizedTensor q =
        quantize(values, rows, cols, Dtype::e4m3, TensorRole::weight, BlockScaling(), unused);
    tensors.push_back({name, Dtype::e4m3, shape, q.data});
    const std::string scale_name = name.substr(0, name.size() - std::string_view("weight").size()) + "weight_scale_inv";
    tensors.push_back({scale_name, Dtype::f32, {rows / kBlock, cols / kBlock}, float_bytes(q.scale_inv)});
    ++summary.fp8_tensors;
  }
  std::vector<io::SafetensorsRawEntry> entries;
  for (const OutputTensor& t : tensors) entries.push_back({t.name, t.dtype, t.shape, t.bytes});
  summary.tensors = static_cast<int64_t>(entries.size());

  const TokenizerExport tokenizer = find_tokenizer(config, checkpoint);
  if (!tokenizer.note.empty()) summary.notes.push_back(tokenizer.note);
  const std::vector<TokenizerFile> tokenizer_files = tokenizer_output(tokenizer, config.model);

  // Everything is read and valid: write.
  const fs::path& temporary = staged.create();
  io::write_safetensors(temporary / "model.safetensors", entries, {{"format", "pt"}, {"octet_version", kVersion}});
  summary.files.push_back("model.safetensors");
  io::write_file_atomically(
      temporary / "config.json",
      config_json(config.model, tokenizer.ids,
                  format == ExportFormat::fp8 ? quantization_config(architecture) : ""));
  summary.files.push_back("config.json");
  for (const TokenizerFile& file : tokenizer_files) {
    io::write_file_atomically(temporary / file.name, file.contents);
    summary.files.push_back(file.name);
  }
  std::sort(summary.files.begin(), summary.files.end());
  staged.commit();
  return summary;
}

}  // namespace octet::hf
