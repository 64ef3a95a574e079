// Export to Hugging Face's layout and import back: tiny GPT-2, Llama and Mixtral models come back bit for
// bit, from one file or from shards, from BF16 and F16 as their widened values, a Mixtral from its classic
// and its transformers 5 layout alike; the FP8 export holds octet's own E4M3 casts with their block scales in
// transformers' fine-grained FP8 layout.
#include <regex>

#include <gtest/gtest.h>

#include "../checkpoint/checkpoint_fixture.h"
#include "hf_fixture.h"
#include "octet/huggingface/hf_config.h"
#include "octet/huggingface/hf_convert.h"
#include "octet/numerics/quantize.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

// The name the export gives a tensor of a checkpoint's model.safetensors: the same, except that a Mixtral's
// router and experts take Mixtral's classic names (block_sparse_moe, w1/w3/w2 for gate/up/down).
std::string exported_name(const std::string& name, const ModelConfig& model) {
  if (!model.moe()) return name;
  std::string s =
      std::regex_replace(name, std::regex(R"(\.mlp\.gate\.weight$)"), ".block_sparse_moe.gate.weight");
  s = std::regex_replace(s, std::regex(R"(\.mlp\.experts\.)"), ".block_sparse_moe.experts.");
  s = std::regex_replace(s, std::regex(R"(\.gate_proj\.weight$)"), ".w1.weight");
  s = std::regex_replace(s, std::regex(R"(\.up_proj\.weight$)"), ".w3.weight");
  return std::regex_replace(s, std::regex(R"(\.down_proj\.weight$)"), ".w2.weight");
}

// Export, then import the export: the master weights, the Hugging Face file and the model description
// come back exactly.
void expect_round_trip(const RunConfig& config) {
  ScratchDir dir;
  std::vector<float> params;
  const fs::path checkpoint = testing::save_random_checkpoint(config, dir.path() / "run", 5, &params);
  const hf::ExportSummary exported =
      hf::export_checkpoint(checkpoint, dir.path() / "hf", hf::ExportFormat::float32, false);
  EXPECT_EQ(exported.fp8_tensors, 0);
  const hf::ImportSummary imported = hf::import_checkpoint(dir.path() / "hf", dir.path() / "back", {});
  EXPECT_EQ(imported.architecture, hf::architecture_class(hf::hf_architecture(config.model)));
  EXPECT_EQ(imported.tensors, exported.tensors);

  const auto original = testing::master_weights(checkpoint);
  const auto back = testing::master_weights(dir.path() / "back");
  ASSERT_EQ(original.size(), back.size());
  bool any_nonzero = false;
  for (const auto& [name, values] : original) {
    ASSERT_TRUE(back.contains(name)) << name;
    EXPECT_EQ(0, std::memcmp(values.data(), back.at(name).data(), values.size() * sizeof(float))) << name;
    for (const float v : values) any_nonzero |= v != 0.0f;
  }
  EXPECT_TRUE(any_nonzero);
  // model.safetensors of the export, the original checkpoint and the import: the same tensors.
  const auto a = testing::tensors_of(checkpoint / "model.safetensors");
  const auto b = testing::tensors_of(dir.path() / "hf" / "model.safetensors");
  const auto c = testing::tensors_of(dir.path() / "back" / "model.safetensors");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), c.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(exported_name(a[i].name, config.model), b[i].name);
    EXPECT_EQ(a[i].name, c[i].name);
    EXPECT_EQ(a[i].shape, b[i].shape);
    EXPECT_EQ(0, std::memcmp(a[i].values.data(), b[i].values.data(), a[i].values.size() * 4)) << a[i].name;
    EXPECT_EQ(0, std::memcmp(a[i].values.data(), c[i].values.data(), a[i].values.size() * 4)) << a[i].name;
  }
  // The imported checkpoint is a step-0 checkpoint of the same model, marked as imported, with zero moments.
  const nlohmann::json state = nlohmann::json::parse(testing::read_text(dir.path() / "back" / "state.json"));
  EXPECT_EQ(state["step"], 0);
  EXPECT_EQ(state["imported_from"]["format"], "huggingface");
  EXPECT_EQ(state["model"], nlohmann::json::parse(testing::read_text(checkpoint / "state.json"))["model"]);
  for (const io::SafetensorsTensor& t : io::read_safetensors(dir.path() / "back" / "optimizer.safetensors").tensors) {
    if (t.name.rfind("m.", 0) != 0 && t.name.rfind("v.", 0) != 0) continue;
    for (const float v : t.data) ASSERT_EQ(v, 0.0f) << t.name;
  }
  // config.toml beside it is a run configuration with the same [model].
  const RunConfig run = load_run_config(dir.path() / "back" / "config.toml");
  EXPECT_EQ(run.model.describe(), config.model.describe());
}

TEST(HuggingFaceRoundTrip, Gpt2ComesBackBitForBit) {
  expect_round_trip(testing::tiny_gpt2_run());
}

TEST(HuggingFaceRoundTrip, LlamaComesBackBitForBit) {
  expect_round_trip(testing::tiny_llama_run());
}

TEST(HuggingFaceRoundTrip, TiedLlamaComesBackBitForBit) {
  expect_round_trip(testing::tiny_llama_run(false, true));
}

TEST(HuggingFaceRoundTrip, LlamaWithRopeScalingKeepsItsDescription) {
  RunConfig config = testing::tiny_llama_run();
  config.model.rope_scaling = {8.0f, 1.0f, 4.0f, 8};
  expect_round_trip(config);
}

TEST(HuggingFaceRoundTrip, MixtralComesBackBitForBit) {
  const RunConfig config = testing::tiny_mixtral_run();
  ASSERT_TRUE(config.model.moe());
  expect_round_trip(config);
}

// The export of `config`'s random checkpoint in `dir`/hf.
fs::path exported(const RunConfig& config, const fs::path& dir) {
  const fs::path checkpoint = testing::save_random_checkpoint(config, dir / "run", 9);
  hf::export_checkpoint(checkpoint, dir / "hf", hf::ExportFormat::float32, false);
  return dir / "hf";
}

TEST(HuggingFaceImport, ShardsWithAnIndexGiveTheSameCheckpointAsOneFile) {
  ScratchDir dir;
  const fs::path hf_dir = exported(testing::tiny_llama_run(), dir.path());
  hf::import_checkpoint(hf_dir, dir.path() / "single", {});
  const std::vector<testing::RawTensor> tensors = testing::tensors_of(hf_dir / "model.safetensors");
  const fs::path sharded = dir.path() / "sharded";
  fs::create_directories(sharded);
  fs::copy_file(hf_dir / "config.json", sharded / "config.json");
  nlohmann::json map = nlohmann::json::object();
  std::vector<testing::RawTensor> first, second;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const bool in_first = i % 3 != 0;
    (in_first ? first : second).push_back(tensors[i]);
    map[tensors[i].name] = in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  testing::write_raw_safetensors(sharded / "model-00001-of-00002.safetensors", first);
  testing::write_raw_safetensors(sharded / "model-00002-of-00002.safetensors", second);
  io::write_file_atomically(sharded / "model.safetensors.index.json",
                            nlohmann::json{{"metadata", {{"total_size", 1}}}, {"weight_map", map}}.dump());
  hf::import_checkpoint(sharded, dir.path() / "from_shards", {});
  EXPECT_EQ(testing::master_weights(dir.path() / "single"), testing::master_weights(dir.path() / "from_shards"));
}

TEST(HuggingFaceImport, NarrowFloatsAreWidenedExactly) {
  for (const Dtype dtype : {Dtype::bf16, Dtype::f16}) {
    ScratchDir dir;
    const fs::path hf_dir = exported(testing::tiny_gpt2_run(), dir.path());
    std::vector<testing::RawTensor> tensors = testing::tensors_of(hf_dir / "model.safetensors", dtype);
    testing::write_raw_safetensors(hf_dir / "model.safetensors", tensors);
    hf::import_checkpoint(hf_dir, dir.path() / "back", {});
    const auto back = testing::tensors_of(dir.path() / "back" / "model.safetensors");
    ASSERT_EQ(back.size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      for (size_t k = 0; k < tensors[i].values.size(); ++k) {
        ASSERT_EQ(back[i].values[k], round_to(dtype, tensors[i].values[k])) << tensors[i].name << " " << k;
      }
    }
  }
}

TEST(HuggingFaceExport, Fp8HoldsOctetsE4m3CastsWithBlockScales) {
  ScratchDir dir;
  const RunConfig config = testing::tiny_llama_run(true);
  std::vector<float> params;
  const fs::path checkpoint = testing::save_random_checkpoint(config, dir.path() / "run", 3, &params);
  const hf::ExportSummary s = hf::export_checkpoint(checkpoint, dir.path() / "fp8", hf::ExportFormat::fp8, false);
  EXPECT_EQ(s.fp8_tensors, 7 * config.model.layers);

  const nlohmann::json json = nlohmann::json::parse(testing::read_text(dir.path() / "fp8" / "config.json"));
  EXPECT_EQ(json["quantization_config"]["quant_method"], "fp8");
  EXPECT_EQ(json["quantization_config"]["weight_block_size"], nlohmann::json::array({128, 128}));

  const io::SafetensorsFile file = io::read_safetensors(dir.path() / "fp8" / "model.safetensors", {true});
  const io::SafetensorsFile float32 = io::read_safetensors(checkpoint / "model.safetensors");
  int64_t e4m3 = 0;
  for (const io::SafetensorsTensor& original : float32.tensors) {
    const io::SafetensorsTensor* t = file.find(original.name);
    ASSERT_NE(t, nullptr) << original.name;
    EXPECT_EQ(t->shape, original.shape);
    const bool linear = original.name.find("_proj.weight") != std::string::npos;
    if (!linear) {
      EXPECT_EQ(t->stored, Dtype::f32) << t->name;
      EXPECT_EQ(t->data, original.data) << t->name;
      continue;
    }
    ++e4m3;
    EXPECT_EQ(t->stored, Dtype::e4m3) << t->name;
    const std::string scale_name = original.name.substr(0, original.name.size() - 6) + "weight_scale_inv";
    const io::SafetensorsTensor* scale = file.find(scale_name);
    ASSERT_NE(scale, nullptr) << scale_name;
    const int64_t rows = original.shape[0], cols = original.shape[1];
    EXPECT_EQ(scale->shape, (std::vector<int64_t>{rows / 128, cols / 128}));
    ScalingState unused;
    const QuantizedTensor q =
        quantize(original.data, rows, cols, Dtype::e4m3, TensorRole::weight, BlockScaling(), unused);
    EXPECT_EQ(scale->data, q.scale_inv) << scale_name;
    int64_t nonzero = 0;
    for (size_t i = 0; i < q.data.size(); ++i) {
      // The stored E4M3 value, widened, is the decoded octet code (E4M3 has no -0 in weights that matter:
      // compare the codes through their values and signs).
      ASSERT_EQ(encode(Dtype::e4m3, t->data[i]), q.data[i]) << t->name << " " << i;
      nonzero += q.data[i] != 0;
    }
    EXPECT_GT(nonzero, static_cast<int64_t>(q.data.size()) / 2) << t->name;
  }
  EXPECT_EQ(e4m3, 7 * config.model.layers);
}

TEST(HuggingFaceImport, MixtralInTransformers5FusedLayoutGivesTheSameCheckpoint) {
  ScratchDir dir;
  const RunConfig config = testing::tiny_mixtral_run();
  const fs::path hf_dir = exported(config, dir.path());
  hf::import_checkpoint(hf_dir, dir.path() / "classic", {});
  testing::write_raw_safetensors(
      hf_dir / "model.safetensors",
      testing::fuse_mixtral_experts(testing::tensors_of(hf_dir / "model.safetensors"), config.model));
  const hf::ImportSummary fused = hf::import_checkpoint(hf_dir, dir.path() / "fused", {});
  // Per layer: the router, gate_up_proj and down_proj for the 4 x 3 expert tensors.
  EXPECT_EQ(fused.tensors, static_cast<int64_t>(testing::tensors_of(hf_dir / "model.safetensors").size()));
  const auto classic_weights = testing::master_weights(dir.path() / "classic");
  EXPECT_EQ(classic_weights, testing::master_weights(dir.path() / "fused"));
  EXPECT_EQ(classic_weights,
            testing::master_weights(testing::save_random_checkpoint(config, dir.path() / "again", 9)));
}

// A Mixtral directory as transformers writes it, with every element of tensor number k (in the order
// written) k + index / 2^15, exact in float32 and unique to its tensor and place.
struct HandWrittenMixtral {
  static constexpr int64_t C = 64, F = 32, E = 4, L = 2, V = 300, KV = 32;
  std::vector<testing::RawTensor> tensors;

  const std::vector<float>& add(const std::string& name, std::vector<int64_t> shape) {
    int64_t count = 1;
    for (const int64_t d : shape) count *= d;
    std::vector<float> values(static_cast<size_t>(count));
    const float k = static_cast<float>(tensors.size());
    for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = k + static_cast<float>(i) / 32768.0f;
    tensors.push_back({name, Dtype::f32, std::move(shape), std::move(values)});
    return tensors.back().values;
  }

  HandWrittenMixtral() {
    add("model.embed_tokens.weight", {V, C});
    for (int64_t l = 0; l < L; ++l) {
      const std::string b = fmt::format("model.layers.{}.", l);
      add(b + "input_layernorm.weight", {C});
      add(b + "self_attn.q_proj.weight", {C, C});
      add(b + "self_attn.k_proj.weight", {KV, C});
      add(b + "self_attn.v_proj.weight", {KV, C});
      add(b + "self_attn.o_proj.weight", {C, C});
      add(b + "post_attention_layernorm.weight", {C});
      add(b + "block_sparse_moe.gate.weight", {E, C});
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = fmt::format("{}block_sparse_moe.experts.{}.", b, e);
        add(x + "w1.weight", {F, C});
        add(x + "w2.weight", {C, F});
        add(x + "w3.weight", {F, C});
      }
    }
    add("model.norm.weight", {C});
    add("lm_head.weight", {V, C});
  }

  const std::vector<float>& values(const std::string& name) const {
    for (const testing::RawTensor& t : tensors) {
      if (t.name == name) return t.values;
    }
    throw std::runtime_error("no tensor " + name);
  }

  // MixtralConfig's fields as transformers 4.x saves them, rope_theta left to Mixtral's default (1e6).
  static nlohmann::json config() {
    return nlohmann::json::parse(R"({
      "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 300, "hidden_size": 64,
      "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 16, "rms_norm_eps": 1e-05,
      "sliding_window": null, "tie_word_embeddings": false, "router_aux_loss_coef": 0.02,
      "output_router_logits": false, "router_jitter_noise": 0.0, "hidden_act": "silu", "attention_dropout": 0.0,
      "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16", "transformers_version": "4.57.1"})");
  }
};

TEST(HuggingFaceImport, HandWrittenMixtralLandsInTheExpertsItNames) {
  const HandWrittenMixtral hf;
  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "transformers 5's fused layout" : "classic layout");
    ScratchDir dir;
    ModelConfig shape;
    shape.arch = ModelArchitecture::llama;
    shape.channels = HandWrittenMixtral::C;
    shape.ffn_hidden = HandWrittenMixtral::F;
    shape.experts = HandWrittenMixtral::E;
    shape.layers = HandWrittenMixtral::L;
    testing::write_hf_directory(dir.path() / "hf", HandWrittenMixtral::config(),
                                fused ? testing::fuse_mixtral_experts(hf.tensors, shape) : hf.tensors);
    const hf::ImportSummary s = hf::import_checkpoint(dir.path() / "hf", dir.path() / "out", {});
    EXPECT_EQ(s.architecture, "MixtralForCausalLM");
    EXPECT_EQ(s.tensors, fused ? 3 + 9 * HandWrittenMixtral::L : static_cast<int64_t>(hf.tensors.size()));
    EXPECT_EQ(s.model.experts, 4);
    EXPECT_EQ(s.model.experts_per_token, 2);
    EXPECT_FALSE(s.model.shared_expert);
    EXPECT_EQ(s.model.hidden(), 32);
    EXPECT_EQ(s.model.kv(), 2);
    EXPECT_EQ(s.model.router_aux_loss_coef, 0.02f);
    EXPECT_EQ(s.model.rope_theta, 1e6f);
    EXPECT_FALSE(s.model.tied_head());

    const auto weights = testing::master_weights(dir.path() / "out");
    // Every expert projection holds the tensor of its own layer, expert and kind (w1 gate, w3 up, w2 down),
    // element for element; the router holds block_sparse_moe.gate.
    for (int64_t l = 0; l < HandWrittenMixtral::L; ++l) {
      EXPECT_EQ(weights.at(fmt::format("layers.{}.mlp.gate.weight", l)),
                hf.values(fmt::format("model.layers.{}.block_sparse_moe.gate.weight", l)));
      for (int64_t e = 0; e < HandWrittenMixtral::E; ++e) {
        for (const auto& [octet_name, mixtral_name] :
             {std::pair{"gate_proj", "w1"}, std::pair{"up_proj", "w3"}, std::pair{"down_proj", "w2"}}) {
          EXPECT_EQ(weights.at(fmt::format("layers.{}.mlp.experts.{}.{}.weight", l, e, octet_name)),
                    hf.values(fmt::format("model.layers.{}.block_sparse_moe.experts.{}.{}.weight", l, e,
                                          mixtral_name)))
              << l << " " << e << " " << octet_name;
        }
      }
    }
    // A few values spelled out: layer 1, expert 2's up projection (w3) starts at tensor number
    // 1 + 6 + 1 + 12 + 6 + 1 + 3 * 2 + 2 = 35; the last element of its down projection (w2, number 34) is
    // 34 + (32 * 64 - 1) / 2^15.
    const std::vector<float>& up = weights.at("layers.1.mlp.experts.2.up_proj.weight");
    EXPECT_EQ(up[0], 35.0f);
    EXPECT_EQ(up[1], 35.0f + 1.0f / 32768.0f);
    EXPECT_EQ(weights.at("layers.1.mlp.experts.2.down_proj.weight").back(), 34.0f + 2047.0f / 32768.0f);
    EXPECT_EQ(weights.at("layers.1.mlp.experts.2.gate_proj.weight")[5], 33.0f + 5.0f / 32768.0f);
    // The embedding's padded rows (300 to 320) are zero.
    const std::vector<float>& embedding = weights.at("embed_tokens.weight");
    ASSERT_EQ(embedding.size(), 320u * 64u);
    EXPECT_EQ(embedding[299 * 64 + 63], 0.0f + (299.0f * 64.0f + 63.0f) / 32768.0f);
    EXPECT_EQ(embedding[300 * 64], 0.0f);
  }
}

TEST(HuggingFaceConfig, MixtralTakesTransformersMixtralDefaultsAndWritesBack) {
  // MixtralConfig's defaults differ from LlamaConfig's: rms_norm_eps 1e-5 (octet's), 8 key/value heads,
  // rope_theta 1e6, router_aux_loss_coef 0.001.
  const hf::HfModelConfig parsed = hf::parse_config(R"({
      "architectures": ["MixtralForCausalLM"], "hidden_size": 256, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 16, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 300,
      "max_position_embeddings": 64})",
                                                    "config.json");
  EXPECT_EQ(parsed.architecture, hf::HfArchitecture::mixtral);
  EXPECT_EQ(parsed.model.kv(), 8);
  EXPECT_EQ(parsed.model.rope_theta, 1e6f);
  EXPECT_EQ(parsed.model.router_aux_loss_coef, 0.001f);
  EXPECT_EQ(parsed.model.experts, 8);
  EXPECT_FALSE(parsed.model.tied_head());
  EXPECT_FALSE(parsed.bos_token_id.has_value());
  // An explicit null means as many key/value heads as heads, in both transformers versions.
  EXPECT_EQ(hf::parse_config(R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 256,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": null,
      "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 300, "max_position_embeddings": 64})",
                             "config.json")
                .model.kv(),
            16);

  const nlohmann::json written = nlohmann::json::parse(hf::config_json(parsed.model, {}));
  EXPECT_EQ(written["architectures"], nlohmann::json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(written["model_type"], "mixtral");
  EXPECT_EQ(written["num_local_experts"], 8);
  EXPECT_EQ(written["num_experts_per_tok"], 2);
  EXPECT_EQ(written["intermediate_size"], 128);
  EXPECT_EQ(written["router_aux_loss_coef"], 0.001);
  EXPECT_EQ(written["output_router_logits"], false);
  EXPECT_TRUE(written["sliding_window"].is_null());
  EXPECT_TRUE(written["bos_token_id"].is_null());
  EXPECT_TRUE(written["eos_token_id"].is_null());
  EXPECT_FALSE(written.contains("mlp_bias"));
  const hf::HfModelConfig again = hf::parse_config(written.dump(), "written.json");
  EXPECT_EQ(again.model.describe(), parsed.model.describe());
}

TEST(HuggingFaceExport, Fp8MixtralConvertsTheExpertsAndAttentionButNotTheRouter) {
  ScratchDir dir;
  const RunConfig config = testing::tiny_mixtral_run(true);
  const fs::path checkpoint = testing::save_random_checkpoint(config, dir.path() / "run", 3);
  const hf::ExportSummary s =
      hf::export_checkpoint(checkpoint, dir.path() / "fp8", hf::ExportFormat::fp8, false);
  EXPECT_EQ(s.architecture, "MixtralForCausalLM");
  // q, k, v, o and each expert's w1, w3, w2.
  EXPECT_EQ(s.fp8_tensors, (4 + 3 * config.model.experts) * config.model.layers);

  const nlohmann::json json = nlohmann::json::parse(testing::read_text(dir.path() / "fp8" / "config.json"));
  EXPECT_EQ(json["architectures"], nlohmann::json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(json["quantization_config"]["quant_method"], "fp8");
  EXPECT_EQ(json["quantization_config"]["modules_to_not_convert"],
            nlohmann::json::array({"lm_head", "block_sparse_moe.gate", "mlp.gate"}));

  const io::SafetensorsFile file = io::read_safetensors(dir.path() / "fp8" / "model.safetensors", {true});
  const io::SafetensorsFile float32 = io::read_safetensors(checkpoint / "model.safetensors");
  for (const io::SafetensorsTensor& original : float32.tensors) {
    const std::string name = exported_name(original.name, config.model);
    const io::SafetensorsTensor* t = file.find(name);
    ASSERT_NE(t, nullptr) << name;
    const bool converted = name.find("_proj.weight") != std::string::npos ||
                           name.find(".block_sparse_moe.experts.") != std::string::npos;
    if (name.ends_with(".block_sparse_moe.gate.weight")) {
      // The router unconverted, in the BF16 that transformers' FP8 model computes in: each value rounded
      // to nearest even.
      EXPECT_EQ(t->stored, Dtype::bf16) << name;
      ASSERT_EQ(t->data.size(), original.data.size()) << name;
      for (size_t i = 0; i < t->data.size(); ++i) {
        ASSERT_EQ(t->data[i], decode(Dtype::bf16, encode(Dtype::bf16, original.data[i]))) << name << " " << i;
      }
      continue;
    }
    if (!converted) {
      EXPECT_EQ(t->stored, Dtype::f32) << name;
      EXPECT_EQ(t->data, original.data) << name;
      continue;
    }
    EXPECT_EQ(t->stored, Dtype::e4m3) << name;
    const int64_t rows = original.shape[0], cols = original.shape[1];
    ScalingState unused;
    const QuantizedTensor q =
        quantize(original.data, rows, cols, Dtype::e4m3, TensorRole::weight, BlockScaling(), unused);
    const io::SafetensorsTensor* scale = file.find(name.substr(0, name.size() - 6) + "weight_scale_inv");
    ASSERT_NE(scale, nullptr) << name;
    EXPECT_EQ(scale->data, q.scale_inv) << name;
    for (size_t i = 0; i < q.data.size(); ++i)
      ASSERT_EQ(encode(Dtype::e4m3, t->data[i]), q.data[i]) << name << " " << i;
  }
  EXPECT_EQ(file.find("model.layers.0.block_sparse_moe.gate.weight")->stored, Dtype::bf16);
  EXPECT_EQ(file.find("model.layers.0.block_sparse_moe.gate.weight_scale_inv"), nullptr);
}

}  // namespace
}  // namespace octet
