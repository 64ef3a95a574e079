// The Hugging Face commands as a user runs them: `octet import hf`, `octet export` and `octet train
// --init-from` through the built binary, for GPT-2, Llama and Mixtral. Every refusal exits with 2, says what
// is wrong and where in one line, and writes nothing; the exported files read in Python (when
// /usr/bin/python3 has torch) have the names, shapes and dtypes of transformers' state dicts.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>

#include <gtest/gtest.h>

#include "../checkpoint/checkpoint_fixture.h"
#include "files.h"
#include "hf_fixture.h"
#include "octet/huggingface/hf_convert.h"
#include "process.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ScratchDir;

// A valid Hugging Face Llama directory (the export of a random tiny checkpoint) at dir/hf.
fs::path llama_directory(const fs::path& dir, const RunConfig& config = testing::tiny_llama_run()) {
  const fs::path checkpoint = testing::save_random_checkpoint(config, dir / "run", 7);
  hf::export_checkpoint(checkpoint, dir / "hf", hf::ExportFormat::float32, false);
  return dir / "hf";
}

json config_of(const fs::path& hf_dir) {
  return json::parse(testing::read_text(hf_dir / "config.json"));
}

void write_config(const fs::path& hf_dir, const json& config) {
  io::write_file_atomically(hf_dir / "config.json", config.dump());
}

// A refusal: exit code 2, one line on stderr holding `expected`, nothing on stdout, nothing written.
void expect_refused(const std::vector<std::string>& args, const std::string& expected, const fs::path& watched) {
  const auto before = testing::directory_snapshot(watched);
  const testing::ProcessResult r = testing::run_octet(args);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(expected), std::string::npos) << "expected '" << expected << "' in: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_EQ(before, testing::directory_snapshot(watched)) << "a refused command wrote into " << watched;
}

struct ImportCase {
  const char* name;
  std::function<void(const fs::path& hf_dir)> damage;
  const char* expected;
};

TEST(HuggingFaceCommands, ImportRefusesEveryBadInputWithExitCode2AndWritesNothing) {
  auto set = [](const char* key, json value) {
    return [key, value](const fs::path& d) {
      json c = config_of(d);
      c[key] = value;
      write_config(d, c);
    };
  };
  auto erase = [](const char* key) {
    return [key](const fs::path& d) {
      json c = config_of(d);
      c.erase(key);
      write_config(d, c);
    };
  };
  auto edit_tensors = [](std::function<void(std::vector<testing::RawTensor>&)> edit) {
    return [edit](const fs::path& d) {
      std::vector<testing::RawTensor> t = testing::tensors_of(d / "model.safetensors");
      edit(t);
      testing::write_raw_safetensors(d / "model.safetensors", t);
    };
  };
  auto find = [](std::vector<testing::RawTensor>& t, const std::string& name) -> testing::RawTensor& {
    for (testing::RawTensor& x : t) {
      if (x.name == name) return x;
    }
    throw std::runtime_error("no tensor " + name);
  };
  const std::vector<ImportCase> cases = {
      {"missing config", [](const fs::path& d) { fs::remove(d / "config.json"); }, "config.json is missing"},
      {"bad JSON", [](const fs::path& d) { io::write_file_atomically(d / "config.json", "{\"architectures\": ["); },
       "not valid JSON"},
      {"unknown architecture", set("architectures", json::array({"MistralForCausalLM"})), "is not one octet builds"},
      {"missing shape field", erase("num_hidden_layers"), "\"num_hidden_layers\" is missing"},
      {"rms_norm_eps", set("rms_norm_eps", 1e-6), "\"rms_norm_eps\" is 1e-06"},
      {"absent rms_norm_eps", erase("rms_norm_eps"), "\"rms_norm_eps\" is missing"},
      {"hidden_act", set("hidden_act", "gelu"), "\"hidden_act\" is \"gelu\""},
      {"attention_bias", set("attention_bias", true), "\"attention_bias\" is true"},
      {"mlp_bias", set("mlp_bias", true), "\"mlp_bias\" is true"},
      {"rope type", set("rope_parameters", json{{"rope_type", "yarn"}, {"factor", 4.0}}), "rope scaling of type \"yarn\""},
      {"no weights", [](const fs::path& d) { fs::remove(d / "model.safetensors"); }, "has neither model.safetensors"},
      {"missing tensor",
       edit_tensors([](std::vector<testing::RawTensor>& t) {
         std::erase_if(t, [](const testing::RawTensor& x) { return x.name == "model.norm.weight"; });
       }),
       "tensor 'model.norm.weight' (LlamaForCausalLM [64]) is missing"},
      {"extra tensor",
       edit_tensors([](std::vector<testing::RawTensor>& t) { t.push_back({"model.extra.weight", Dtype::f32, {2}, {1, 2}}); }),
       "tensor 'model.extra.weight' is not a parameter of LlamaForCausalLM"},
      {"mis-shaped tensor",
       edit_tensors([&](std::vector<testing::RawTensor>& t) {
         find(t, "model.layers.0.self_attn.q_proj.weight").shape = {32, 128};
       }),
       "tensor 'model.layers.0.self_attn.q_proj.weight' has shape [32, 128]; config.json's model needs [64, 64]"},
      {"non-finite value",
       edit_tensors([&](std::vector<testing::RawTensor>& t) {
         find(t, "model.layers.1.mlp.up_proj.weight").values[17] = NAN;
       }),
       "tensor 'model.layers.1.mlp.up_proj.weight' holds nan at index 17; weights must be finite"},
      {"unsupported dtype",
       [](const fs::path& d) {
         const std::string header = R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
         std::string bytes(8, '\0');
         bytes[0] = static_cast<char>(header.size());
         io::write_file_atomically(d / "model.safetensors", bytes + header + std::string(8, '\0'));
       },
       "has dtype F64; octet reads only F32, BF16, F16 and F8_E4M3"},
      {"index names a missing shard",
       [](const fs::path& d) {
         fs::rename(d / "model.safetensors", d / "model-00001-of-00002.safetensors");
         json map = json::object();
         for (const auto& t : testing::tensors_of(d / "model-00001-of-00002.safetensors"))
           map[t.name] = "model-00001-of-00002.safetensors";
         map["model.norm.weight"] = "model-00002-of-00002.safetensors";
         io::write_file_atomically(d / "model.safetensors.index.json", json{{"weight_map", map}}.dump());
       },
       "names model-00002-of-00002.safetensors, which is missing"},
      {"index names a path", [](const fs::path& d) {
         fs::remove(d / "model.safetensors");
         io::write_file_atomically(d / "model.safetensors.index.json",
                                   R"({"weight_map": {"a": "../elsewhere.safetensors"}})");
       },
       "which is not a file name in the same directory"},
  };
  for (const ImportCase& c : cases) {
    SCOPED_TRACE(c.name);
    ScratchDir dir;
    const fs::path hf_dir = llama_directory(dir.path());
    c.damage(hf_dir);
    expect_refused({"import", "hf", hf_dir.string(), "--out", (dir.path() / "out").string()}, c.expected, dir.path());
  }
}

TEST(HuggingFaceCommands, ImportRefusesAMixtralItCannotRepresentWithExitCode2AndWritesNothing) {
  const RunConfig config = testing::tiny_mixtral_run();
  auto set = [](const char* key, json value) {
    return [key, value](const fs::path& d) {
      json c = config_of(d);
      c[key] = value;
      write_config(d, c);
    };
  };
  auto erase = [](const char* key) {
    return [key](const fs::path& d) {
      json c = config_of(d);
      c.erase(key);
      write_config(d, c);
    };
  };
  // Edits the tensors, in the classic layout or in transformers 5's fused one.
  auto edit_tensors = [&](bool fused, std::function<void(std::vector<testing::RawTensor>&)> edit) {
    return [&config, fused, edit](const fs::path& d) {
      std::vector<testing::RawTensor> t = testing::tensors_of(d / "model.safetensors");
      if (fused) t = testing::fuse_mixtral_experts(t, config.model);
      edit(t);
      testing::write_raw_safetensors(d / "model.safetensors", t);
    };
  };
  auto erase_tensor = [](const std::string& name) {
    return [name](std::vector<testing::RawTensor>& t) {
      const size_t before = t.size();
      std::erase_if(t, [&](const testing::RawTensor& x) { return x.name == name; });
      if (t.size() == before) throw std::runtime_error("no tensor " + name);
    };
  };
  auto reshape_tensor = [](const std::string& name, std::vector<int64_t> shape) {
    return [name, shape](std::vector<testing::RawTensor>& t) {
      for (testing::RawTensor& x : t) {
        if (x.name == name) x.shape = shape;
      }
    };
  };
  const std::vector<ImportCase> cases = {
      {"sliding window", set("sliding_window", 4096),
       "\"sliding_window\" is 4096; octet's attention is not windowed (it must be null)"},
      {"router jitter", set("router_jitter_noise", 0.01), "\"router_jitter_noise\" is 0.01"},
      {"no expert count", erase("num_local_experts"), "\"num_local_experts\" is missing"},
      {"more experts per token than experts", set("num_experts_per_tok", 5),
       "model.experts_per_token (5) must be between 1 and model.experts (4)"},
      {"rms_norm_eps", set("rms_norm_eps", 1e-6), "\"rms_norm_eps\" is 1e-06"},
      {"rope type", set("rope_parameters", json{{"rope_type", "yarn"}, {"factor", 4.0}}),
       "rope scaling of type \"yarn\""},
      {"model_type", set("model_type", "llama"),
       "\"model_type\" is \"llama\" but the architecture is MixtralForCausalLM"},
      {"missing expert tensor",
       edit_tensors(false, erase_tensor("model.layers.1.block_sparse_moe.experts.3.w2.weight")),
       "tensor 'model.layers.1.block_sparse_moe.experts.3.w2.weight' (MixtralForCausalLM [64, 32]) is "
       "missing, as is 'model.layers.1.mlp.experts.down_proj' [4, 64, 32], where transformers 5's layout would "
       "hold it"},
      {"missing router", edit_tensors(false, erase_tensor("model.layers.0.block_sparse_moe.gate.weight")),
       "tensor 'model.layers.0.block_sparse_moe.gate.weight' (MixtralForCausalLM [4, 64]) is missing, as is "
       "'model.layers.0.mlp.gate.weight' [4, 64]"},
      {"mis-shaped expert",
       edit_tensors(false, reshape_tensor("model.layers.0.block_sparse_moe.experts.2.w1.weight", {64, 32})),
       "tensor 'model.layers.0.block_sparse_moe.experts.2.w1.weight' has shape [64, 32]; config.json's model "
       "needs [32, 64]"},
      {"mis-shaped router",
       edit_tensors(false, reshape_tensor("model.layers.1.block_sparse_moe.gate.weight", {2, 128})),
       "tensor 'model.layers.1.block_sparse_moe.gate.weight' has shape [2, 128]; config.json's model needs "
       "[4, 64]"},
      {"missing fused experts", edit_tensors(true, erase_tensor("model.layers.0.mlp.experts.gate_up_proj")),
       "tensor 'model.layers.0.block_sparse_moe.experts.0.w1.weight' (MixtralForCausalLM [32, 64]) is "
       "missing, as is 'model.layers.0.mlp.experts.gate_up_proj' [4, 64, 64]"},
      {"mis-shaped fused experts",
       edit_tensors(true, reshape_tensor("model.layers.1.mlp.experts.gate_up_proj", {4, 32, 128})),
       "tensor 'model.layers.1.mlp.experts.gate_up_proj' has shape [4, 32, 128]; config.json's model needs "
       "[4, 64, 64]"},
      {"transposed fused experts",
       edit_tensors(true, reshape_tensor("model.layers.0.mlp.experts.down_proj", {4, 32, 64})),
       "tensor 'model.layers.0.mlp.experts.down_proj' has shape [4, 32, 64]; config.json's model needs "
       "[4, 64, 32]"},
      {"both layouts",
       [&](const fs::path& d) {
         std::vector<testing::RawTensor> t = testing::tensors_of(d / "model.safetensors");
         for (const testing::RawTensor& x : testing::fuse_mixtral_experts(t, config.model)) {
           if (x.name == "model.layers.1.mlp.experts.down_proj") t.push_back(x);
         }
         testing::write_raw_safetensors(d / "model.safetensors", t);
       },
       "tensor 'model.layers.1.mlp.experts.down_proj' is not a parameter of MixtralForCausalLM"},
      {"non-finite expert value",
       edit_tensors(true,
                    [](std::vector<testing::RawTensor>& t) {
                      for (testing::RawTensor& x : t) {
                        if (x.name == "model.layers.0.mlp.experts.down_proj")
                          x.values[3 * 64 * 32 + 5] = INFINITY;
                      }
                    }),
       "tensor 'model.layers.0.mlp.experts.down_proj' holds inf at index 6149; weights must be finite"},
  };
  for (const ImportCase& c : cases) {
    SCOPED_TRACE(c.name);
    ScratchDir dir;
    const fs::path hf_dir = llama_directory(dir.path(), config);
    c.damage(hf_dir);
    expect_refused({"import", "hf", hf_dir.string(), "--out", (dir.path() / "out").string()}, c.expected,
                   dir.path());
  }
}

TEST(HuggingFaceCommands, ImportRefusesAGpt2ItCannotComputeAlike) {
  ScratchDir dir;
  const fs::path checkpoint = testing::save_random_checkpoint(testing::tiny_gpt2_run(), dir.path() / "run", 7);
  hf::export_checkpoint(checkpoint, dir.path() / "hf", hf::ExportFormat::float32, false);
  for (const auto& [key, value, expected] :
       {std::tuple{"activation_function", json("relu"), "\"activation_function\" is \"relu\""},
        std::tuple{"layer_norm_epsilon", json(1e-6), "\"layer_norm_epsilon\" is 1e-06"},
        std::tuple{"n_inner", json(100), "\"n_inner\" must be null or 4 n_embd"}}) {
    SCOPED_TRACE(key);
    json c = config_of(dir.path() / "hf");
    const json saved = c;
    c[key] = value;
    write_config(dir.path() / "hf", c);
    expect_refused({"import", "hf", (dir.path() / "hf").string(), "--out", (dir.path() / "out").string()}, expected,
                   dir.path());
    write_config(dir.path() / "hf", saved);
  }
}

TEST(HuggingFaceCommands, AnOutputThatHoldsFilesIsReplacedOnlyWithForce) {
  ScratchDir dir;
  const fs::path hf_dir = llama_directory(dir.path());
  const fs::path out = dir.path() / "out";
  fs::create_directories(out);
  io::write_file_atomically(out / "keep.txt", "mine");
  expect_refused({"import", "hf", hf_dir.string(), "--out", out.string()}, "exists and is not empty; give --force",
                 dir.path());
  expect_refused({"export", (dir.path() / "run").string(), "--format", "hf", "--out", out.string()},
                 "exists and is not empty; give --force", dir.path());
  const testing::ProcessResult r = testing::run_octet({"import", "hf", hf_dir.string(), "--out", out.string(), "--force"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(out / "keep.txt"));
  EXPECT_TRUE(fs::exists(out / "state.json"));
  // No temporary directory is left beside it.
  for (const fs::directory_entry& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().rfind(".octet-", 0), std::string::npos) << e.path();
}

TEST(HuggingFaceCommands, ExportRefusesWhatItCannotWrite) {
  ScratchDir dir;
  testing::save_random_checkpoint(testing::tiny_gpt2_run(), dir.path() / "gpt2", 1);
  testing::save_random_checkpoint(testing::tiny_llama_run(), dir.path() / "llama", 1);
  const std::string out = (dir.path() / "out").string();
  expect_refused({"export", (dir.path() / "gpt2").string(), "--format", "onnx", "--out", out},
                 "--format 'onnx' is not one octet writes", dir.path());
  expect_refused({"export", (dir.path() / "gpt2").string(), "--format", "hf-fp8", "--out", out},
                 "--format hf-fp8 exports Llama and Mixtral models", dir.path());
  expect_refused({"export", (dir.path() / "llama").string(), "--format", "hf-fp8", "--out", out},
                 "need both dimensions to be multiples of the 128 x 128 block", dir.path());
  expect_refused({"export", (dir.path() / "nothing").string(), "--format", "hf", "--out", out}, "CHECKPOINT:",
                 dir.path());
  // Mixtral has no shared expert: a mixture of experts with one has no Hugging Face class to go to.
  testing::save_random_checkpoint(testing::tiny_mixtral_run(true, true), dir.path() / "shared", 1);
  for (const char* format : {"hf", "hf-fp8"}) {
    expect_refused(
        {"export", (dir.path() / "shared").string(), "--format", format, "--out", out},
        "holds a mixture of experts with a shared expert (model.shared_expert); octet exports mixtures of "
        "experts as MixtralForCausalLM, which has no shared expert",
        dir.path());
  }
  testing::save_random_checkpoint(testing::tiny_mixtral_run(), dir.path() / "mixtral", 1);
  expect_refused(
      {"export", (dir.path() / "mixtral").string(), "--format", "hf-fp8", "--out", out},
      "model.layers.0.self_attn.q_proj.weight is [64, 64]; transformers' FP8 layers need both dimensions",
      dir.path());
}

// A run that used the Llama 3 tokenizer exports transformers' tokenizer files for it (tokenizer.json,
// tokenizer_config.json, special_tokens_map.json) in place of llama3.tiktoken; a damaged llama3.tiktoken is
// refused before anything is written. tests/io/test_llama3_tokenizer_json.cpp checks what the files encode.
TEST(HuggingFaceCommands, ExportOfALlama3RunWritesItsTokenizerJson) {
  ScratchDir dir;
  RunConfig config = testing::tiny_llama_run(false, true);
  config.model.vocab_size = 128256;
  config.model.heads = 2;
  config.model.channels = 16;
  config.model.ffn_hidden = 32;
  config.tokenizer = "llama3";
  const fs::path checkpoint =
      testing::save_random_checkpoint(parse_run_config(to_toml(config), "llama3"), dir.path() / "run", 3);
  const std::string out = (dir.path() / "out").string();
  io::write_file_atomically(checkpoint / "llama3.tiktoken", "IQ== 0\nIg==1\n");
  expect_refused({"export", checkpoint.string(), "--format", "hf", "--out", out},
                 (checkpoint / "llama3.tiktoken").string() + " line 2", dir.path());

  const char* data_env = std::getenv("OCTET_DATA_DIR");
  const fs::path vocabulary =
      fs::path(data_env != nullptr && *data_env != '\0' ? data_env : OCTET_SOURCE_DIR "/.cache/data") /
      "llama3";
  if (!fs::is_regular_file(vocabulary / "llama3.tiktoken"))
    GTEST_SKIP() << "Llama 3's vocabulary is not in " << vocabulary << " (run scripts/fetch_tokenizer.sh)";
  fs::copy_file(vocabulary / "llama3.tiktoken", checkpoint / "llama3.tiktoken",
                fs::copy_options::overwrite_existing);
  const testing::ProcessResult r =
      testing::run_octet({"export", checkpoint.string(), "--format", "hf", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(out))
    files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"config.json", "model.safetensors", "special_tokens_map.json",
                                             "tokenizer.json", "tokenizer_config.json"}));
  const json tokenizer = json::parse(testing::read_text(fs::path(out) / "tokenizer.json"));
  EXPECT_EQ(tokenizer.at("model").at("vocab").size(), 128000u);
  EXPECT_EQ(tokenizer.at("model").at("merges").size(), 280147u);
  EXPECT_EQ(tokenizer.at("added_tokens").size(), 256u);
  const json tokenizer_config = json::parse(testing::read_text(fs::path(out) / "tokenizer_config.json"));
  EXPECT_EQ(tokenizer_config.at("model_max_length"), config.model.max_seq_len);
  EXPECT_EQ(config_of(out).at("bos_token_id"), 128000);
  EXPECT_EQ(config_of(out).at("eos_token_id"), 128001);
}

TEST(HuggingFaceCommands, ImportThenTrainWithInitFromStartsFromTheImportedWeights) {
  ScratchDir dir;
  const fs::path hf_dir = llama_directory(dir.path());
  const fs::path imported = dir.path() / "imported";
  testing::ProcessResult r = testing::run_octet({"import", "hf", hf_dir.string(), "--out", imported.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("LlamaForCausalLM"), std::string::npos) << r.out;

  const fs::path data = dir.path() / "data";
  fs::create_directories(data);
  testing::write_pattern_shard(data, 300);
  fs::copy_file(data / "train_000000.bin", data / "val_000000.bin");
  const std::vector<std::string> train = {"train",
                                          (imported / "config.toml").string(),
                                          "--init-from",
                                          imported.string(),
                                          "--set",
                                          "data.dir=" + data.string(),
                                          "--set",
                                          "train.steps=1",
                                          "--set",
                                          "train.batch_size=2",
                                          "--set",
                                          "train.seq_len=16",
                                          "--set",
                                          "data.eval_batches=1",
                                          "--set",
                                          "telemetry.enabled=false"};
  // A run whose [model] differs is refused, naming the key.
  std::vector<std::string> other = train;
  other.insert(other.end(), {"--set", "model.layers=3", "--set", "logging.run_dir=" + (dir.path() / "other").string()});
  expect_refused(other, "the checkpoint's model has num_hidden_layers 2, this model has 3", dir.path());

  std::vector<std::string> same = train;
  same.insert(same.end(), {"--set", "logging.run_dir=" + (dir.path() / "run2").string()});
  r = testing::run_octet(same);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("initialised from the weights of " + imported.string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("imported from"), std::string::npos) << r.out;
}

TEST(HuggingFaceCommands, ExportedFilesHaveTransformersNamesShapesAndDtypesInPython) {
  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with torch is not available";
  }
  ScratchDir dir;
  const fs::path gpt2 = testing::save_random_checkpoint(testing::tiny_gpt2_run(), dir.path() / "gpt2", 2);
  const fs::path llama = testing::save_random_checkpoint(testing::tiny_llama_run(true), dir.path() / "llama", 2);
  hf::export_checkpoint(gpt2, dir.path() / "gpt2-hf", hf::ExportFormat::float32, false);
  hf::export_checkpoint(llama, dir.path() / "llama-hf", hf::ExportFormat::float32, false);
  hf::export_checkpoint(llama, dir.path() / "llama-fp8", hf::ExportFormat::fp8, false);
  const fs::path mixtral =
      testing::save_random_checkpoint(testing::tiny_mixtral_run(true), dir.path() / "mixtral", 2);
  hf::export_checkpoint(mixtral, dir.path() / "mixtral-hf", hf::ExportFormat::float32, false);
  hf::export_checkpoint(mixtral, dir.path() / "mixtral-fp8", hf::ExportFormat::fp8, false);
  for (const char* name : {"gpt2-hf", "llama-hf", "llama-fp8", "mixtral-hf", "mixtral-fp8"}) {
    const std::string command = fmt::format("/usr/bin/python3 {}/check_hf_export.py {}", OCTET_HF_TEST_SOURCE_DIR,
                                            (dir.path() / name).string());
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
  }
}

}  // namespace
}  // namespace octet
