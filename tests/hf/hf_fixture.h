// Shared pieces of the Hugging Face import and export tests: tiny GPT-2, Llama and Mixtral run
// configurations, a checkpoint saved from one with random weights, safetensors files written by hand (any
// dtype, shards), and Hugging Face model directories built from an exported one.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "octet/backend/cpu_backend.h"
#include "octet/config/run_config.h"
#include "octet/io/atomic_file.h"
#include "octet/io/safetensors.h"
#include "octet/model/model.h"
#include "octet/numerics/format.h"
#include "octet/train/checkpoint.h"
#include "octet/train/trainer.h"
#include "tiny_model.h"

namespace octet::testing {

// A GPT-2 of two layers, 64 channels and 300 tokens (the byte tokenizer needs at least 256).
inline RunConfig tiny_gpt2_run() {
  RunConfig c;
  c.model.arch = ModelArchitecture::gpt2;
  c.model.vocab_size = 300;
  c.model.max_seq_len = 16;
  c.model.layers = 2;
  c.model.heads = 4;
  c.model.channels = 64;
  c.model_arch = c.model.arch;
  c.train.batch_size = 2;
  c.train.seq_len = 16;
  c.eval_batches = 1;
  return parse_run_config(to_toml(c), "tiny_gpt2");
}

// A Llama with grouped-query attention; `fp8_shape` makes every linear layer's dimensions multiples of
// 128, as transformers' FP8 layers need (128 channels, 2 heads of 64, 2 key/value heads, MLP 256).
inline RunConfig tiny_llama_run(bool fp8_shape = false, bool tied = false) {
  RunConfig c = tiny_gpt2_run();
  c.model.arch = ModelArchitecture::llama;
  c.model.heads = fp8_shape ? 2 : 4;
  c.model.kv_heads = 2;
  c.model.channels = fp8_shape ? 128 : 64;
  c.model.ffn_hidden = fp8_shape ? 256 : 96;
  c.model.rope_theta = 10000.0f;
  c.model.tie_embeddings = tied;
  c.model_arch = c.model.arch;
  return parse_run_config(to_toml(c), "tiny_llama");
}

// tiny_moe_config's mixture of experts (4 experts 32 wide, 2 per token) as a Mixtral: the tiny GPT-2's
// 300-token vocabulary and context of 16 (the byte tokenizer needs at least 256 tokens); `fp8_shape` makes
// every converted layer's dimensions multiples of 128 as tiny_llama_run does (experts 128 wide).
inline RunConfig tiny_mixtral_run(bool fp8_shape = false, bool shared_expert = false) {
  RunConfig c = tiny_gpt2_run();
  const ModelConfig base = c.model;
  c.model = tiny_moe_config(shared_expert);
  c.model.vocab_size = base.vocab_size;
  c.model.padded_vocab_size = 0;
  c.model.max_seq_len = base.max_seq_len;
  if (fp8_shape) {
    c.model.heads = 2;
    c.model.channels = 128;
    c.model.ffn_hidden = 128;
  }
  c.model_arch = c.model.arch;
  return parse_run_config(to_toml(c), "tiny_mixtral");
}

// A checkpoint of `config`'s model with the weights of init_weights(seed), the biases and norms made
// non-trivial, saved under run_dir; `params` receives the master weights.
inline std::filesystem::path save_random_checkpoint(const RunConfig& config, const std::filesystem::path& run_dir,
                                                    uint64_t seed, std::vector<float>* params = nullptr) {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::unique_ptr<Model> model =
      make_model(config.model, *backend, PrecisionPolicy(PrecisionSettings{}, config.model, 1), 1, 1);
  model->init_weights(seed);
  // Norm weights start at 1 and biases at 0: give every element its own value so that a swap shows.
  for (const ParameterInfo& p : model->parameters()) {
    if (p.shape.size() != 1) continue;
    for (int64_t i = 0; i < p.count; ++i) model->params()[p.offset + i] += 0.001f * static_cast<float>((i * 7 + 3) % 13);
  }
  TrainSettings settings = config.train;
  settings.batch_size = 1;
  settings.seq_len = 1;
  Trainer trainer(*model, settings);
  TrainingProgress progress;
  progress.seed = seed;
  progress.config = to_toml(config);
  if (params != nullptr) params->assign(model->params(), model->params() + model->parameter_count());
  return save_checkpoint(run_dir, *model, trainer, progress);
}

// The master weights of a checkpoint (optimizer.safetensors without the moments), by name.
inline std::map<std::string, std::vector<float>> master_weights(const std::filesystem::path& checkpoint) {
  std::map<std::string, std::vector<float>> weights;
  for (io::SafetensorsTensor& t : io::read_safetensors(checkpoint / "optimizer.safetensors").tensors) {
    if (t.name.rfind("m.", 0) == 0 || t.name.rfind("v.", 0) == 0) continue;
    weights[t.name] = std::move(t.data);
  }
  return weights;
}

// A safetensors file of raw tensors given as (name, dtype, shape, float values), each value stored in
// `dtype` (f32 as is, bf16 and f16 rounded to nearest even).
struct RawTensor {
  std::string name;
  Dtype dtype;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

inline void write_raw_safetensors(const std::filesystem::path& path, const std::vector<RawTensor>& tensors) {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<io::SafetensorsRawEntry> entries;
  for (const RawTensor& t : tensors) {
    const int width = dtype_info(t.dtype).storage_bits / 8;
    std::vector<uint8_t> b(t.values.size() * static_cast<size_t>(width));
    for (size_t i = 0; i < t.values.size(); ++i) {
      if (t.dtype == Dtype::f32) {
        std::memcpy(b.data() + i * 4, &t.values[i], 4);
      } else {
        const uint32_t code = encode(t.dtype, t.values[i]);
        std::memcpy(b.data() + i * static_cast<size_t>(width), &code, static_cast<size_t>(width));
      }
    }
    bytes.push_back(std::move(b));
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    entries.push_back({tensors[i].name, tensors[i].dtype, tensors[i].shape, bytes[i]});
  io::write_safetensors(path, entries);
}

// The tensors of a safetensors file (widened to float32) as RawTensors of `dtype`.
inline std::vector<RawTensor> tensors_of(const std::filesystem::path& path, Dtype dtype = Dtype::f32) {
  std::vector<RawTensor> result;
  for (const io::SafetensorsTensor& t : io::read_safetensors(path, {true}).tensors)
    result.push_back({t.name, dtype, t.shape, t.data});
  return result;
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A Hugging Face directory: `config` as config.json and `tensors` as model.safetensors.
inline void write_hf_directory(const std::filesystem::path& dir, const nlohmann::json& config,
                               const std::vector<RawTensor>& tensors) {
  std::filesystem::create_directories(dir);
  io::write_file_atomically(dir / "config.json", config.dump(2));
  write_raw_safetensors(dir / "model.safetensors", tensors);
}

// A Mixtral's tensors in the classic layout (block_sparse_moe.gate and block_sparse_moe.experts.E.w1, w3,
// w2) rewritten in transformers 5's fused one (mlp.gate, mlp.experts.gate_up_proj [E, 2F, C] with each
// expert's w1 rows before its w3 rows, mlp.experts.down_proj [E, C, F]); the other tensors as they were.
inline std::vector<RawTensor> fuse_mixtral_experts(const std::vector<RawTensor>& classic,
                                                   const ModelConfig& m) {
  const int64_t C = m.channels, F = m.hidden(), E = m.experts;
  std::map<std::string, const RawTensor*> by_name;
  for (const RawTensor& t : classic) by_name[t.name] = &t;
  auto take = [&](const std::string& name) -> const std::vector<float>& {
    const auto it = by_name.find(name);
    if (it == by_name.end()) throw std::runtime_error("no tensor " + name);
    const RawTensor* t = it->second;
    by_name.erase(it);
    return t->values;
  };
  std::vector<RawTensor> fused;
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string block = "model.layers." + std::to_string(l) + ".";
    fused.push_back(
        {block + "mlp.gate.weight", Dtype::f32, {E, C}, take(block + "block_sparse_moe.gate.weight")});
    RawTensor gate_up{block + "mlp.experts.gate_up_proj", Dtype::f32, {E, 2 * F, C}, {}};
    RawTensor down{block + "mlp.experts.down_proj", Dtype::f32, {E, C, F}, {}};
    for (int64_t e = 0; e < E; ++e) {
      const std::string expert = block + "block_sparse_moe.experts." + std::to_string(e) + ".";
      for (const char* w : {"w1.weight", "w3.weight"}) {
        const std::vector<float>& v = take(expert + w);
        gate_up.values.insert(gate_up.values.end(), v.begin(), v.end());
      }
      const std::vector<float>& v = take(expert + "w2.weight");
      down.values.insert(down.values.end(), v.begin(), v.end());
    }
    fused.push_back(std::move(gate_up));
    fused.push_back(std::move(down));
  }
  for (const RawTensor& t : classic) {
    if (by_name.contains(t.name)) fused.push_back(t);
  }
  return fused;
}

}  // namespace octet::testing
