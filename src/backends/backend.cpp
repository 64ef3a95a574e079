// The default implementations of Backend's optional ops.
#include "octet/backend/backend.h"

#include "octet/check.h"
#include "octet/numerics/format.h"

namespace octet {

void Backend::linear_forward_as(void* out, Dtype out_type, const float* inp, const float* weight,
                                const WeightCopy* copy, const float* bias, int64_t N, int64_t C, int64_t OC,
                                LinearExecution& exec) {
  OCTET_CHECK(out_type == Dtype::f32, "backend {}: linear outputs are stored in f32 only, asked for {}",
              name(), dtype_name(out_type));
  linear_forward(static_cast<float*>(out), inp, weight, copy, bias, N, C, OC, exec);
}

}  // namespace octet
