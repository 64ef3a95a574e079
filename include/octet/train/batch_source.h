// Where a training step's micro-batches come from.
#pragma once

#include <cstdint>
#include <functional>

namespace octet {

// Fills tokens and targets [B, T] (host memory) for the next micro-batch.
using BatchSource = std::function<void(int32_t* tokens, int32_t* targets)>;

}  // namespace octet
