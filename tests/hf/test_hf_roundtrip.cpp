// Export to Hugging Face's layout and import back: tiny GPT-2 and Llama models come back bit for bit, from one
// file or from shards, from BF16 and F16 as their widened values; the FP8 export holds octet's own E4M3 casts
// with their block scales in transformers' fine-grained FP8 layout.
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
  EXPECT_EQ(imported.architecture, hf::architecture_class(config.model.arch));
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
    EXPECT_EQ(a[i].name, b[i].name);
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

}  // namespace
}  // namespace octet
