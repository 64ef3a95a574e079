// `octet import hf`: a Hugging Face model directory into an octet checkpoint at step 0 (see hf_convert.h).
#include <cmath>
#include <map>
#include <set>
#include <span>

#include <fmt/format.h>

#include "hf_tensor_map.h"
#include "octet/backend/cpu_backend.h"
#include "octet/check.h"
#include "octet/config/run_config.h"
#include "octet/huggingface/hf_config.h"
#include "octet/huggingface/hf_convert.h"
#include "octet/io/atomic_file.h"
#include "octet/io/input.h"
#include "octet/io/safetensors.h"
#include "octet/io/tokenizer.h"
#include "octet/model/model.h"
#include "octet/train/checkpoint.h"
#include "octet/train/trainer.h"
#include "staged_directory.h"

namespace octet::hf {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kMaxJsonBytes = int64_t{64} << 20;
constexpr int64_t kGpt2Vocabulary = 50257;
constexpr int64_t kLlama3Vocabulary = 128256;

// A tensor of the Hugging Face checkpoint and the file it came from.
struct SourceTensor {
  io::SafetensorsTensor tensor;
  fs::path file;
  bool used = false;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

void add_file(const fs::path& file, const std::map<std::string, std::string>* index, const fs::path& index_path,
              std::map<std::string, SourceTensor>& tensors) {
  io::SafetensorsFile read = io::read_safetensors(file, io::SafetensorsReadOptions{true});
  for (io::SafetensorsTensor& t : read.tensors) {
    OCTET_REQUIRE(t.stored != Dtype::e4m3,
                  "{}: tensor '{}' has dtype F8_E4M3; the import reads F32, BF16 and F16 (an FP8 checkpoint's "
                  "scales are not applied)",
                  file.string(), io::printable(t.name));
    if (index != nullptr) {
      const auto it = index->find(t.name);
      OCTET_REQUIRE(it != index->end() && it->second == file.filename().string(),
                    "{} holds tensor '{}', which {} {}", file.string(), io::printable(t.name),
                    index_path.string(),
                    it == index->end() ? std::string("does not list") : "places in " + io::printable(it->second));
    }
    OCTET_REQUIRE(!tensors.contains(t.name), "{}: tensor '{}' is also in {}", file.string(),
                  io::printable(t.name), tensors.at(t.name).file.string());
    const std::string name = t.name;
    tensors[name] = SourceTensor{std::move(t), file, false};
  }
}

// Every tensor of the checkpoint: model.safetensors, or the shards model.safetensors.index.json lists.
std::map<std::string, SourceTensor> read_tensors(const fs::path& dir) {
  std::map<std::string, SourceTensor> tensors;
  std::error_code ec;
  const fs::path single = dir / "model.safetensors";
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(single, ec)) {
    add_file(single, nullptr, {}, tensors);
    return tensors;
  }
  if (!fs::exists(index_path, ec)) {
    const bool pytorch = fs::exists(dir / "pytorch_model.bin", ec) || fs::exists(dir / "pytorch_model.bin.index.json", ec);
    OCTET_REQUIRE(false, "{} has neither model.safetensors nor model.safetensors.index.json{}", dir.string(),
                  pytorch ? " (pytorch_model.bin is not read: save the model with safe_serialization)" : "");
  }
  const std::map<std::string, std::string> index =
      parse_shard_index(io::read_regular_file(index_path, "safetensors index", kMaxJsonBytes), index_path.string());
  std::set<std::string> files;
  for (const auto& [tensor, file] : index) files.insert(file);
  for (const std::string& file : files) {
    OCTET_REQUIRE(fs::is_regular_file(dir / file, ec), "{} names {}, which is missing from {}",
                  index_path.string(), io::printable(file), dir.string());
  }
  for (const std::string& file : files) add_file(dir / file, &index, index_path, tensors);
  for (const auto& [tensor, file] : index) {
    OCTET_REQUIRE(tensors.contains(tensor), "{} places tensor '{}' in {}, which does not hold it",
                  index_path.string(), io::printable(tensor), io::printable(file));
  }
  return tensors;
}

// Tensors that transformers used to save although they are no parameters: GPT-2's causal mask buffers and
// Llama's rotary frequencies. Recomputed by every loader, so skipped.
bool is_buffer(const std::string& name, ModelArchitecture architecture) {
  auto ends_with = [&](std::string_view suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (architecture == ModelArchitecture::gpt2) return ends_with(".attn.bias") || ends_with(".attn.masked_bias");
  return ends_with(".rotary_emb.inv_freq");
}

std::string choose_tokenizer(const ImportOptions& options, const ModelConfig& model) {
  if (!options.tokenizer.empty()) {
    OCTET_REQUIRE(io::parse_tokenizer_kind(options.tokenizer).has_value(),
                  "--tokenizer '{}' is not a tokenizer octet knows; valid: {}", io::printable(options.tokenizer),
                  io::tokenizer_names());
    return options.tokenizer;
  }
  if (model.arch == ModelArchitecture::gpt2 && model.vocab_size == kGpt2Vocabulary) return "gpt2";
  if (model.arch == ModelArchitecture::llama && model.vocab_size == kLlama3Vocabulary) return "llama3";
  return "bytes";
}

// The run configuration the checkpoint stores: octet's defaults with the imported model, validated as a
// configuration file would be.
RunConfig import_config(const HfModelConfig& hf, const std::string& tokenizer, const fs::path& out,
                        const fs::path& config_path) {
  RunConfig config;
  config.model_arch = hf.model.arch;
  config.model = hf.model;
  config.tokenizer = tokenizer;
  config.train.seq_len = std::min(config.train.seq_len, hf.model.max_seq_len);
  config.run_dir = fs::path("runs") / (out.has_filename() ? out.filename() : out.parent_path().filename());
  try {
    return parse_run_config(to_toml(config), config_path.string());
  } catch (const Error& e) {
    OCTET_REQUIRE(false, "{}: the imported model cannot be trained by octet as configured: {}",
                  config_path.string(), e.what());
  }
  return config;
}

}  // namespace

ImportSummary import_checkpoint(const fs::path& hf_dir, const fs::path& out, const ImportOptions& options) {
  std::error_code ec;
  OCTET_REQUIRE(fs::is_directory(hf_dir, ec), "{} is not a directory (a Hugging Face model directory holds "
                "config.json and model.safetensors)", hf_dir.string());
  StagedDirectory staged(out, options.replace);  // checks the output before anything is read

  const fs::path config_path = hf_dir / "config.json";
  OCTET_REQUIRE(fs::exists(config_path, ec), "{} is missing", config_path.string());
  const HfModelConfig hf =
      parse_config(io::read_regular_file(config_path, "Hugging Face config", kMaxJsonBytes), config_path.string());
  ImportSummary summary;
  summary.architecture = std::string(architecture_class(hf.architecture));
  summary.tokenizer = choose_tokenizer(options, hf.model);
  const RunConfig config = import_config(hf, summary.tokenizer, out, config_path);
  summary.model = config.model;

  std::map<std::string, SourceTensor> tensors = read_tensors(hf_dir);
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::unique_ptr<Model> model =
      make_model(config.model, *backend, PrecisionPolicy(PrecisionSettings{}, config.model, 1), 1, 1);
  std::vector<float> params(static_cast<size_t>(model->parameter_count()), 0.0f);
  for (const ParameterInfo& p : model->parameters()) {
    const std::vector<TensorPlace> places = tensor_places(*model, p, config.model, hf.architecture);
    // The first place the checkpoint has a tensor for.
    const TensorPlace* place = nullptr;
    auto it = tensors.end();
    for (const TensorPlace& candidate : places) {
      it = tensors.find(candidate.tensor);
      // GPT2Model's own checkpoints (openai-community/gpt2) name the tensors without "transformer.".
      const std::string prefix = "transformer.";
      if (it == tensors.end() && candidate.tensor.rfind(prefix, 0) == 0) {
        it = tensors.find(candidate.tensor.substr(prefix.size()));
      }
      if (it != tensors.end()) {
        place = &candidate;
        break;
      }
    }
    if (place == nullptr) {
      std::string alternatives;
      for (size_t i = 1; i < places.size(); ++i) {
        alternatives += fmt::format(", as is '{}' {}, where transformers 5's layout would hold it",
                                    places[i].tensor, shape_text(places[i].shape));
      }
      OCTET_REQUIRE(false, "{}: tensor '{}' ({} {}) is missing{}", hf_dir.string(), places.front().tensor,
                    summary.architecture, shape_text(places.front().shape), alternatives);
    }
    SourceTensor& source = it->second;
    OCTET_REQUIRE(source.tensor.shape == place->shape,
                  "{}: tensor '{}' has shape {}; config.json's model needs {}", source.file.string(),
                  io::printable(it->first), shape_text(source.tensor.shape), shape_text(place->shape));
    const std::span<const float> values =
        std::span<const float>(source.tensor.data)
            .subspan(static_cast<size_t>(place->offset), static_cast<size_t>(place->count));
    for (size_t i = 0; i < values.size(); ++i) {
      OCTET_REQUIRE(std::isfinite(values[i]), "{}: tensor '{}' holds {} at index {}; weights must be finite",
                    source.file.string(), io::printable(it->first), values[i],
                    static_cast<size_t>(place->offset) + i);
    }
    model->from_hf(p, values, params);
    if (!source.used) ++summary.tensors;
    source.used = true;
  }
  int64_t buffers = 0;
  for (auto& [name, source] : tensors) {
    if (source.used) continue;
    if (is_buffer(name, hf.model.arch)) {
      ++buffers;
      continue;
    }
    if (name == "lm_head.weight" && config.model.tied_head()) {
      // A tied head saved anyway: it must be the embedding it stands for.
      const ParameterInfo* found = nullptr;
      for (const ParameterInfo& p : model->parameters()) {
        const std::string hf_name = model->hf_name(p);
        if (hf_name == "transformer.wte.weight" || hf_name == "model.embed_tokens.weight") found = &p;
      }
      OCTET_CHECK(found != nullptr, "a token embedding among the parameters of {}", summary.architecture);
      const ParameterInfo& embedding = *found;
      const std::vector<float> wte = model->to_hf(embedding, params);
      OCTET_REQUIRE(source.tensor.shape == model->hf_shape(embedding) && source.tensor.data == wte,
                    "{}: tensor 'lm_head.weight' differs from the token embedding, but config.json ties them "
                    "(tie_word_embeddings)",
                    source.file.string());
      summary.notes.push_back("lm_head.weight is the tied token embedding: skipped");
      continue;
    }
    OCTET_REQUIRE(false, "{}: tensor '{}' is not a parameter of {} with this config.json", source.file.string(),
                  io::printable(name), summary.architecture);
  }
  if (buffers > 0) summary.notes.push_back(fmt::format("skipped {} buffer tensors (attention masks, rotary frequencies)", buffers));
  tensors.clear();
  backend->copy_from_host(model->params(), params.data(), params.size() * sizeof(float));

  TrainSettings settings = config.train;
  settings.batch_size = 1;
  settings.seq_len = 1;
  Trainer trainer(*model, settings);
  TrainingProgress progress;
  progress.seed = config.seed;
  progress.config = to_toml(config);
  progress.imported_from = {{"format", "huggingface"},
                            {"architecture", summary.architecture},
                            {"source", fs::absolute(hf_dir).lexically_normal().string()}};
  progress.tokenizer_dir = training_tokenizer_files(summary.tokenizer, {});
  if (summary.tokenizer != "bytes" && progress.tokenizer_dir.empty()) {
    summary.notes.push_back(fmt::format("the {} tokenizer's files were not found (scripts/fetch_tokenizer.sh): "
                                        "the checkpoint holds none",
                                        summary.tokenizer));
  }

  // Everything is read and valid: write.
  const fs::path& temporary = staged.create();
  const fs::path saved = save_checkpoint(temporary / "run", *model, trainer, progress, CheckpointOptions{1, {}});
  for (const fs::directory_entry& e : fs::directory_iterator(saved)) {
    fs::rename(e.path(), temporary / e.path().filename(), ec);
    OCTET_REQUIRE(!ec, "cannot move {} into {}: {}", e.path().string(), temporary.string(), ec.message());
  }
  fs::remove_all(temporary / "run", ec);
  io::write_file_atomically(temporary / "config.toml", progress.config);
  staged.commit();
  return summary;
}

}  // namespace octet::hf
