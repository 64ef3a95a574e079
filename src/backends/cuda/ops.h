// The CUDA backend's element-wise, normalisation, loss and optimizer ops: the contracts of the Backend
// interface (octet/backend/backend.h) on device pointers, enqueued on a stream. Each op follows the CPU
// reference (src/backends/cpu) operation for operation: results are bit-identical where the math is exact
// (embeddings, residuals, scaling, rounding, AdamW) and differ only by reduction order elsewhere. Every op is
// deterministic: no floating-point atomics, reduction orders fixed by the shapes alone.
// One header and one source file per family of kernels; this header gathers them for the backend.
#pragma once

#include "adamw.h"
#include "arithmetic.h"
#include "column_sum.h"
#include "convert.h"
#include "embedding.h"
#include "gelu.h"
#include "layernorm.h"
#include "reductions.h"
#include "rmsnorm.h"
#include "rope.h"
#include "softmax_cross_entropy.h"
#include "swiglu.h"
#include "workspace.h"
