// The CUDA backend's matrix products through cuBLASLt: FP8 (E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3) on FP8
// tensor cores with per-tensor scales read from device memory, BF16 and FP16 with float32 accumulation, and
// float32 in exact or TF32 compute. One GemmEngine per backend owns the cuBLASLt handle, its workspace and a
// cache of plans (descriptors, layouts and the algorithm chosen for them), so that a shape seen before costs
// no heuristic query. Host code only.
//
// Every product is written in row-major terms, the layout of octet's tensors:
//   D [M, N] = alpha * op(A) x op(B)^T  (+ bias [N] on every row)  (+ D when accumulate, or + an addend)
// where op(A) is [M, K] and op(B) is [N, K]. Untransposed, A is stored [M, K] and B [N, K], both with K
// contiguous ("K-major"), the only layout Hopper's FP8 tensor cores accept. The transposed flags describe the
// other storage, for the non-FP8 types only: a_transposed means A is stored [K, M], b_transposed that B is
// stored [K, N]. A linear layer y = x W^T (x [B*T, C], W [OC, C], y [B*T, OC]) then needs no transposed copy:
//   forward   y  [BT, OC] = x [BT, C] x W^T                    A = x,  B = W    (K = C)
//   dgrad     dx [BT, C]  = dy [BT, OC] x W [OC, C]            A = dy, B = W,  b_transposed   (K = OC)
//   wgrad     dW [OC, C] += dy^T [OC, BT] x x [BT, C]          A = dy, a_transposed, B = x, b_transposed,
//                                                              accumulate                     (K = BT)
// For FP8 the backward products take the transposed codes the cast kernel writes (octet/cuda/cast.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace octet::cuda {

// The storage type of an operand and, for float32 operands, the compute: f32 multiplies in exact float32
// (CUBLAS_COMPUTE_32F), tf32 rounds the float32 operands to TF32 on the tensor cores
// (CUBLAS_COMPUTE_32F_FAST_TF32). Every type accumulates in float32 (FP8 on Hopper: see fast_accumulation).
enum class GemmType : uint8_t { f32, tf32, bf16, f16, e4m3, e5m2 };

const char* gemm_type_name(GemmType type);
constexpr bool is_fp8(GemmType type) {
  return type == GemmType::e4m3 || type == GemmType::e5m2;
}

// One product. Every pointer is device memory. Exactly one of d and d_bf16 is set.
struct GemmProblem {
  int64_t M = 0;
  int64_t N = 0;
  int64_t K = 0;
  GemmType a_type = GemmType::f32;
  GemmType b_type = GemmType::f32;
  const void* a = nullptr;    // [M, K] row-major, or [K, M] when a_transposed
  const void* b = nullptr;    // [N, K] row-major, or [K, N] when b_transposed
  bool a_transposed = false;  // non-FP8 types only
  bool b_transposed = false;  // non-FP8 types only
  // Elements between consecutive stored rows; 0: packed (the stored row length). Lets an operand or the
  // output be a column slice of a wider matrix.
  int64_t lda = 0;
  int64_t ldb = 0;
  int64_t ldd = 0;

  float* d = nullptr;               // [M, N] row-major float32 output
  __nv_bfloat16* d_bf16 = nullptr;  // [M, N] row-major BF16 output (FP8 and BF16 operands only)
  bool accumulate = false;          // D = alpha A B^T + D (beta = 1), in D's own type; else D is overwritten
  float alpha = 1.0f;

  // A bias [N] added to every row of D in the GEMM's epilogue (CUBLASLT_EPILOGUE_BIAS): to the float32
  // product (scales and alpha applied) before D is written, so that a linear layer makes no second pass over
  // D. Null: none. Its type: bf16 for FP8 products and for BF16 outputs, f32 for every other product with a
  // float32 output (cuBLASLt 13 on H100 finds no FP8 algorithm for a float32 bias, and refuses a BF16 or
  // FP16 bias with BF16 or FP16 operands and a float32 output: a rounded bias goes in as float32 values).
  // Not with accumulate; 16-byte aligned.
  const void* bias = nullptr;
  GemmType bias_type = GemmType::bf16;
  // A float32 matrix [M, N] (leading dimension ldd, as D) added in the epilogue: D = alpha A B^T + addend
  // (+ bias), cuBLASLt's C with beta = 1, read as the product is written, so that a linear layer adds a
  // residual without a pass of its own. The order of the two float32 additions is cuBLASLt's. Null: none.
  // Float32 outputs only, not with accumulate; it must not overlap D.
  const float* addend = nullptr;

  // FP8 only, one float each, read by the GEMM on the device: the dequantizing scales, so that
  // D = alpha * a_scale_inv * b_scale_inv * sum(qa * qb). Null: 1. Each must be 16-byte aligned (cuBLASLt
  // 13.1 on H100 answers CUBLAS_STATUS_NOT_SUPPORTED for a scale at a 4- or 8-byte offset).
  const float* a_scale_inv = nullptr;
  const float* b_scale_inv = nullptr;
  // FP8 only: CUBLASLT_MATMUL_DESC_FAST_ACCUM. Hopper's FP8 tensor cores keep about 14 significant bits in
  // their accumulator; without this flag cuBLASLt adds the partial sums into float32 at intervals along K
  // (every 128 on H100), with it the whole reduction stays in the narrow accumulator (faster, less accurate:
  // forward GEMMs only).
  bool fast_accumulation = false;
  // There is no amax of D here: cuBLASLt computes one (CUBLASLT_MATMUL_DESC_AMAX_D_POINTER) only for FP8
  // outputs, and answers CUBLAS_STATUS_INVALID_VALUE for float32 and BF16 ones.
};

// cuBLASLt's FP8 kernels need both operands' rows (K bytes) and the output's rows to be multiples of 16 bytes
// and 16-byte aligned pointers; octet asks for K and N multiples of 16 (M is free). Callers route any other
// shape (a vocabulary projection of 50257 rows, say) to a BF16 product of the same quantized values.
bool fp8_shape_supported(int64_t M, int64_t N, int64_t K);

// How many products of each kind ran (for proof that FP8 ran, and for benchmarks).
struct GemmCounters {
  int64_t e4m3_e4m3 = 0;  // FP8 products by (A, B) format
  int64_t e4m3_e5m2 = 0;
  int64_t e5m2_e4m3 = 0;
  int64_t fp8_fast_accumulation = 0;  // of the FP8 products, those with fast accumulation
  int64_t bf16 = 0;
  int64_t f16 = 0;
  int64_t f32 = 0;
  int64_t tf32 = 0;
  int64_t bf16_outputs = 0;       // products of any type written as BF16
  int64_t bias_epilogues = 0;     // products that added a bias in their epilogue
  int64_t addend_epilogues = 0;   // products that added an addend in their epilogue
  int64_t heuristic_queries = 0;  // plan cache misses: shapes seen for the first time
  // GemmAlgorithmChoice::timed: the plans whose algorithm was chosen by timing the heuristic's candidates,
  // and of those the ones where a candidate other than the heuristic's first was the fastest.
  int64_t timed_plans = 0;
  int64_t timed_plans_not_first = 0;
  double flops = 0.0;  // 2 M N K summed over every product

  int64_t fp8() const { return e4m3_e4m3 + e4m3_e5m2 + e5m2_e4m3; }
  int64_t total() const { return fp8() + bf16 + f16 + f32 + tf32; }
};

// How the engine picks the algorithm of a plan, once, when it first meets a shape.
enum class GemmAlgorithmChoice : uint8_t {
  // cuBLASLt's heuristic's first answer: the same algorithm, and so the same bits, on every run.
  heuristic,
  // The fastest of the heuristic's first GemmEngine::kTimedCandidates answers, each timed on the first
  // call's own operands (kTimedRepeats products after one warm-up, on the caller's stream, once the device
  // has finished the work enqueued before, on every stream; the host waits for them once). A candidate's
  // product overwrites D as the call's own does, or adds the same addend to it, so
  // timing changes nothing the call returns. Products that accumulate into D keep the heuristic's first
  // answer: timing them would add into D more than once. Which candidate wins can differ from run to run,
  // and candidates may sum in different orders: the last bits of a result are then not reproducible.
  timed,
};

// The products of one device (the current one when constructed). Not thread-safe; products enqueued on
// different streams must not overlap in time, since they share one workspace.
class GemmEngine {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what cuBLAS recommends for Hopper
  static constexpr int kTimedCandidates = 8;
  static constexpr int kTimedRepeats = 5;

  explicit GemmEngine(GemmAlgorithmChoice choice = GemmAlgorithmChoice::heuristic);
  ~GemmEngine();
  GemmEngine(const GemmEngine&) = delete;
  GemmEngine& operator=(const GemmEngine&) = delete;
  GemmEngine(GemmEngine&&) noexcept;
  GemmEngine& operator=(GemmEngine&&) noexcept;

  // Enqueues the product on `stream`. Throws octet::Error: invalid_input for a combination this engine does
  // not run (types, transposes, output type, FP8 shape or alignment, FP8 on a GPU without FP8 tensor cores),
  // naming the types and the shape; internal when cuBLASLt fails or finds no algorithm, naming cuBLASLt's
  // status and the problem.
  void run(const GemmProblem& problem, cudaStream_t stream);

  // Empty when `problem` can run; otherwise why not (what run would throw as invalid_input).
  std::string can_implement(const GemmProblem& problem) const;

  GemmAlgorithmChoice algorithm_choice() const;
  const GemmCounters& counters() const;
  void reset_counters();
  size_t cached_plans() const;
  int device() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// "e4m3 x e5m2 -> f32, M=128 N=96 K=160, A [M,K] B [N,K], accumulate, fast accumulation": for messages.
std::string describe(const GemmProblem& problem);

}  // namespace octet::cuda
