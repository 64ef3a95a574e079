// The model factory: the implementation of each model.arch.
#include "octet/model/model.h"

#include <utility>

#include "octet/check.h"
#include "octet/model/gpt2.h"

namespace octet {

std::unique_ptr<Model> make_model(ModelArchitecture architecture, const Gpt2Config& shape, Backend& backend,
                                  PrecisionPolicy policy, int64_t max_batch, int64_t max_seq_len) {
  switch (architecture) {
    case ModelArchitecture::gpt2:
      return std::make_unique<Gpt2>(shape, backend, std::move(policy), max_batch, max_seq_len);
  }
  OCTET_CHECK(false, "a known model architecture, got {}", static_cast<int>(architecture));
  return nullptr;
}

int64_t lm_head_chunk_rows(ModelArchitecture architecture) {
  switch (architecture) {
    case ModelArchitecture::gpt2:
      return Gpt2::kHeadChunkRows;
  }
  OCTET_CHECK(false, "a known model architecture, got {}", static_cast<int>(architecture));
  return 0;
}

}  // namespace octet
