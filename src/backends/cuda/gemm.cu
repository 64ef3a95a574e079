// The cuBLASLt products of the CUDA backend (see octet/cuda/gemm.h).
//
// cuBLASLt is column-major, octet row-major. A row-major [R, C] matrix with row stride ld is the column-major
// [C, R] matrix with leading dimension ld, so the row-major D [M, N] = A_k B_k^T (A_k [M, K], B_k [N, K]) is
// the column-major D^T [N, M] = B_k A_k^T: cuBLASLt's first operand is octet's B and its second octet's A,
// with m = N, n = M. Octet's K-major B, seen column-major, is [K, N] and takes transa = T; octet's K-major A
// is [K, M] and takes transb = N: the "TN" form Hopper's FP8 kernels require. The scales follow the operands:
// cuBLASLt's A_SCALE_POINTER is octet's b_scale_inv. Octet's bias [N] runs along the column-major D^T's m
// dimension, the one CUBLASLT_EPILOGUE_BIAS broadcasts along.
#include "octet/cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <compare>
#include <limits>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "octet/check.h"
#include "octet/cuda/device.h"

namespace octet::cuda {
namespace {

constexpr uint32_t kMaxAlignment = 256;  // cuBLASLt's default assumption about every pointer
constexpr int64_t kFp8Multiple = 16;

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const std::string& problem,
                                     const char* file, int line) {
  throw_error(ErrorKind::internal, file, line,
              fmt::format("cuBLASLt call failed: {}: {} ({}); problem: {}", call,
                          cublasLtGetStatusName(status), cublasLtGetStatusString(status), problem));
}

// `call` must return CUBLAS_STATUS_SUCCESS; `problem`, a string saying what was being set up, is evaluated
// only on failure.
#define OCTET_CUBLAS_CHECK(call, problem)                                           \
  do {                                                                              \
    const cublasStatus_t octet_cublas_status_ = (call);                             \
    if (octet_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                            \
      throw_cublas_error(octet_cublas_status_, #call, problem, __FILE__, __LINE__); \
    }                                                                               \
  } while (0)

cudaDataType_t data_type(GemmType type) {
  switch (type) {
    case GemmType::f32:
    case GemmType::tf32:
      return CUDA_R_32F;
    case GemmType::bf16:
      return CUDA_R_16BF;
    case GemmType::f16:
      return CUDA_R_16F;
    case GemmType::e4m3:
      return CUDA_R_8F_E4M3;
    case GemmType::e5m2:
      return CUDA_R_8F_E5M2;
  }
  return CUDA_R_32F;
}

int64_t element_bytes(GemmType type) {
  switch (type) {
    case GemmType::f32:
    case GemmType::tf32:
      return 4;
    case GemmType::bf16:
    case GemmType::f16:
      return 2;
    case GemmType::e4m3:
    case GemmType::e5m2:
      return 1;
  }
  return 4;
}

// The largest power of two, up to 256, that divides the address: the alignment cuBLASLt's heuristic may
// assume for it.
uint32_t pointer_alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = kMaxAlignment;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// The stored layout of one operand, rows x cols row-major with row stride ld.
struct Stored {
  int64_t rows;
  int64_t cols;
  int64_t ld;
};

// D: d_bf16 or d, whichever is set.
void* output_of(const GemmProblem& p) {
  return p.d_bf16 != nullptr ? static_cast<void*>(p.d_bf16) : static_cast<void*>(p.d);
}

Stored stored_a(const GemmProblem& p) {
  const Stored s = p.a_transposed ? Stored{p.K, p.M, 0} : Stored{p.M, p.K, 0};
  return {s.rows, s.cols, p.lda != 0 ? p.lda : s.cols};
}
Stored stored_b(const GemmProblem& p) {
  const Stored s = p.b_transposed ? Stored{p.K, p.N, 0} : Stored{p.N, p.K, 0};
  return {s.rows, s.cols, p.ldb != 0 ? p.ldb : s.cols};
}
int64_t stored_ldd(const GemmProblem& p) {
  return p.ldd != 0 ? p.ldd : p.N;
}

// Everything a plan depends on. Pointers are not part of it (they are set per call), only their
// alignments, which restrict the algorithms the heuristic may return.
struct PlanKey {
  int64_t m, n, k, lda, ldb, ldd;
  GemmType a_type, b_type;
  bool a_transposed, b_transposed, bf16_output, accumulate, fast_accumulation;
  bool a_scaled, b_scaled;
  bool biased, added;
  GemmType bias_type;  // when biased
  uint32_t a_alignment, b_alignment, d_alignment, bias_alignment, c_alignment;
  auto operator<=>(const PlanKey&) const = default;
};

// A matmul descriptor, the three layouts (C is D, or an addend of D's layout) and the chosen algorithm. Owns
// the cuBLASLt objects.
struct Plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t first = nullptr;   // cuBLASLt's A: octet's B
  cublasLtMatrixLayout_t second = nullptr;  // cuBLASLt's B: octet's A
  cublasLtMatrixLayout_t output = nullptr;  // C and D (the same layout when C is an addend)
  cublasLtMatmulAlgo_t algorithm{};
  size_t workspace_bytes = 0;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (output != nullptr) (void)cublasLtMatrixLayoutDestroy(output);
    if (second != nullptr) (void)cublasLtMatrixLayoutDestroy(second);
    if (first != nullptr) (void)cublasLtMatrixLayoutDestroy(first);
    if (operation != nullptr) (void)cublasLtMatmulDescDestroy(operation);
  }
};

// Owns a preference object for the duration of one heuristic query.
struct Preference {
  cublasLtMatmulPreference_t handle = nullptr;
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  Preference() = default;
  ~Preference() {
    if (handle != nullptr) (void)cublasLtMatmulPreferenceDestroy(handle);
  }
};

// `problem` is described only when the call fails.
template <typename T>
void set_operation(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value,
                   const GemmProblem& problem) {
  OCTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)),
                     describe(problem));
}

// The device pointers of the descriptor: set on every call, since a cached descriptor serves every product
// of its shape.
void set_pointers(cublasLtMatmulDesc_t desc, const GemmProblem& p) {
  if (p.b_scale_inv != nullptr) set_operation(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.b_scale_inv, p);
  if (p.a_scale_inv != nullptr) set_operation(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.a_scale_inv, p);
  if (p.bias != nullptr) set_operation(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias, p);
}

}  // namespace

const char* gemm_type_name(GemmType type) {
  switch (type) {
    case GemmType::f32:
      return "f32";
    case GemmType::tf32:
      return "tf32";
    case GemmType::bf16:
      return "bf16";
    case GemmType::f16:
      return "f16";
    case GemmType::e4m3:
      return "e4m3";
    case GemmType::e5m2:
      return "e5m2";
  }
  return "unknown";
}

bool fp8_shape_supported(int64_t M, int64_t N, int64_t K) {
  return M >= 0 && N >= 0 && K > 0 && N % kFp8Multiple == 0 && K % kFp8Multiple == 0;
}

std::string describe(const GemmProblem& p) {
  std::string s = fmt::format("{} x {} -> {}, M={} N={} K={}, A [{}] B [{}]", gemm_type_name(p.a_type),
                              gemm_type_name(p.b_type), p.d_bf16 != nullptr ? "bf16" : "f32", p.M, p.N, p.K,
                              p.a_transposed ? "K,M" : "M,K", p.b_transposed ? "K,N" : "N,K");
  if (p.lda != 0 || p.ldb != 0 || p.ldd != 0) s += fmt::format(", lda={} ldb={} ldd={}", p.lda, p.ldb, p.ldd);
  if (p.accumulate) s += ", accumulate";
  if (p.alpha != 1.0f) s += fmt::format(", alpha={}", p.alpha);
  if (p.fast_accumulation) s += ", fast accumulation";
  if (p.a_scale_inv != nullptr || p.b_scale_inv != nullptr) s += ", scaled";
  if (p.bias != nullptr) s += fmt::format(", {} bias", gemm_type_name(p.bias_type));
  if (p.addend != nullptr) s += ", plus an addend";
  return s;
}

struct GemmEngine::State {
  int device = 0;
  bool fp8_tensor_cores = false;
  GemmAlgorithmChoice choice = GemmAlgorithmChoice::heuristic;
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer<uint8_t> workspace;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  GemmCounters counters;

  ~State() {
    plans.clear();  // descriptors before the handle
    if (handle != nullptr) (void)cublasLtDestroy(handle);
  }

  const Plan& plan_for(const PlanKey& key, const GemmProblem& p, cudaStream_t stream);
  // p's product by `algorithm` on `stream` (its pointers set on plan.operation); cuBLASLt's status.
  cublasStatus_t enqueue(const Plan& plan, const GemmProblem& p, const cublasLtMatmulAlgo_t& algorithm,
                         size_t workspace_bytes, cudaStream_t stream);
  // The fastest of `candidates` on p's own operands (see GemmAlgorithmChoice::timed): its index.
  size_t fastest(const Plan& plan, const GemmProblem& p,
                 std::span<const cublasLtMatmulHeuristicResult_t> candidates, cudaStream_t stream);
};

GemmEngine::GemmEngine(GemmAlgorithmChoice choice) : state_(std::make_unique<State>()) {
  state_->choice = choice;
  OCTET_CUDA_CHECK(cudaGetDevice(&state_->device));
  state_->fp8_tensor_cores = has_fp8_tensor_cores(device_info(state_->device));
  OCTET_CUBLAS_CHECK(cublasLtCreate(&state_->handle), std::string("creating the cuBLASLt handle"));
  state_->workspace = DeviceBuffer<uint8_t>(kWorkspaceBytes);
}

GemmEngine::~GemmEngine() = default;
GemmEngine::GemmEngine(GemmEngine&&) noexcept = default;
GemmEngine& GemmEngine::operator=(GemmEngine&&) noexcept = default;

GemmAlgorithmChoice GemmEngine::algorithm_choice() const {
  return state_->choice;
}
const GemmCounters& GemmEngine::counters() const {
  return state_->counters;
}
void GemmEngine::reset_counters() {
  state_->counters = {};
}
size_t GemmEngine::cached_plans() const {
  return state_->plans.size();
}
int GemmEngine::device() const {
  return state_->device;
}

namespace {

// Why the bias of `p` (when it has one) cannot be added in the epilogue, or null.
const char* bias_rejection(const GemmProblem& p) {
  if (p.bias == nullptr) return nullptr;
  if (p.accumulate) return "a bias cannot be added to a product that accumulates into D";
  if (pointer_alignment(p.bias) < 16) return "the bias pointer must be 16-byte aligned";
  if (is_fp8(p.a_type) || is_fp8(p.b_type) || p.d_bf16 != nullptr) {
    if (p.bias_type != GemmType::bf16) return "FP8 products and BF16 outputs take only a BF16 bias";
    return nullptr;
  }
  // cuBLASLt 13 on H100 answers CUBLAS_STATUS_INVALID_VALUE for a BF16 or FP16 bias with a float32 output
  // (FP8 products excepted, which take nothing else): a 16-bit bias goes in as float32 values.
  if (p.bias_type != GemmType::f32) return "products with a float32 output take only a float32 bias";
  return nullptr;
}

// Why `p` cannot run, or null. A fixed string, so that run() formats nothing when the problem is fine.
const char* rejection(const GemmProblem& p, bool fp8_tensor_cores) {
  if (p.M < 0 || p.N < 0 || p.K <= 0) return "M and N must be non-negative and K positive";
  if (p.a == nullptr || p.b == nullptr) return "A and B must be device pointers";
  if ((p.d == nullptr) == (p.d_bf16 == nullptr)) return "exactly one of d (float32) and d_bf16 must be set";
  if (const char* why = bias_rejection(p); why != nullptr) return why;
  if (p.addend != nullptr) {
    if (p.d == nullptr) return "an addend needs a float32 output";
    if (p.accumulate) return "an addend cannot be added to a product that accumulates into D";
    if (pointer_alignment(p.addend) < 4) return "the addend must be aligned to its element size";
  }
  const Stored a = stored_a(p);
  const Stored b = stored_b(p);
  if (a.ld < a.cols || b.ld < b.cols || stored_ldd(p) < p.N) {
    return "a leading dimension is shorter than its stored row";
  }
  if (is_fp8(p.a_type) || is_fp8(p.b_type)) {
    if (!is_fp8(p.a_type) || !is_fp8(p.b_type)) return "FP8 operands multiply only FP8 operands";
    if (p.a_type == GemmType::e5m2 && p.b_type == GemmType::e5m2)
      return "cuBLASLt has no E5M2 x E5M2 product";
    if (!fp8_tensor_cores) return "this GPU has no FP8 tensor cores (compute capability 8.9 or above needed)";
    if (p.a_transposed || p.b_transposed) {
      return "FP8 operands must be K-major: Hopper runs only the TN form (pass the transposed codes the cast "
             "writes)";
    }
    if (!fp8_shape_supported(p.M, p.N, p.K)) {
      return "FP8 products need N and K multiples of 16 (route this shape to a BF16 product)";
    }
    const int64_t d_bytes = p.d_bf16 != nullptr ? 2 : 4;
    const void* d = output_of(p);
    if (a.ld % kFp8Multiple != 0 || b.ld % kFp8Multiple != 0 || (stored_ldd(p) * d_bytes) % 16 != 0 ||
        pointer_alignment(p.a) < 16 || pointer_alignment(p.b) < 16 || pointer_alignment(d) < 16) {
      return "FP8 products need 16-byte aligned pointers and leading dimensions";
    }
    // Found on H100 with cuBLASLt 13.1: a scale 4 or 8 bytes past a 16-byte boundary is not supported.
    if ((p.a_scale_inv != nullptr && pointer_alignment(p.a_scale_inv) < 16) ||
        (p.b_scale_inv != nullptr && pointer_alignment(p.b_scale_inv) < 16)) {
      return "FP8 scale pointers must be 16-byte aligned";
    }
    return nullptr;
  }
  if (p.a_type != p.b_type) return "A and B must have the same type";
  if (p.fast_accumulation || p.a_scale_inv != nullptr || p.b_scale_inv != nullptr) {
    return "fast accumulation and scales apply to FP8 products only";
  }
  if (p.d_bf16 != nullptr && p.a_type != GemmType::bf16) return "a BF16 output needs FP8 or BF16 operands";
  // Not a cuBLASLt rule, but a pointer misaligned for its own type would fault inside the library.
  const auto bytes = static_cast<uint32_t>(element_bytes(p.a_type));
  if (pointer_alignment(p.a) < bytes || pointer_alignment(p.b) < bytes) {
    return "operand pointers must be aligned to their element size";
  }
  return nullptr;
}

}  // namespace

std::string GemmEngine::can_implement(const GemmProblem& p) const {
  const char* why = rejection(p, state_->fp8_tensor_cores);
  return why == nullptr ? std::string() : fmt::format("{}: {}", why, describe(p));
}

const Plan& GemmEngine::State::plan_for(const PlanKey& key, const GemmProblem& p, cudaStream_t stream) {
  if (const auto found = plans.find(key); found != plans.end()) return *found->second;

  const std::string what = describe(p);
  auto plan = std::make_unique<Plan>();
  const bool fp8 = is_fp8(p.a_type);
  const cublasComputeType_t compute =
      p.a_type == GemmType::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  OCTET_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->operation, compute, CUDA_R_32F), what);

  // cuBLASLt's A is octet's B: K-major B ([N, K] row-major = [K, N] column-major) is transposed.
  const cublasOperation_t first_op = p.b_transposed ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t second_op = p.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_operation(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, first_op, p);
  set_operation(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, second_op, p);
  if (fp8) {
    const int8_t fast = p.fast_accumulation ? 1 : 0;
    set_operation(plan->operation, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast, p);
  }
  if (p.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    set_operation(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, p);
    const cudaDataType_t bias_type = data_type(p.bias_type);
    set_operation(plan->operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, p);
  }

  // Column-major shapes: a stored row-major [rows, cols] matrix is [cols, rows] with leading dimension ld.
  const Stored a = stored_a(p);
  const Stored b = stored_b(p);
  const cudaDataType_t output_type = p.d_bf16 != nullptr ? CUDA_R_16BF : CUDA_R_32F;
  OCTET_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->first, data_type(p.b_type), static_cast<uint64_t>(b.cols),
                                 static_cast<uint64_t>(b.rows), b.ld),
      what);
  OCTET_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->second, data_type(p.a_type), static_cast<uint64_t>(a.cols),
                                 static_cast<uint64_t>(a.rows), a.ld),
      what);
  OCTET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->output, output_type, static_cast<uint64_t>(p.N),
                                                static_cast<uint64_t>(p.M), stored_ldd(p)),
                     what);

  // The scale and bias pointers are part of what the heuristic must support (their values change per call).
  set_pointers(plan->operation, p);

  Preference preference;
  OCTET_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference.handle), what);
  const uint64_t workspace_limit = kWorkspaceBytes;
  OCTET_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_limit, sizeof(workspace_limit)),
      what);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.b_alignment},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.a_alignment},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.added ? key.c_alignment : key.d_alignment},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.d_alignment},
  };
  for (const auto& [attribute, bytes] : alignments) {
    OCTET_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(preference.handle, attribute, &bytes, sizeof(bytes)), what);
  }

  // A product that accumulates into D is never timed: each timed product would add into D again.
  const bool timed = choice == GemmAlgorithmChoice::timed && !p.accumulate;
  std::array<cublasLtMatmulHeuristicResult_t, kTimedCandidates> results{};
  int returned = 0;
  OCTET_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, plan->operation, plan->first, plan->second,
                                                    plan->output, plan->output, preference.handle,
                                                    timed ? kTimedCandidates : 1, results.data(), &returned),
                     what);
  ++counters.heuristic_queries;
  if (returned == 0)
    throw_cublas_error(CUBLAS_STATUS_NOT_SUPPORTED, "no algorithm found", what, __FILE__, __LINE__);
  size_t chosen = 0;
  if (timed) {
    chosen = fastest(*plan, p, std::span(results.data(), static_cast<size_t>(returned)), stream);
    ++counters.timed_plans;
    if (chosen != 0) ++counters.timed_plans_not_first;
  }
  plan->algorithm = results[chosen].algo;
  plan->workspace_bytes = results[chosen].workspaceSize;

  const auto [inserted, ok] = plans.emplace(key, std::move(plan));
  OCTET_CHECK(ok, "a new plan for {} was already cached", what);
  return *inserted->second;
}

cublasStatus_t GemmEngine::State::enqueue(const Plan& plan, const GemmProblem& p,
                                          const cublasLtMatmulAlgo_t& algorithm, size_t workspace_bytes,
                                          cudaStream_t stream) {
  void* d = output_of(p);
  // C is D itself (read only when accumulating) or the addend.
  const void* c_matrix = p.addend != nullptr ? static_cast<const void*>(p.addend) : d;
  const float beta = p.accumulate || p.addend != nullptr ? 1.0f : 0.0f;
  return cublasLtMatmul(handle, plan.operation, &p.alpha, p.b, plan.first, p.a, plan.second, &beta, c_matrix,
                        plan.output, d, plan.output, &algorithm, workspace.data(), workspace_bytes, stream);
}

size_t GemmEngine::State::fastest(const Plan& plan, const GemmProblem& p,
                                  std::span<const cublasLtMatmulHeuristicResult_t> candidates,
                                  cudaStream_t stream) {
  if (candidates.size() < 2) return 0;
  set_pointers(plan.operation, p);
  const auto product = [&](const cublasLtMatmulHeuristicResult_t& candidate) {
    return enqueue(plan, p, candidate.algo, candidate.workspaceSize, stream);
  };
  // The candidates are timed on a quiet device: work still running on the device's other streams (a data-
  // parallel backward's gradient sums, a fully sharded forward's gathers) would take SMs from some
  // candidates and not others, and a slower one could win.
  OCTET_CUDA_CHECK(cudaDeviceSynchronize());
  // Every candidate's events are recorded before the host waits, once, for the last of them.
  std::vector<Event> starts(candidates.size()), stops(candidates.size());
  std::vector<bool> ran(candidates.size(), false);
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (product(candidates[i]) != CUBLAS_STATUS_SUCCESS) continue;  // a candidate cuBLASLt then refuses
    OCTET_CUDA_CHECK(cudaEventRecord(starts[i].get(), stream));
    bool all_ran = true;
    for (int r = 0; r < kTimedRepeats && all_ran; ++r)
      all_ran = product(candidates[i]) == CUBLAS_STATUS_SUCCESS;
    OCTET_CUDA_CHECK(cudaEventRecord(stops[i].get(), stream));
    ran[i] = all_ran;
  }
  OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
  size_t best = 0;
  float best_ms = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!ran[i]) continue;
    float ms = 0.0f;
    OCTET_CUDA_CHECK(cudaEventElapsedTime(&ms, starts[i].get(), stops[i].get()));
    if (ms < best_ms) {
      best_ms = ms;
      best = i;
    }
  }
  return best;
}

void GemmEngine::run(const GemmProblem& p, cudaStream_t stream) {
  if (const char* why = rejection(p, state_->fp8_tensor_cores); why != nullptr) {
    throw_error(ErrorKind::invalid_input, __FILE__, __LINE__, fmt::format("{}: {}", why, describe(p)));
  }
  int current = 0;
  OCTET_CUDA_CHECK(cudaGetDevice(&current));
  OCTET_CHECK(current == state_->device, "the GEMM engine of device {} was used on device {}", state_->device,
              current);
  if (p.M == 0 || p.N == 0) return;

  void* d = output_of(p);
  const bool fp8 = is_fp8(p.a_type);
  const Stored a = stored_a(p);
  const Stored b = stored_b(p);
  PlanKey key{};
  key.m = p.M;
  key.n = p.N;
  key.k = p.K;
  key.lda = a.ld;
  key.ldb = b.ld;
  key.ldd = stored_ldd(p);
  key.a_type = p.a_type;
  key.b_type = p.b_type;
  key.a_transposed = p.a_transposed;
  key.b_transposed = p.b_transposed;
  key.bf16_output = p.d_bf16 != nullptr;
  key.accumulate = p.accumulate;
  key.fast_accumulation = p.fast_accumulation;
  key.a_scaled = p.a_scale_inv != nullptr;
  key.b_scaled = p.b_scale_inv != nullptr;
  key.biased = p.bias != nullptr;
  key.bias_type = key.biased ? p.bias_type : GemmType::f32;
  key.a_alignment = pointer_alignment(p.a);
  key.b_alignment = pointer_alignment(p.b);
  key.d_alignment = pointer_alignment(d);
  key.bias_alignment = key.biased ? pointer_alignment(p.bias) : 0;
  key.added = p.addend != nullptr;
  key.c_alignment = key.added ? pointer_alignment(p.addend) : 0;

  const Plan& plan = state_->plan_for(key, p, stream);
  set_pointers(plan.operation, p);

  const cublasStatus_t status = state_->enqueue(plan, p, plan.algorithm, plan.workspace_bytes, stream);
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw_cublas_error(status, "cublasLtMatmul", describe(p), __FILE__, __LINE__);
  }

  GemmCounters& c = state_->counters;
  switch (p.a_type) {
    case GemmType::f32:
      ++c.f32;
      break;
    case GemmType::tf32:
      ++c.tf32;
      break;
    case GemmType::bf16:
      ++c.bf16;
      break;
    case GemmType::f16:
      ++c.f16;
      break;
    case GemmType::e4m3:
      ++(p.b_type == GemmType::e4m3 ? c.e4m3_e4m3 : c.e4m3_e5m2);
      break;
    case GemmType::e5m2:
      ++c.e5m2_e4m3;
      break;
  }
  if (fp8 && p.fast_accumulation) ++c.fp8_fast_accumulation;
  if (p.d_bf16 != nullptr) ++c.bf16_outputs;
  if (p.bias != nullptr) ++c.bias_epilogues;
  if (p.addend != nullptr) ++c.addend_epilogues;
  c.flops += 2.0 * static_cast<double>(p.M) * static_cast<double>(p.N) * static_cast<double>(p.K);
}

}  // namespace octet::cuda
