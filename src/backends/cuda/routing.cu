// The CUDA backend's mixture-of-experts routing ops (backend.h).
#include "cuda_backend_impl.h"
#include "octet/check.h"

namespace octet::cuda::backend_internal {

namespace {

[[noreturn]] void not_yet(std::string_view op) {
  OCTET_REQUIRE(false, "{}: the CUDA backend does not run mixture-of-experts routing yet", op);
  throw;  // unreachable
}

}  // namespace

void CudaBackend::top_k_softmax(const TensorView&, int32_t*, float*, const ConstTensorView&, int64_t) {
  not_yet("top_k_softmax");
}
void CudaBackend::top_k_softmax_backward(const TensorView&, const ConstTensorView&, const int32_t*,
                                         const float*, const float*, int64_t, const float*) {
  not_yet("top_k_softmax_backward");
}
void CudaBackend::group_by_expert(int32_t*, int32_t*, int32_t*, const int32_t*, int64_t, int64_t, int64_t,
                                  int64_t) {
  not_yet("group_by_expert");
}
void CudaBackend::gather_rows(const TensorView&, const ConstTensorView&, const int32_t*, int64_t,
                              const float*) {
  not_yet("gather_rows");
}
void CudaBackend::combine_rows(const TensorView&, const float*, const ConstTensorView&, const int32_t*, int64_t,
                               const float*) {
  not_yet("combine_rows");
}
void CudaBackend::row_dots(float*, const ConstTensorView&, const ConstTensorView&, const int32_t*, int64_t) {
  not_yet("row_dots");
}
void CudaBackend::column_sums(float*, const ConstTensorView&) {
  not_yet("column_sums");
}

}  // namespace octet::cuda::backend_internal
