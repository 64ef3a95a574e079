// The CPU backend: plain loops with float32 accumulation (float64 where a reduction's order would otherwise
// leak into the result), OpenBLAS for float32 products where present, and FP8 GEMMs emulated exactly by the
// numerics core. The reference every other backend is held to.
#pragma once

#include <memory>

#include "octet/backend/backend.h"

namespace octet {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace octet
