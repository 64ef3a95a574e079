// Fuzzing the Hugging Face readers: mutated config.json texts (GPT-2, Llama and Mixtral, as octet writes them
// and as transformers 4 and 5 write them) and mutated shard indexes. Every case ends in a result or one clean
// refusal; an accepted config.json writes back (config_json) to a text that parses to the same model.
#include <cstdlib>
#include <fstream>

#include <gtest/gtest.h>

#include "fuzz_harness.h"
#include "octet/check.h"
#include "octet/huggingface/hf_config.h"

namespace octet {
namespace {

std::vector<std::string> config_corpus() {
  ModelConfig llama;
  llama.arch = ModelArchitecture::llama;
  llama.kv_heads = 4;
  llama.ffn_hidden = 2048;
  llama.rope_scaling = {8.0f, 1.0f, 4.0f, 8192};
  ModelConfig mixtral = llama;
  mixtral.rope_scaling = {};
  mixtral.experts = 8;
  mixtral.experts_per_token = 2;
  mixtral.router_aux_loss_coef = 0.02f;
  return {
      hf::config_json(ModelConfig{}, {50256, 50256}),
      hf::config_json(llama, {128000, 128001}),
      hf::config_json(mixtral, {}),
      R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 256,
          "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8,
          "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 4096,
          "rms_norm_eps": 1e-05, "sliding_window": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
          "router_jitter_noise": 0.0, "output_router_logits": false, "bos_token_id": 1, "eos_token_id": 2,
          "torch_dtype": "bfloat16", "transformers_version": "4.57.1"})",
      R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 256,
          "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8, "num_local_experts": 4,
          "num_experts_per_tok": 1, "vocab_size": 512, "max_position_embeddings": 128, "head_dim": 32,
          "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "dtype": "float32",
          "transformers_version": "5.0.0"})",
      R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
          "max_position_embeddings": 128, "rms_norm_eps": 1e-05, "hidden_act": "silu", "tie_word_embeddings": false,
          "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "eos_token_id": [128001, 128009],
          "dtype": "float32", "transformers_version": "5.0.0"})",
      R"({"architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_head": 4, "n_embd": 128, "vocab_size": 512,
          "n_positions": 128, "n_inner": null, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05})",
  };
}

std::vector<std::string> index_corpus() {
  return {
      R"({"metadata": {"total_size": 1024}, "weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors",
          "lm_head.weight": "model-00002-of-00002.safetensors"}})",
      R"({"weight_map": {"a": "x.safetensors"}})",
  };
}

bool replaying() {
  return std::getenv("OCTET_FUZZ_CASE") != nullptr;
}

void parse_and_write_back(const std::string& text) {
  const hf::HfModelConfig parsed = hf::parse_config(text, "config.json");
  const std::string written = hf::config_json(parsed.model, {parsed.bos_token_id, parsed.eos_token_id});
  hf::HfModelConfig again;
  try {
    again = hf::parse_config(written, "written.json");
  } catch (const Error& e) {
    throw fuzz::PropertyFailure{std::string("config_json's output does not parse: ") + e.what()};
  }
  if (again.model.describe() != parsed.model.describe() || again.model.tied_head() != parsed.model.tied_head() ||
      again.model.rope_scaling.factor != parsed.model.rope_scaling.factor) {
    throw fuzz::PropertyFailure{"config_json's output parses to another model"};
  }
}

TEST(FuzzHuggingFace, MutatedConfigsParseOrAreRefusedCleanly) {
  const std::vector<std::string> corpus = config_corpus();
  for (const std::string& text : corpus) ASSERT_NO_THROW(parse_and_write_back(text)) << text;
  fuzz::Campaign campaign;
  campaign.seed = fuzz::seed_from_environment(20261127);
  const int cases = fuzz::scaled_cases(4000);
  for (int i = 0; i < cases; ++i) {
    if (!fuzz::selected(i)) continue;
    std::mt19937_64 rng = fuzz::case_rng(campaign.seed, i);
    const std::string text = fuzz::mutate(corpus[rng() % corpus.size()], corpus, rng);
    if (replaying()) std::ofstream("fuzz-case.json", std::ios::binary) << text;
    campaign.record(i, fuzz::run_case([&] { parse_and_write_back(text); }));
  }
  std::printf("%s\n", campaign.summary().c_str());
  EXPECT_TRUE(campaign.failures.empty()) << campaign.summary();
  if (!replaying()) {
    EXPECT_GT(campaign.refused, 0);
    EXPECT_GT(campaign.accepted, 0);
  }
}

TEST(FuzzHuggingFace, MutatedShardIndexesParseOrAreRefusedCleanly) {
  const std::vector<std::string> corpus = index_corpus();
  fuzz::Campaign campaign;
  campaign.seed = fuzz::seed_from_environment(20261128);
  const int cases = fuzz::scaled_cases(3000);
  for (int i = 0; i < cases; ++i) {
    if (!fuzz::selected(i)) continue;
    std::mt19937_64 rng = fuzz::case_rng(campaign.seed, i);
    const std::string text = fuzz::mutate(corpus[rng() % corpus.size()], corpus, rng);
    campaign.record(i, fuzz::run_case([&] {
                      for (const auto& [tensor, file] : hf::parse_shard_index(text, "index.json")) {
                        if (file.empty() || file.find('/') != std::string::npos || file == "..")
                          throw fuzz::PropertyFailure{"a file that is no plain name was accepted"};
                      }
                    }));
  }
  std::printf("%s\n", campaign.summary().c_str());
  EXPECT_TRUE(campaign.failures.empty()) << campaign.summary();
}

}  // namespace
}  // namespace octet
