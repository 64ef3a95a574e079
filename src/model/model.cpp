// The model factory, and the words and JSON of what a model's ops fuse.
#include "octet/model/model.h"

#include <utility>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/model/decoder.h"

namespace octet {

std::unique_ptr<Model> make_model(const ModelConfig& shape, Backend& backend, PrecisionPolicy policy,
                                  int64_t max_batch, int64_t max_seq_len) {
  return std::make_unique<Decoder>(shape, backend, std::move(policy), max_batch, max_seq_len);
}

std::string fusion_summary(const FusionRecord& record) {
  auto answer = [](const FusionSupport& s) {
    return s.fused ? std::string("fused") : "not fused: " + s.fallback;
  };
  std::string out = record.producer + ", " + answer(record.support);
  if (record.on_sqnr_steps) out += "; on steps that measure SQNR " + answer(*record.on_sqnr_steps);
  return out;
}

std::string precision_map_json(const Model& model) {
  const std::vector<FusionRecord> records = model.fusions();
  // Flat members, one per fusion the layer takes (readers of the map take flat objects). The fallbacks are
  // the backends' fixed sentences, with no character that JSON escapes.
  return model.policy().map_json([&](const LinearPlan& layer) {
    std::string members;
    for (const FusionRecord& r : records) {
      if (r.layer == layer.name)
        members += fmt::format(R"(, "{}": "{}")", fusion_name(r.fusion), fusion_summary(r));
    }
    return members;
  });
}

int64_t lm_head_chunk_rows(ModelArchitecture /*architecture*/) {
  return Decoder::kHeadChunkRows;
}

}  // namespace octet
