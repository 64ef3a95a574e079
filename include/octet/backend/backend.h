// The backend interface: the small, explicit set of ops the training engine is written against. The CPU
// backend (cpu_backend.h) is the reference; a GPU backend implements the same ops and is held to it. Buffers
// are allocated by the backend and addressed by tensor views (or raw pointers) into them (host memory on the
// CPU, device memory on a GPU). The ops are primitives named for what they compute, never after a model's
// layer: a model composes them (its LM head: src/model/lm_head.h). Shape letters as in llm.c: N = B*T rows,
// C channels, OC output channels, NH heads, V vocabulary (Vp padded).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "octet/backend/precision.h"
#include "octet/tensor/fp8_tensor.h"
#include "octet/tensor/tensor.h"

namespace octet {

// Kinds of work in a training step, for the time breakdown of `octet bench train`.
enum class OpKind : uint8_t {
  gemm_fp8,   // FP8 GEMMs
  gemm_wide,  // BF16, FP16 and FP32 GEMMs
  attention,  // fused attention, forward and backward
  casts,      // FP8 casts (with their scaling updates) and BF16/FP16 conversions not fused into a producer
  norm_activation,  // LayerNorm and GELU, with the FP8 casts (and the bias gradient) fused into them
  loss,             // softmax cross-entropy
  optimizer,        // AdamW (with the weight casts fused into it), gradient norm, finiteness checks
  other,            // embeddings, residual adds, biases, zeroing
  count
};
inline constexpr size_t kOpKinds = static_cast<size_t>(OpKind::count);
std::string_view op_kind_name(OpKind kind);
// Device milliseconds per OpKind.
using OpTimes = std::array<double, kOpKinds>;

// Memory owned by a backend; move-only through unique_ptr.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
  float* floats() { return static_cast<float*>(data()); }
  int32_t* ints() { return static_cast<int32_t*>(data()); }

  // Giving memory back while nothing uses it (a buffer from Backend::allocate_releasable; any other keeps
  // all of its memory, and its release gives back nothing). release gives back the pages that lie wholly
  // inside [offset, offset + bytes) of data() and returns how many bytes that freed: their contents are lost,
  // and nothing may read or write them (no work still enqueued either: release waits for the device) until
  // restore(), which maps every page given back again, with contents unspecified. The pages are the
  // backend's: the host's (4 KiB) on the CPU, chunks of the device's mapping granularity on a GPU.
  virtual size_t release(size_t offset, size_t bytes) {
    (void)offset;
    (void)bytes;
    return 0;
  }
  virtual void restore() {}
  // The bytes given back and not yet restored.
  virtual size_t released_bytes() const { return 0; }
  // Whether release can give memory back at all.
  virtual bool releasable() const { return false; }
};

// A linear layer's weight in the form its GEMMs consume (a rounded BF16/FP16 copy, or FP8 codes with their
// transposed copy), made once per optimizer step by Backend::prepare_weight.
class WeightCopy {
 public:
  virtual ~WeightCopy() = default;
};

// Kinds of normalization (Backend::normalization_forward and _backward): LayerNorm (GPT-2: mean and
// variance, a gain and a bias) and RMSNorm (Llama: the root mean square, a gain, no bias).
enum class Normalization : uint8_t { layernorm, rmsnorm };
std::string_view normalization_name(Normalization kind);
// Kinds of activation (Backend::activation_forward and _backward): GELU (element-wise, the tanh
// approximation) and SwiGLU (gated: each input row holds a gate half and an up half, out = silu(gate) * up).
enum class Activation : uint8_t { gelu, swiglu };
std::string_view activation_name(Activation kind);
// Input columns per output column of an activation: 1 for GELU, 2 for SwiGLU.
int64_t activation_inputs(Activation kind);

// Where an op that produces a linear layer's input (Fusion::input_cast) or output gradient
// (Fusion::gradient_cast) also casts it for that layer: the layer (its modes, recipe, scaling state,
// telemetry and counters) and the caller's slot for the FP8 tensor the cast goes to (the backend makes the
// tensor where the slot is empty). No layer: no cast.
struct Fp8CastTarget {
  LinearExecution* layer = nullptr;
  std::unique_ptr<Fp8Tensor>* tensor = nullptr;
  bool given() const { return layer != nullptr; }
};

// Row groups of one op's output, each cast for its own FP8 layer (a mixture of experts' grouped rows, one
// group an expert's): group g is rows [offsets[g], offsets[g + 1]) of the output, cast for targets[g]. A group
// without rows is left alone; a group with rows and an empty target is not cast, and the op's output then has
// data.
struct RowGroupCasts {
  std::span<const int64_t> offsets;        // groups + 1, ascending, from 0 to at most the output's rows
  std::span<const Fp8CastTarget> targets;  // one per group
  int64_t groups() const { return static_cast<int64_t>(targets.size()); }
};

// The check of a RowGroupCasts every backend makes: a target per group, the offsets ascending from 0 and
// within the op's `rows`. A refusal names `op`.
void check_row_groups(std::string_view op, const RowGroupCasts& casts, int64_t rows);

// A linear layer's FP8 operand as one of its ops takes it (the input in the forward, the output gradient in
// the backward): the caller's slot for its FP8 tensor, and whether the op that produced the values cast
// them into it already (given an Fp8CastTarget), so that the GEMM takes the cast as it is; otherwise the
// linear op casts the values into the slot itself.
struct Fp8Operand {
  std::unique_ptr<Fp8Tensor>* tensor = nullptr;
  bool cast_by_producer = false;
};

// The check every backend makes of an FP8 tensor handed to a linear op of exec's layer: it holds the cast
// of that layer's `role` operand (its scaling state), of shape [rows, cols]. A refusal names `op`.
void check_fp8_operand(std::string_view op, const Fp8Tensor* tensor, const LinearExecution& exec,
                       TensorRole role, int64_t rows, int64_t cols);

// What a linear layer's forward GEMM adds to its product before it writes its output
// (Backend::linear_forward): the bias [OC] (null: none) and a residual [N, OC] (null: none) that the output
// joins.
struct Epilogue {
  const float* bias = nullptr;
  const float* residual = nullptr;
};

// The sizes a linear layer's tensors share, checked against each other the same way by every backend: its
// input inp [N, C] (of any rank, seen as a matrix), weight [OC, C] and output (or output gradient) `out`
// [N, OC]. A mismatch throws, naming `op` and the tensor.
struct LinearSizes {
  int64_t N = 0;
  int64_t C = 0;
  int64_t OC = 0;
};
LinearSizes linear_sizes(std::string_view op, const Shape& inp, const Shape& weight, const Shape& out,
                         std::string_view out_name);
// Attention's heads: `heads` query heads and `kv_heads` key and value heads, each kv head shared by
// heads / kv_heads query heads (grouped-query attention; kv_heads = heads is multi-head attention, as
// GPT-2's, and one head count converts to that).
struct AttentionHeads {
  int64_t heads = 1;
  int64_t kv_heads = 1;
  AttentionHeads(int64_t heads_) : heads(heads_), kv_heads(heads_) {}  // NOLINT: one count is MHA
  AttentionHeads(int64_t heads_, int64_t kv_heads_) : heads(heads_), kv_heads(kv_heads_) {}
  int64_t group() const { return heads / kv_heads; }
};
// The same for attention's qkv [B, T, (heads + 2 kv_heads) * hs] (the query heads, then the key heads, then
// the value heads, hs each) and out (or its gradient) [B, T, C], C = heads * hs.
struct AttentionSizes {
  int64_t B = 0;
  int64_t T = 0;
  int64_t C = 0;
  int64_t hs = 0;     // head size
  int64_t kv_C = 0;   // kv_heads * hs: the width of k and of v
  int64_t qkv_C = 0;  // C + 2 kv_C: a row of qkv
};
AttentionSizes attention_sizes(std::string_view op, const Shape& qkv, const Shape& out, AttentionHeads heads);

// The same for an embedding: out (or its gradient) [B, T, C], the table [V, C], and the positions [T, C]
// where has_positions.
struct EmbeddingSizes {
  int64_t B = 0;
  int64_t T = 0;
  int64_t C = 0;
  int64_t V = 0;
};
EmbeddingSizes embedding_sizes(std::string_view op, const Shape& out, std::string_view out_name,
                               const Shape& table, const Shape& positions, bool has_positions);
// The same for a rotary embedding's x [B, T, W] and table [>= T, hs]: the first `heads` heads of hs (even)
// fit in a row.
struct RotarySizes {
  int64_t B = 0;
  int64_t T = 0;
  int64_t hs = 0;
};
RotarySizes rotary_sizes(std::string_view op, const Shape& x, const Shape& table, int64_t heads);
// The output width C of an activation of `kind` whose input is inp [N, k C] (activation_inputs).
int64_t activation_width(std::string_view op, Activation kind, const Shape& inp);
// A normalization's optional arguments as its kind takes them: LayerNorm's mean and bias (or dbias) given,
// RMSNorm's null.
void check_normalization_arguments(std::string_view op, Normalization kind, const float* mean,
                                   const float* bias);
// The rows group_by_expert may fill for N tokens choosing k of E experts, each expert's rows starting at a
// multiple of align: N k, plus align - 1 of padding for each expert.
inline int64_t grouped_rows(int64_t N, int64_t k, int64_t E, int64_t align) {
  return N * k + E * (align - 1);
}
// The checks every backend makes of the routing ops' sizes: logits or probs [N, E] with 1 <= k <= E.
struct RoutingSizes {
  int64_t N = 0;
  int64_t E = 0;
};
RoutingSizes routing_sizes(std::string_view op, const Shape& probs, int64_t k);
// The same for the loss's logits [N, Vp], of which the first V (1 .. Vp) are the vocabulary's.
struct LossSizes {
  int64_t N = 0;
  int64_t Vp = 0;
};
LossSizes loss_sizes(std::string_view op, const Shape& logits, int64_t V);

// The tensors whose storage type a backend chooses (Backend::storage_type).
enum class StorageRole : uint8_t {
  // A tensor the model rounds to bf16 anyway (the MLP's hidden activation and the gradient that reaches it).
  rounded_activation,
  // Attention's input qkv: bf16 where the backend's attention multiplies q, k and v rounded to bf16 anyway
  // (the CUDA backend's tensor-core attention).
  attention_input,
  // Attention's output and the gradients on either side of it (its dout, and its dqkv, which the qkv layer's
  // backward reads): bf16 where the backend's attention reads and writes them in bf16 anyway (the CUDA
  // backend
  // on cuDNN). Only where the attention input is bf16.
  attention_output,
  // A linear layer's weight gradient that the model keeps rounded to bf16 (train.weight_gradients = "bf16",
  // for layers whose weight-gradient GEMM is BF16 or FP8, as PyTorch autocast's weight gradients are the BF16
  // GEMM's output): bf16 where that GEMM writes and adds to it in bf16 itself, which halves the gradient's
  // bytes in the GEMM, the gradient norm and AdamW. It must stay bf16 if the layer moves to BF16
  // (move_layer_to_bf16).
  weight_gradient,
  // A language model's logits [N, Vp] from its head's forward GEMM (`layer`: the head), which the loss
  // overwrites with their gradient for the head's backward GEMMs (the model's lm_head.h). Only where
  // logits_in_bf16(*layer), whose logits the model rounds to bf16 anyway (round_in_place on an f32
  // answer): bf16 where the backend's linear_forward writes them in bf16 from its GEMM, its
  // softmax_cross_entropy reads and writes them in bf16, and its linear_backward's BF16 GEMMs read the bf16
  // gradient as it is, which halves the loss's traffic and saves the rounding and conversion passes.
  logits,
};
struct StorageQuery {
  StorageRole role = StorageRole::rounded_activation;
  int64_t channels = 0;                    // attention: C (heads * head size)
  int64_t heads = 0;                       // attention: NH
  const LinearExecution* layer = nullptr;  // weight_gradient, logits: the layer
  int64_t kv_heads = 0;                    // attention: the key and value heads; 0: heads
};

// Work a backend may do inside a neighbouring op's pass instead of in a pass of its own. A caller that
// relies on one asks Backend::supports first and records the answer (Model::fusions): the ops take the same
// arguments either way and give the same results, but where the backend does not fuse, the work runs as the
// separate passes the answer names. No fallback goes unrecorded.
enum class Fusion : uint8_t {
  // A normalization, activation forward or gather of rows (cast_for) writes its consumer's FP8 input cast in
  // the pass that writes its output.
  input_cast,
  // An activation backward or a gather of rows (cast_for) writes its consumer's FP8 output-gradient cast
  // (and the activation sums the bias gradient) in the pass that writes the gradient.
  gradient_cast,
  // A linear layer's forward GEMM adds the residual (Epilogue::residual) in its epilogue.
  residual_add,
};
std::string_view fusion_name(Fusion fusion);
// What runs instead of `fusion`: the separate passes, in words.
std::string separate_passes(Fusion fusion);

// A backend's answer for one fusion on one linear layer: fused, or why not and what runs instead.
struct FusionSupport {
  bool fused = false;
  std::string fallback;  // empty where fused
};

// Whether a language model's head rounds its logits to BF16 before the loss (StorageRole::logits): when the
// head's three GEMMs are BF16, whose backward GEMMs would round their gradient to BF16 anyway.
inline bool logits_in_bf16(const LinearExecution& exec) {
  return exec.forward == GemmMode::bf16 && exec.input_gradient == GemmMode::bf16 &&
         exec.weight_gradient == GemmMode::bf16;
}

// The magnitudes of a tensor's values counted for a calibration (src/train/calibration_observer.h): each
// finite non-zero |x| in one of 16 bins per power of two (its float32 exponent and top four mantissa bits,
// bin = bits(|x|) >> 19), with the zeros, the Inf and NaN values and the largest finite magnitude beside
// them. Counts only: the same on every backend, bit for bit.
struct MagnitudeCounts {
  static constexpr int kMantissaBits = 4;
  static constexpr size_t kBins = size_t{1} << (8 + kMantissaBits);
  std::array<uint64_t, kBins> bins{};
  int64_t values = 0;
  int64_t zeros = 0;
  int64_t non_finite = 0;
  float amax = 0.0f;
  // Adds every float32 value of `values` (the reference counting that backends are held to).
  void add(std::span<const float> values);
  void add(const MagnitudeCounts& other);
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // Waits until every op enqueued so far has finished (a GPU backend's ops are asynchronous; a value copied
  // to the host is always complete).
  virtual void synchronize() {}
  // The stream this backend enqueues its work on, for a communicator that overlaps its collectives with that
  // work (Communicator::start_all_reduce_sum): a cudaStream_t on the CUDA backend; null where work is not
  // enqueued (the CPU).
  virtual void* native_stream() { return nullptr; }

  // FP8 scaling state that a backend keeps in its own memory (the CUDA backend keeps it on the device so
  // that casts read and update it without the host). fetch_scaling brings the host copy up to date;
  // publish_scaling sends a changed host copy (a restored checkpoint) to the backend. No-ops on the CPU.
  virtual void fetch_scaling(Fp8LinearState& /*state*/) {}
  virtual void publish_scaling(const Fp8LinearState& /*state*/) {}
  // The same for many layers together (a GPU waits once for all of them, not once per layer).
  virtual void fetch_scaling(std::span<Fp8LinearState* const> states) {
    for (Fp8LinearState* s : states) fetch_scaling(*s);
  }
  virtual void publish_scaling(std::span<const Fp8LinearState* const> states) {
    for (const Fp8LinearState* s : states) publish_scaling(*s);
  }
  // The same for a layer's cast telemetry: adds what the backend counted since the last fetch to the host
  // copy and zeroes its own counters (on the CPU the counts go straight to the host copy: a no-op).
  virtual void fetch_telemetry(Fp8LinearTelemetry& /*telemetry*/) {}

  // Device time per kind of op, when on: take_op_times returns the milliseconds of the work enqueued since
  // the last take (waiting for it) and starts again. Timing adds events around every op; it is for
  // benchmarks. A backend that cannot time returns zeros.
  virtual void set_op_timing(bool /*on*/) {}
  virtual OpTimes take_op_times() { return {}; }

  // Whether this backend fuses `fusion` for the linear layer `layer` as it runs now (its modes, recipe and
  // telemetry): Backend::supports says no, with the fallback that every backend runs.
  virtual FusionSupport supports(Fusion fusion, const LinearExecution& layer) const;

  // Memory. Buffers are zero-filled.
  virtual std::unique_ptr<Buffer> allocate(size_t bytes) = 0;
  // A buffer whose pages can be given back (Buffer::release): the CPU's maps host pages of its own, CUDA's
  // maps chunks of device memory into one range of addresses (the driver's virtual memory calls). The
  // default, for a backend that cannot, is allocate's.
  virtual std::unique_ptr<Buffer> allocate_releasable(size_t bytes) { return allocate(bytes); }
  virtual void copy_to_host(void* host, const void* source, size_t bytes) = 0;
  virtual void copy_from_host(void* destination, const void* host, size_t bytes) = 0;
  virtual void fill_zero(float* x, int64_t n) = 0;
  // fill_zero of x's elements offset .. offset + count - 1 for each range: the same as one call per range,
  // in one pass where the backend can. Ranges must not overlap.
  struct Range {
    int64_t offset = 0;
    int64_t count = 0;
    friend bool operator==(const Range&, const Range&) = default;
  };
  virtual void fill_zero_ranges(float* x, std::span<const Range> ranges) {
    for (const Range& r : ranges) fill_zero(x + r.offset, r.count);
  }

  // Token embedding: out [B, T, C] row (b, t) = table [V, C] row tokens[b, t] (tokens [B, T] on the
  // backend), plus positions [T, C] row t where positions has data (learned absolute positions, as GPT-2's
  // wpe; a view without data: none, as in a model with rotary positions, whose out rows are then the table's
  // rows exactly).
  virtual void embedding_forward(const TensorView& out, const int32_t* tokens, const ConstTensorView& table,
                                 const ConstTensorView& positions) = 0;
  // Accumulates dout [B, T, C] into dtable [V, C] (row tokens[b, t]) and into dpositions [T, C] (row t) where
  // dpositions has data; each element's sum in (b, t) order.
  virtual void embedding_backward(const TensorView& dtable, const TensorView& dpositions,
                                  const ConstTensorView& dout, const int32_t* tokens) = 0;

  // Normalization of each row of inp [N, C] (float32). LayerNorm: out = (x - mean) * rstd * weight + bias,
  // rstd = 1 / sqrt(variance + 1e-5), saving mean and rstd [N]. RMSNorm: out = x * rstd * weight,
  // rstd = 1 / sqrt(mean(x^2) + 1e-5), saving rstd; mean and bias are null. out [N, C] is float32, or bf16
  // where the backend stores so (storage_type): the float32 value rounded to bf16 once (to nearest, ties to
  // even). With a cast target, the op also casts its output for the forward GEMM of that FP8 linear layer
  // into the target's tensor, exactly as the layer's linear_forward would (same scale, same scaling-state
  // update, same counts and telemetry); the layer's next linear_forward takes that tensor with
  // cast_by_producer instead of casting its input. A backend that fuses Fusion::input_cast writes the codes
  // in the same pass as the output. out is then float32, or has no data where nothing else reads it
  // (input_cast_suffices): the float32 output is then not written at all.
  virtual void normalization_forward(Normalization kind, const TensorView& out, float* mean, float* rstd,
                                     const ConstTensorView& inp, const float* weight, const float* bias,
                                     const Fp8CastTarget& cast_for) = 0;
  // Accumulates into dinp [N, C], dweight and dbias [C] (RMSNorm: dbias and mean are null); dout [N, C] is
  // float32 or bf16 (read as its float32 values).
  virtual void normalization_backward(Normalization kind, float* dinp, float* dweight, float* dbias,
                                      const ConstTensorView& dout, const float* inp, const float* weight,
                                      const float* mean, const float* rstd) = 0;

  // Makes (or refreshes) the copy of weight [OC, C] that the layer's GEMMs use, as `exec` says.
  virtual void prepare_weight(std::unique_ptr<WeightCopy>& copy, const float* weight, int64_t OC, int64_t C,
                              LinearExecution& exec) = 0;
  // Weights gathered as FP8 codes (a sharded optimizer's parameters, docs/distributed.md): each rank casts
  // only its part of a weight, with the scale that the weight's amax over every rank gives, the ranks
  // gather the codes, and each then makes the weight's copy from the whole codes. A weight's part: the
  // elements begin .. end - 1 of weight [rows, cols] (row-major; may be empty), for a layer whose every
  // GEMM reading the weight runs in FP8 with one scale per tensor.
  struct WeightPart {
    std::unique_ptr<WeightCopy>* copy = nullptr;
    LinearExecution* exec = nullptr;
    const float* weight = nullptr;  // the whole weight's float32 values; only the part's are read
    int64_t rows = 0;               // OC
    int64_t cols = 0;               // C
    int64_t begin = 0;
    int64_t end = 0;
    // The weight's codes lie at codes_offset .. codes_offset + rows * cols - 1 of the codes passed along;
    // cast_weight_parts writes the part's alone, at codes_offset + begin .. codes_offset + end - 1, which
    // must lie in its buffer (codes_offset may be negative where the buffer holds a rank's codes only).
    int64_t codes_offset = 0;
  };
  // amaxes[i] (backend memory) = max |x| over parts[i]'s elements: 0 for an empty part, NaN where one is
  // NaN (as compute_amax).
  virtual void weight_part_amaxes(std::span<const WeightPart> parts, float* amaxes) = 0;
  // For each part, amaxes[i] being the whole weight's amax (the largest over the ranks): the scale that
  // prepare_weight would cast the whole weight with, were its amax amaxes[i]; the part's elements cast with
  // it into codes + codes_offset + begin ..; and the weight's scaling state moved on as prepare_weight
  // moves it, with that amax. The cast's counts and telemetry are the part's.
  virtual void cast_weight_parts(std::span<const WeightPart> parts, const float* amaxes, uint8_t* codes) = 0;
  // After the gather: each part's weight copy from the weight's whole codes at codes + codes_offset, the
  // copy prepare_weight makes (its transpose made here), with the scale cast_weight_parts chose.
  virtual void weight_copies_from_codes(std::span<const WeightPart> parts, const uint8_t* codes) = 0;
  // Fully sharded weights (docs/distributed.md, "Weight copies released after use"): each part's codes taken
  // from its weight's present copy (made by prepare_weight or weight_copies_from_codes) into
  // codes + codes_offset + begin .. + end - 1, the codes cast_weight_parts would write for the copy's scale.
  virtual void weight_part_codes(std::span<const WeightPart> parts, uint8_t* codes) = 0;
  // Gives back the memory of the parts' weight copies (their codes and transposed codes) once the work
  // enqueued so far that reads them is done; a GEMM that reads such a copy fails until
  // weight_copies_from_codes makes it again. The scaling state stays as it is.
  virtual void release_weight_copies(std::span<const WeightPart> parts) = 0;
  // bytes from source to destination, both in the backend's memory (they must not overlap).
  virtual void copy(void* destination, const void* source, size_t bytes) = 0;

  // out [N, OC] = inp [N, C] x weight [OC, C]^T + epilogue.bias (+ epilogue.residual [N, OC]): the GEMM's
  // float32 result (after its operands were rounded or cast as exec says) plus the bias. For BF16, FP16 and
  // FP8 GEMMs the bias is first rounded to the GEMM's 16-bit type (BF16 for FP8), as PyTorch autocast rounds
  // it and as cuBLASLt's FP8 epilogue takes it; a float32 GEMM adds it as it is. inp may be bf16 (attention's
  // output, where storage_type says so): the results of its float32 values. out is float32, or bf16 (the
  // float32 result, bias included, rounded once) where storage_type says so and there is no residual.
  // With a residual (a layer whose output joins the residual stream), out is float32: the reference rounds
  // the layer's output, then adds residual + output; a backend may add the residual inside the GEMM instead
  // (the CUDA backend's epilogue), in an order of its own. out must not overlap the residual or inp.
  // An FP8 forward reads its input's cast from `input` (required there): the producer's (cast_by_producer;
  // inp may then have no data, where input_cast_suffices), or the one this op makes of inp into that slot.
  // The tensor keeps the cast for the layer's backward.
  virtual void linear_forward(const TensorView& out, const ConstTensorView& inp,
                              const ConstTensorView& weight, const WeightCopy* copy, const Epilogue& epilogue,
                              LinearExecution& exec, const Fp8Operand& input = {}) = 0;
  // The last linear_forward of an FP8 layer again, for a backward that needs its output but did not keep it:
  // the same out, bit for bit (given the same residual), from the input cast that forward kept in `input`
  // (exec.keep_input_codes: the codes of x [N, C] besides the transposed ones), the same weight copy and the
  // same epilogue. Casts nothing, changes no scaling state and counts no GEMM.
  virtual void linear_recompute(const TensorView& out, const ConstTensorView& weight, const WeightCopy* copy,
                                const Epilogue& epilogue, LinearExecution& exec, const Fp8Tensor& input) = 0;
  // dinp [N, C] = dout x W (overwritten, the GEMM's float32 result, not rounded); dweight [OC, C] += dout^T x
  // inp; dbias [OC] += column sums of dout (dbias may be null). dout, inp and dinp may be bf16 where
  // storage_type says so: bf16 values are read as their float32 values, and a bf16 dinp is the float32 result
  // rounded to bf16 once. A bf16 dweight (storage_type's weight_gradient) is the GEMM's float32 result, plus
  // dweight's old value where it adds to it, rounded to bf16 once. An FP8 weight-gradient GEMM reads the
  // input's cast that the forward kept in `input`. Where a backward GEMM is FP8 (casts_gradient), dout's
  // cast is in `gradient` (required there): the producer's (cast_by_producer: activation_backward with a
  // cast target, which also added the bias gradient, so dbias is then null, and dout has no data where
  // gradient_cast_suffices), or the one this op makes of dout into that slot.
  virtual void linear_backward(const TensorView& dinp, const TensorView& dweight, float* dbias,
                               const ConstTensorView& dout, const ConstTensorView& inp,
                               const ConstTensorView& weight, const WeightCopy* copy, LinearExecution& exec,
                               const Fp8Tensor* input = nullptr, const Fp8Operand& gradient = {}) = 0;

  // How this backend stores a tensor the model would otherwise keep in float32 (StorageQuery says which):
  // Dtype::bf16 where its ops read and write that tensor in bf16 and doing so changes no result (the values
  // are rounded to bf16 anyway), which halves its bytes; Dtype::f32 otherwise (the default), the model then
  // rounding the float32 values in place (round_in_place) where it must, so that both hold the same numbers.
  virtual Dtype storage_type(const StorageQuery& /*query*/) const { return Dtype::f32; }

  // Causal self-attention over qkv [B, T, (heads + 2 kv_heads) hs] (attention_sizes; query head h reads key
  // and value head h / group()), scaled by 1 / sqrt(hs), writing out [B, T, heads hs] and the softmax
  // log-sum-exp per row, lse [B, heads, T]; no T x T matrix is kept. qkv and out are float32 or bf16 as
  // storage_type says.
  virtual void attention_forward(const TensorView& out, float* lse, const ConstTensorView& qkv,
                                 AttentionHeads heads) = 0;
  // dqkv (qkv's shape) is overwritten, a key or value head's gradient summed over the query heads that read
  // it; dqkv and dout are stored as out is.
  virtual void attention_backward(const TensorView& dqkv, const ConstTensorView& dout,
                                  const ConstTensorView& qkv, const ConstTensorView& out, const float* lse,
                                  AttentionHeads heads) = 0;
  // Rotary position embedding, in place, of the first `heads` heads of each row of x [B, T, W] (q's and k's
  // heads in attention's qkv), each hs = table.cols() wide, at position t (the row's place in its sequence):
  // for i < hs / 2, (x_i, x_{i + hs/2}) becomes (x_i cos - x_{i+hs/2} sin, x_{i+hs/2} cos + x_i sin), with
  // cos = table[t, i] and sin = table[t, hs/2 + i] (table [>= T, hs], float32; the rotate-half convention
  // of Hugging Face's Llama). `inverse` rotates by -angle instead: the backward, on the gradient. x is
  // float32 or bf16 (read as its float32 values, each result rounded once).
  virtual void rotary_embedding(const TensorView& x, const ConstTensorView& table, int64_t heads,
                                bool inverse) = 0;

  // Mixture-of-experts routing: the ops a model's MoE layer composes with its experts' linear ops
  // (docs/architecture.md). N tokens each choose k of E experts; an assignment is numbered n k + j.
  //
  // Softmax over each row of logits [N, E] (float32) into probs [N, E]; experts [N, k] the indices of each
  // row's k largest probabilities, largest first (equal ones: the lower index first); weights [N, k] those
  // probabilities divided by their sum (Mixtral's renormalized top-k; 1 where k = 1).
  virtual void top_k_softmax(const TensorView& probs, int32_t* experts, float* weights,
                             const ConstTensorView& logits, int64_t k) = 0;
  // Its backward: dlogits [N, E], overwritten, the gradient through the renormalization and the softmax of
  // dweights [N, k] (the weights' gradient), plus that of dprobs [E] added to every row's probabilities'
  // gradient (a load-balancing loss's; null: none). probs, experts and weights are the forward's.
  virtual void top_k_softmax_backward(const TensorView& dlogits, const ConstTensorView& probs,
                                      const int32_t* experts, const float* weights, const float* dweights,
                                      int64_t k, const float* dprobs) = 0;
  // Groups the N k assignments experts [N, k] (each in 0 .. E - 1) by expert, keeping their order within an
  // expert: offsets [E + 1], where expert e's rows start (each a multiple of `align`; offsets[E] the end of
  // the last); slots [grouped_rows(N, k, E, align)], the assignment each grouped row holds (-1 in the
  // padding rows that the alignment leaves, up to offsets[E]); positions [N k], the grouped row of each
  // assignment.
  virtual void group_by_expert(int32_t* offsets, int32_t* slots, int32_t* positions, const int32_t* experts,
                               int64_t N, int64_t k, int64_t E, int64_t align) = 0;
  // out [M, C] row m = scale[index[m]] (null: 1) x src [R, C] row index[m] / divisor; zero where
  // index[m] < 0. src float32; out float32, or bf16 (each value rounded once) where storage_type says so.
  // With a cast target (an expert's rows gathered for its FP8 layer), the op also casts out for that layer:
  // as its input (`cast_as` activation) exactly as normalization_forward's target does, or as its output
  // gradient (`cast_as` gradient) exactly as activation_backward's does, without a bias. out is then float32,
  // or has no data where input_cast_suffices (gradient_cast_suffices): the float32 rows are not written.
  virtual void gather_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index,
                           int64_t divisor, const float* scale, const Fp8CastTarget& cast_for,
                           TensorRole cast_as) = 0;
  // out [R, C] row r = base row r (null: zero) + the sum over j < k, in j order, of weights[r k + j] (null:
  // 1) x src [M, C] row positions[r k + j]. out may be base. float32.
  virtual void combine_rows(const TensorView& out, const float* base, const ConstTensorView& src,
                            const int32_t* positions, int64_t k, const float* weights) = 0;
  // out [R, C] row index[m] = src [M, C] row m for each m < M, the bits copied; out's other rows are left as
  // they are. The index is in backend memory, its M rows distinct and each in 0 .. R - 1. float32.
  virtual void scatter_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index) = 0;
  // out [R k]: out[r k + j] = the dot product of a [R, C] row r and src [M, C] row positions[r k + j].
  virtual void row_dots(float* out, const ConstTensorView& a, const ConstTensorView& src,
                        const int32_t* positions, int64_t k) = 0;
  // out [C] = the column sums of x [N, C] (float32; summed in float64 on the CPU, in an order of the
  // backend's own elsewhere).
  virtual void column_sums(float* out, const ConstTensorView& x) = 0;

  // An activation of inp [N, k C] (k = activation_inputs(kind): GELU, the tanh approximation, element-wise;
  // SwiGLU, out[n, i] = silu(inp[n, i]) * inp[n, C + i], silu(g) = g / (1 + exp(-g))), float32 or bf16
  // (read as its float32 values), into out [N, C], float32 or bf16 (the float32 value rounded once). With a
  // cast target,
  // the op also casts its output for that FP8 layer, as normalization_forward does; out is then float32, or
  // has no data where input_cast_suffices.
  virtual void activation_forward(Activation kind, const TensorView& out, const ConstTensorView& inp,
                                  const Fp8CastTarget& cast_for) = 0;
  // dinp [N, k C] = dout [N, C] * activation'(inp [N, k C]), overwritten (SwiGLU: d gate = dout * up *
  // silu'(gate), d up = dout * silu(gate)); inp and dout share a dtype (float32 or bf16), dinp is float32 or
  // bf16. With a cast target (a layer that casts_gradient), the op also casts dinp for
  // that layer's backward GEMMs into the target's tensor, exactly as its linear_backward would cast its dout
  // (same scale, same scaling-state update, same counts and telemetry), and adds the column sums of dinp to
  // dbias [C] (when not null) as that linear_backward would; that layer's linear_backward then takes the
  // tensor with cast_by_producer and a null dbias. A backend that fuses Fusion::gradient_cast writes the
  // cast in the same pass as dinp. dinp is then float32, or has no data where gradient_cast_suffices: the
  // float32 gradient is then not written at all, and linear_backward gets a dout without data. dbias is only
  // taken with a cast target.
  virtual void activation_backward(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                                   const ConstTensorView& dout, float* dbias,
                                   const Fp8CastTarget& cast_for) = 0;
  // gather_rows, activation_forward and activation_backward (without a bias) over row groups, each group's
  // rows cast for its own layer: exactly what the op gives called on each group with rows in turn, on that
  // group's rows (index + offsets[g] for the gather) with its target. The output has data or not as a whole:
  // where it has, every group's rows are written. The defaults make those calls; a backend may write every
  // group's casts in one pass.
  virtual void gather_rows_grouped(const TensorView& out, const ConstTensorView& src, const int32_t* index,
                                   int64_t divisor, const float* scale, const RowGroupCasts& casts,
                                   TensorRole cast_as);
  virtual void activation_forward_grouped(Activation kind, const TensorView& out, const ConstTensorView& inp,
                                          const RowGroupCasts& casts);
  virtual void activation_backward_grouped(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                                           const ConstTensorView& dout, const RowGroupCasts& casts);
  // out = a + b, element by element, over float32 tensors of the same shape; out may be a (a += b) but must
  // not overlap b otherwise.
  virtual void add(const TensorView& out, const ConstTensorView& a, const ConstTensorView& b) = 0;
  // x [n] rounded in place to `dtype`, Dtype::bf16 or Dtype::f16 (to nearest, ties to even), kept as float32.
  virtual void round_in_place(float* x, int64_t n, Dtype dtype) = 0;

  // Softmax cross-entropy over the first V of the Vp logits in each row of logits [N, Vp]: losses [N] =
  // -log p[target], targets [N] in 0 .. V - 1. When dloss != 0, the logits are overwritten with
  // d(dloss * sum(losses))/dlogits (zero in the padded columns). The logits are float32, or bf16 where
  // storage_type says so (StorageRole::logits): read as their float32 values, the gradient written rounded to
  // bf16 once.
  virtual void softmax_cross_entropy(float* losses, const TensorView& logits, const int32_t* targets,
                                     int64_t V, float dloss) = 0;

  // Optimizer and gradient utilities.
  // The float64 sum of x's squares, x float32 or bf16 (storage_type's weight_gradient; summed as its float32
  // values, in the order a float32 x of the same length takes).
  virtual double sum_of_squares(const ConstTensorView& x) = 0;
  virtual bool all_finite(const float* x, int64_t n) = 0;
  // Adds the magnitudes of x (float32, or bf16 read as its float32 values) to `counts` (host memory); waits
  // for x. By default through a copy to the host; a GPU backend counts on the device and copies the bins.
  virtual void count_magnitudes(MagnitudeCounts& counts, const ConstTensorView& x);
  virtual void scale(float* x, int64_t n, float factor) = 0;
  // AdamW on float32 master weights, p -= lr * wd * p, then the Adam step with bias-corrected moments
  // (g = grads * grad_scale), over the segments of the four tensors, each with its own weight decay: the
  // same results as one update per segment in turn. A segment that is a linear layer's weight also has its
  // copy remade, exactly as prepare_weight remakes it from the updated values. A GPU backend groups the
  // segments by what its pass writes besides params, m and v (nothing; a weight's BF16 copy; its FP8 copy
  // and transpose) and updates each group in one launch (one launch for the model's many small tensors).
  // Segments must not overlap.
  struct AdamWStep {
    float learning_rate = 0.0f;
    float beta1 = 0.0f;
    float beta2 = 0.0f;
    float eps = 0.0f;
    int64_t step = 0;         // the update's number, from 1 (the bias correction)
    float grad_scale = 1.0f;  // undoes loss scaling and applies clipping
  };
  // The float32 tensors the update reads and writes: a segment lies at the same offset in params, m and v,
  // and its gradient in grads (UpdateSegment::grad_at).
  struct OptimizerTensors {
    float* params = nullptr;
    float* m = nullptr;
    float* v = nullptr;
    const float* grads = nullptr;
  };
  // The elements offset .. offset + count - 1 of the tensors: a plain tensor, a linear layer's bias
  // (bias_of), or a linear layer's weight [rows, cols] whose copy the update remakes (copy and exec set).
  struct UpdateSegment {
    int64_t offset = 0;
    int64_t count = 0;  // rows * cols for a weight
    float weight_decay = 0.0f;
    // Where the segment's gradient starts in grads; -1: at offset, as in the other three tensors.
    int64_t grad_offset = -1;
    // The segment's learning rate is AdamWStep::learning_rate times this (its parameter group's multiplier,
    // optimizer.groups), computed in float32 as learning_rate * learning_rate_scale on every backend; the
    // weight decay's step uses the scaled rate too.
    float learning_rate_scale = 1.0f;
    // Where the segment is a linear layer's bias: that layer's weight copy, in which a GPU backend keeps the
    // bias as its forward GEMM's epilogue reads it (rounded to BF16) and writes it again in the AdamW pass.
    // Null otherwise, and ignored by backends that keep no such copy.
    WeightCopy* bias_of = nullptr;
    // Where the segment is a linear layer's weight [rows, cols]: the copy the update remakes as
    // prepare_weight (copy, OC = rows, C = cols, exec) would.
    std::unique_ptr<WeightCopy>* copy = nullptr;
    LinearExecution* exec = nullptr;
    int64_t rows = 0;  // OC
    int64_t cols = 0;  // C
    // A weight's gradient stored as bf16 (storage_type, role weight_gradient), read as its float32 values,
    // instead of the one in grads; null: in grads. Only on a backend that stores such gradients: for a
    // weight, or for a plain segment holding part of one (a sharded optimizer's shard of it).
    const void* grads_bf16 = nullptr;

    bool is_weight() const { return copy != nullptr; }
    int64_t grad_at() const { return grad_offset < 0 ? offset : grad_offset; }
  };
  virtual void optimizer_update(const AdamWStep& step, const OptimizerTensors& tensors,
                                std::span<const UpdateSegment> segments) = 0;

 protected:
  // The checks every backend makes of optimizer_update's segments (a weight's copy, execution and shape, a
  // count that is its rows * cols, no bf16 gradient but a weight's); `bf16_gradients`: whether this backend
  // reads a weight gradient stored as bf16.
  void check_segments(std::span<const UpdateSegment> segments, bool bf16_gradients) const;
};

}  // namespace octet
