// Rank r's micro-batches out of every rank's (see data_parallel.h).
#include "octet/train/data_parallel.h"

#include <memory>
#include <vector>

#include "octet/check.h"

namespace octet {

BatchSource rank_batches(BatchSource global, int rank, int ranks, int64_t micro_batches, int64_t B,
                         int64_t T) {
  OCTET_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && micro_batches >= 1 && B >= 1 && T >= 1,
              "rank {} of {}, {} micro-batches of [{}, {}]", rank, ranks, micro_batches, B, T);
  if (ranks == 1) return global;
  struct Reader {
    BatchSource global;
    int64_t taken = 0;  // micro-batches this rank has taken in the current step
    std::vector<int32_t> tokens, targets;
    void skip(int64_t count) {
      for (int64_t i = 0; i < count; ++i) global(tokens.data(), targets.data());
    }
  };
  auto reader = std::make_shared<Reader>();
  reader->global = std::move(global);
  reader->tokens.resize(static_cast<size_t>(B * T));
  reader->targets.resize(static_cast<size_t>(B * T));
  const int64_t before = rank * micro_batches, after = (ranks - 1 - rank) * micro_batches;
  return [reader, before, after, micro_batches](int32_t* tokens, int32_t* targets) {
    if (reader->taken == 0) reader->skip(before);
    reader->global(tokens, targets);
    if (++reader->taken == micro_batches) {
      reader->skip(after);
      reader->taken = 0;
    }
  };
}

}  // namespace octet
