// cuDNN flash attention through the backend graph API (see cudnn_attention.h).
//
// cuDNN has no single "causal attention" operation in its C API: its fused SDPA engines recognise a graph of
// elementary operations (two matmuls with a scale, a causal mask built from index generators, and a softmax
// that also writes its log-sum-exp) and compile it into one flash-attention kernel. The graphs below are that
// pattern, written out node by node; the backward's pattern also names two float32 buffers that cuDNN fills
// itself (the row sums of dO * O and the dQ accumulator), which live in octet's workspace.
#include "cudnn_attention.h"

#include <dlfcn.h>

#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include <cudnn_graph.h>
#include <fmt/format.h>

#include "octet/check.h"

namespace octet::cuda {

struct CudnnApi {
  void* library = nullptr;
  size_t (*get_version)() = nullptr;
  const char* (*get_error_string)(cudnnStatus_t) = nullptr;
  void (*get_last_error_string)(char*, size_t) = nullptr;
  cudnnStatus_t (*create)(cudnnHandle_t*) = nullptr;
  cudnnStatus_t (*destroy)(cudnnHandle_t) = nullptr;
  cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t) = nullptr;
  cudnnStatus_t (*create_descriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t*) = nullptr;
  cudnnStatus_t (*destroy_descriptor)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*set_attribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                 cudnnBackendAttributeType_t, int64_t, const void*) = nullptr;
  cudnnStatus_t (*get_attribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                 cudnnBackendAttributeType_t, int64_t, int64_t*, void*) = nullptr;
  cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t) = nullptr;

  ~CudnnApi() {
    if (library != nullptr) dlclose(library);
  }

  // Throws (ErrorKind::internal) with cuDNN's own explanation where `status` is not success.
  void check(cudnnStatus_t status, const char* what) const {
    if (status == CUDNN_STATUS_SUCCESS) return;
    std::array<char, 1024> detail{};
    if (get_last_error_string != nullptr) get_last_error_string(detail.data(), detail.size());
    throw Error(ErrorKind::internal,
                fmt::format("cuDNN: {} failed: {} {}", what, get_error_string(status), detail.data()));
  }
};

namespace {

// Owns one backend descriptor.
class Descriptor {
 public:
  Descriptor(const CudnnApi& api, cudnnBackendDescriptorType_t type) : api_(&api) {
    api.check(api.create_descriptor(type, &descriptor_), "cudnnBackendCreateDescriptor");
  }
  ~Descriptor() {
    if (descriptor_ != nullptr) (void)api_->destroy_descriptor(descriptor_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return descriptor_; }

  template <typename T>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T* values,
           int64_t count) {
    api_->check(api_->set_attribute(descriptor_, name, type, count, values), "cudnnBackendSetAttribute");
  }
  template <typename T>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T& value) {
    set(name, type, &value, 1);
  }
  void finalize(const char* what) { api_->check(api_->finalize(descriptor_), what); }

 private:
  const CudnnApi* api_;
  cudnnBackendDescriptor_t descriptor_ = nullptr;
};

using Dims = std::array<int64_t, 4>;

}  // namespace

struct CudnnPlan {
  std::vector<std::unique_ptr<Descriptor>> keep;  // tensors, operations, graph, engine config
  std::unique_ptr<Descriptor> plan;
  int64_t workspace_bytes = 0;
  int64_t engine = -1;
};

struct CudnnAttention::Plans {
  CudnnPlan forward;
  CudnnPlan backward;
};

namespace {

// Tensor ids in the variant packs.
enum : int64_t {
  kQ = 1,
  kKt,
  kV,
  kVt,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kScale,
  kNegInf,
  kOne,
  kRowDot,
  kDQAccum,
  kFirstVirtual = 100,
};

// Builds one operation graph and finds an engine without the non-deterministic note for it.
class GraphBuilder {
 public:
  GraphBuilder(const CudnnApi& api, CudnnPlan& plan) : api_(api), plan_(plan) {}

  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
                                  bool is_virtual = false, bool by_value = false) {
    Descriptor& t = keep(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, type);
    t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4);
    t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4);
    t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, uid);
    t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, alignment);
    t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, is_virtual);
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, by_value);
    t.finalize("tensor descriptor");
    return t.get();
  }
  // A float32 (or `type`) intermediate that never reaches memory.
  cudnnBackendDescriptor_t virt(const Dims& dims, const Dims& strides,
                                cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return tensor(next_virtual_++, type, dims, strides, true);
  }
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    Descriptor& m = keep(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    m.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT);
    m.finalize("matmul descriptor");
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, a);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, b);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, c);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, m.get());
    add(op, "matmul operation");
  }

  // y = mode(x, b) (b may be null for unary modes); t is the condition of BINARY_SELECT (y = t ? x : b).
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t t = nullptr, int64_t axis = -1,
                 cudnnDataType_t precision = CUDNN_DATA_FLOAT) {
    Descriptor& pw = keep(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode);
    pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, precision);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, axis);
    pw.finalize("pointwise descriptor");
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, pw.get());
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x);
    if (b != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, b);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y);
    if (t != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, t);
    add(op, "pointwise operation");
  }

  void reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Descriptor& r = keep(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, reduce);
    r.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT);
    r.finalize("reduction descriptor");
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, r.get());
    add(op, "reduction operation");
  }

  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x);
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y);
    add(op, "reshape operation");
  }

  // Finalises the graph, asks cuDNN's heuristics for engine configurations and keeps the first one that
  // carries no non-deterministic note and finalises into an execution plan. Returns false (with the reasons
  // in *why_not) where none does.
  bool build(cudnnHandle_t handle, std::string* why_not) {
    Descriptor& graph = keep(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops_.data(),
              static_cast<int64_t>(ops_.size()));
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, handle);
    const cudnnStatus_t graph_status = api_.finalize(graph.get());
    if (graph_status != CUDNN_STATUS_SUCCESS) {
      *why_not = fmt::format("the operation graph was refused ({})", api_.get_error_string(graph_status));
      return false;
    }
    Descriptor heuristics(api_, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendDescriptor_t graph_descriptor = graph.get();
    heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, graph_descriptor);
    heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, CUDNN_HEUR_MODE_A);
    heuristics.finalize("engine heuristics");
    int64_t count = 0;
    api_.check(api_.get_attribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
               "engine heuristics results");
    std::vector<std::unique_ptr<Descriptor>> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.push_back(std::make_unique<Descriptor>(api_, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(configs.back()->get());
    }
    int64_t returned = 0;
    if (count > 0) {
      api_.check(api_.get_attribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, raw.data()),
                 "engine heuristics results");
    }
    std::string reasons;
    for (int64_t i = 0; i < returned; ++i) {
      Descriptor engine(api_, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
      cudnnBackendDescriptor_t engine_raw = engine.get();
      int64_t got = 0;
      if (api_.get_attribute(raw[static_cast<size_t>(i)], CUDNN_ATTR_ENGINECFG_ENGINE,
                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &engine_raw) != CUDNN_STATUS_SUCCESS) {
        continue;
      }
      int64_t index = -1;
      (void)api_.get_attribute(engine_raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got, &index);
      std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
      int64_t note_count = 0;
      (void)api_.get_attribute(engine_raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               static_cast<int64_t>(notes.size()), &note_count, notes.data());
      bool deterministic = true;
      for (int64_t n = 0; n < note_count; ++n) {
        if (notes[static_cast<size_t>(n)] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) deterministic = false;
      }
      if (!deterministic) {
        reasons += fmt::format(" engine {}: non-deterministic;", index);
        continue;
      }
      auto plan = std::make_unique<Descriptor>(api_, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, handle);
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                raw[static_cast<size_t>(i)]);
      const cudnnStatus_t status = api_.finalize(plan->get());
      if (status != CUDNN_STATUS_SUCCESS) {
        reasons += fmt::format(" engine {}: {};", index, api_.get_error_string(status));
        continue;
      }
      api_.check(api_.get_attribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                    1, &got, &plan_.workspace_bytes),
                 "execution plan workspace size");
      plan_.plan = std::move(plan);
      plan_.engine = index;
      plan_.keep.push_back(std::move(configs[static_cast<size_t>(i)]));
      return true;
    }
    *why_not = returned == 0 ? std::string("cuDNN's heuristics offered no engine")
                             : fmt::format("no engine could run it:{}", reasons);
    return false;
  }

 private:
  Descriptor& keep(cudnnBackendDescriptorType_t type) {
    plan_.keep.push_back(std::make_unique<Descriptor>(api_, type));
    return *plan_.keep.back();
  }
  void add(Descriptor& op, const char* what) {
    op.finalize(what);
    ops_.push_back(op.get());
  }

  const CudnnApi& api_;
  CudnnPlan& plan_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

// The shapes of one attention call: B batches of NH query heads and KVH kv heads, T positions, hs = C / NH.
struct Shape {
  int64_t B, T, C, NH, KVH, hs;
  int64_t pitch() const { return C + 2 * KVH * hs; }  // a row of qkv
  bool grouped() const { return KVH != NH; }
  Dims head() const { return {B, NH, T, hs}; }
  Dims kv_head() const { return {B, KVH, T, hs}; }
  Dims kv_head_transposed() const { return {B, KVH, hs, T}; }
  Dims scores() const { return {B, NH, T, T}; }
  Dims rows() const { return {B, NH, T, 1}; }
  // q, k or v inside qkv [B, T, pitch]; and its transpose (d, t) view
  Dims qkv_strides() const { return {T * pitch(), hs, pitch(), 1}; }
  Dims qkv_strides_transposed() const { return {T * pitch(), hs, 1, pitch()}; }
  Dims out_strides() const { return {T * C, hs, C, 1}; }
  Dims packed_strides() const { return {NH * T * hs, T * hs, hs, 1}; }
  Dims kv_packed_strides() const { return {KVH * T * hs, T * hs, hs, 1}; }
  Dims score_strides() const { return {NH * T * T, T * T, T, 1}; }
  Dims score_strides_transposed() const { return {NH * T * T, T * T, 1, T}; }
  Dims row_strides() const { return {NH * T, T, 1, 1}; }
};

// scores = (q k^T) * scale, causally masked to -inf above the diagonal (row index >= column index keeps).
cudnnBackendDescriptor_t masked_scores(GraphBuilder& g, const Shape& s, cudnnBackendDescriptor_t scaled,
                                       cudnnBackendDescriptor_t neg_inf) {
  const Dims dims = s.scores(), strides = s.score_strides();
  cudnnBackendDescriptor_t row = g.virt(dims, strides, CUDNN_DATA_INT32);
  cudnnBackendDescriptor_t col = g.virt(dims, strides, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, row, nullptr, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, col, nullptr, 3);
  cudnnBackendDescriptor_t keep = g.virt(dims, strides, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, nullptr, -1, CUDNN_DATA_BOOLEAN);
  cudnnBackendDescriptor_t masked = g.virt(dims, strides);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, neg_inf, masked, keep);
  return masked;
}

void build_forward(const CudnnApi& api, cudnnHandle_t handle, const Shape& s, CudnnPlan& plan) {
  GraphBuilder g(api, plan);
  const auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, s.head(), s.qkv_strides());
  const auto kt = g.tensor(kKt, CUDNN_DATA_BFLOAT16, s.kv_head_transposed(), s.qkv_strides_transposed());
  const auto v = g.tensor(kV, CUDNN_DATA_BFLOAT16, s.kv_head(), s.qkv_strides());
  const auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, s.head(), s.out_strides());
  const auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, s.rows(), s.row_strides());
  const auto scale = g.scalar(kScale);
  const auto neg_inf = g.scalar(kNegInf);

  const Dims sd = s.scores(), ss = s.score_strides(), rd = s.rows(), rs = s.row_strides();
  const auto raw = g.virt(sd, ss);
  g.matmul(q, kt, raw);
  const auto scaled = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, raw, scale, scaled);
  const auto masked = masked_scores(g, s, scaled, neg_inf);
  const auto row_max = g.virt(rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, row_max);
  const auto shifted = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, masked, row_max, shifted);
  const auto exps = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, exps);
  const auto row_sum = g.virt(rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, exps, row_sum);
  const auto log_sum = g.virt(rd, rs);
  g.pointwise(CUDNN_POINTWISE_LOG, row_sum, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, row_max, log_sum, stats);
  const auto probs = g.virt(sd, ss, CUDNN_DATA_BFLOAT16);
  g.pointwise(CUDNN_POINTWISE_DIV, exps, row_sum, probs);
  g.matmul(probs, v, o);
  std::string why;
  if (!g.build(handle, &why)) throw Error(ErrorKind::internal, "cuDNN attention forward: " + why);
}

void build_backward(const CudnnApi& api, cudnnHandle_t handle, const Shape& s, CudnnPlan& plan) {
  GraphBuilder g(api, plan);
  const auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, s.head(), s.qkv_strides());
  const auto kt = g.tensor(kKt, CUDNN_DATA_BFLOAT16, s.kv_head_transposed(), s.qkv_strides_transposed());
  const auto vt = g.tensor(kVt, CUDNN_DATA_BFLOAT16, s.kv_head_transposed(), s.qkv_strides_transposed());
  const auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, s.head(), s.out_strides());
  const auto dout = g.tensor(kDO, CUDNN_DATA_BFLOAT16, s.head(), s.out_strides());
  const auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, s.rows(), s.row_strides());
  const auto dq = g.tensor(kDQ, CUDNN_DATA_BFLOAT16, s.head(), s.qkv_strides());
  const auto dk = g.tensor(kDK, CUDNN_DATA_BFLOAT16, s.kv_head(), s.qkv_strides());
  const auto dv = g.tensor(kDV, CUDNN_DATA_BFLOAT16, s.kv_head(), s.qkv_strides());
  const auto scale = g.scalar(kScale);
  const auto neg_inf = g.scalar(kNegInf);
  const auto one = g.scalar(kOne);
  const auto row_dot = g.tensor(kRowDot, CUDNN_DATA_FLOAT, s.rows(), s.row_strides());
  const auto dq_accum = g.tensor(kDQAccum, CUDNN_DATA_FLOAT, s.head(), s.packed_strides());

  const Dims sd = s.scores(), ss = s.score_strides(), rd = s.rows(), rs = s.row_strides();
  // dP = dO V^T and the scores again
  const auto dprobs = g.virt(sd, ss);
  g.matmul(dout, vt, dprobs);
  const auto raw = g.virt(sd, ss);
  g.matmul(q, kt, raw);
  // D = rowsum(dO * O)
  const auto dout_out = g.virt(s.head(), s.packed_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, dout, o, dout_out);
  // k itself, for dQ = dS k (KVH heads, broadcast over the query heads as in the forward's products)
  const auto k = g.virt(s.kv_head(), s.kv_packed_strides());
  g.reshape(kt, k);
  // P = exp(scores - lse), masked
  const auto scaled = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, raw, scale, scaled);
  const auto shifted = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, shifted);
  const auto masked = masked_scores(g, s, shifted, neg_inf);
  const auto probs = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, probs);
  // dV = P^T dO
  const auto probs_t = g.virt(sd, s.score_strides_transposed(), CUDNN_DATA_BFLOAT16);
  g.reshape(probs, probs_t);
  // Grouped-query: each query head's product, then the sum over the group (cuDNN's frontend builds dK and dV
  // so: a per-query-head intermediate reduced onto the kv heads).
  if (s.grouped()) {
    const auto dv_heads = g.virt(s.head(), s.packed_strides(), CUDNN_DATA_BFLOAT16);
    g.matmul(probs_t, dout, dv_heads);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_heads, dv);
  } else {
    g.matmul(probs_t, dout, dv);
  }
  const auto dot = g.virt(rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dout_out, dot);
  g.pointwise(CUDNN_POINTWISE_MUL, dot, one, row_dot);
  // dS = P * (dP - D) * scale
  const auto centred = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, dprobs, row_dot, centred);
  const auto dscores = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, centred, probs, dscores);
  const auto dscaled = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, dscores, scale, dscaled);
  // dQ = dS k (accumulated in float32, then rounded), dK = dS^T q
  g.matmul(dscaled, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, dq);
  const auto dscaled_t = g.virt(sd, s.score_strides_transposed(), CUDNN_DATA_BFLOAT16);
  g.reshape(dscaled, dscaled_t);
  if (s.grouped()) {
    const auto dk_heads = g.virt(s.head(), s.packed_strides(), CUDNN_DATA_BFLOAT16);
    g.matmul(dscaled_t, q, dk_heads);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_heads, dk);
  } else {
    g.matmul(dscaled_t, q, dk);
  }
  std::string why;
  if (!g.build(handle, &why)) throw Error(ErrorKind::internal, "cuDNN attention backward: " + why);
}

template <typename F>
bool load_symbol(void* library, const char* name, F*& out, std::string* missing) {
  out = reinterpret_cast<F*>(dlsym(library, name));
  if (out == nullptr && missing->empty()) *missing = name;
  return out != nullptr;
}

size_t align_up(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

std::unique_ptr<CudnnAttention> CudnnAttention::load(std::string* why_not) {
  void* library = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    *why_not = fmt::format(
        "libcudnn.so.9 could not be loaded ({}); install cuDNN 9 or put its lib directory on "
        "LD_LIBRARY_PATH (PyTorch's wheel ships one under site-packages/nvidia/cudnn/lib)",
        dlerror());
    return nullptr;
  }
  auto api = std::make_unique<CudnnApi>();
  api->library = library;
  std::string missing;
  load_symbol(library, "cudnnGetVersion", api->get_version, &missing);
  load_symbol(library, "cudnnGetErrorString", api->get_error_string, &missing);
  load_symbol(library, "cudnnGetLastErrorString", api->get_last_error_string, &missing);
  load_symbol(library, "cudnnCreate", api->create, &missing);
  load_symbol(library, "cudnnDestroy", api->destroy, &missing);
  load_symbol(library, "cudnnSetStream", api->set_stream, &missing);
  load_symbol(library, "cudnnBackendCreateDescriptor", api->create_descriptor, &missing);
  load_symbol(library, "cudnnBackendDestroyDescriptor", api->destroy_descriptor, &missing);
  load_symbol(library, "cudnnBackendFinalize", api->finalize, &missing);
  load_symbol(library, "cudnnBackendSetAttribute", api->set_attribute, &missing);
  load_symbol(library, "cudnnBackendGetAttribute", api->get_attribute, &missing);
  load_symbol(library, "cudnnBackendExecute", api->execute, &missing);
  if (!missing.empty()) {
    *why_not = fmt::format("libcudnn.so.9 has no {}", missing);
    return nullptr;
  }
  const size_t version = api->get_version();
  if (version < 90000) {
    *why_not = fmt::format("cuDNN {} is older than 9.0", version);
    return nullptr;
  }
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t status = api->create(&handle);
  if (status != CUDNN_STATUS_SUCCESS) {
    *why_not = fmt::format("cudnnCreate failed: {}", api->get_error_string(status));
    return nullptr;
  }
  std::unique_ptr<CudnnAttention> attention(new CudnnAttention());
  attention->api_ = std::move(api);
  attention->handle_ = handle;
  attention->version_ = fmt::format("{}.{}.{}", version / 10000, version / 100 % 100, version % 100);
  return attention;
}

CudnnAttention::~CudnnAttention() {
  if (zeroing_ != nullptr) (void)cudaStreamSynchronize(zeroing_->get());  // before the accumulator goes
  if (used_ != nullptr) (void)cudaEventDestroy(used_);
  if (zeroed_ != nullptr) (void)cudaEventDestroy(zeroed_);
  plans_.clear();  // before the handle and the library go
  if (handle_ != nullptr) (void)api_->destroy(static_cast<cudnnHandle_t>(handle_));
}

CudnnAttention::Plans& CudnnAttention::plans_for(int64_t B, int64_t T, int64_t C, int64_t NH, int64_t KVH) {
  const auto found = plans_.find(Key{B, T, C, NH, KVH});
  OCTET_CHECK(found != plans_.end(), "cuDNN attention: no plan for B={} T={} C={} NH={} KVH={}", B, T, C, NH,
              KVH);
  return *found->second;
}

bool CudnnAttention::supports(int64_t B, int64_t T, int64_t C, int64_t NH, int64_t KVH,
                              std::string* why_not) {
  if (plans_.count(Key{B, T, C, NH, KVH}) > 0) return true;
  if (NH <= 0 || C % NH != 0 || (C / NH) % 8 != 0 || C / NH > 128 || (C * 2) % 16 != 0) {
    *why_not = fmt::format("head size C / NH = {} / {} is not a multiple of 8 up to 128", C, NH);
    return false;
  }
  if (KVH <= 0 || NH % KVH != 0) {
    *why_not = fmt::format("{} kv heads do not divide {} query heads", KVH, NH);
    return false;
  }
  const Shape shape{B, T, C, NH, KVH, C / NH};
  auto plans = std::make_unique<Plans>();
  try {
    build_forward(*api_, static_cast<cudnnHandle_t>(handle_), shape, plans->forward);
    build_backward(*api_, static_cast<cudnnHandle_t>(handle_), shape, plans->backward);
  } catch (const Error& e) {
    *why_not = e.what();
    return false;
  }
  plans_.emplace(Key{B, T, C, NH, KVH}, std::move(plans));
  return true;
}

std::string CudnnAttention::engines(int64_t B, int64_t T, int64_t C, int64_t NH, int64_t KVH) {
  const Plans& plans = plans_for(B, T, C, NH, KVH);
  return fmt::format("forward engine {}, backward engine {}", plans.forward.engine, plans.backward.engine);
}

void* CudnnAttention::reserve_workspace(size_t bytes, cudaStream_t stream) {
  if (workspace_.size() < bytes) {
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
    workspace_ = DeviceBuffer<uint8_t>();
    workspace_ = DeviceBuffer<uint8_t>(bytes);
  }
  return workspace_.data();
}

void* CudnnAttention::zeroed_accumulator(size_t bytes, cudaStream_t stream) {
  if (accumulator_.size() < bytes) {
    // Nothing may still read or zero the old one.
    if (zeroing_ != nullptr) zeroing_->synchronize();
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
    accumulator_ = DeviceBuffer<uint8_t>();
    accumulator_ = DeviceBuffer<uint8_t>(bytes);
    accumulator_zeroed_ = false;
  }
  if (accumulator_zeroed_) {
    OCTET_CUDA_CHECK(cudaStreamWaitEvent(stream, zeroed_, 0));
  } else {
    OCTET_CUDA_CHECK(cudaMemsetAsync(accumulator_.data(), 0, accumulator_.size(), stream));
  }
  accumulator_zeroed_ = false;  // the backward about to be queued adds into it
  return accumulator_.data();
}

void CudnnAttention::zero_accumulator_after(cudaStream_t stream) {
  if (zeroing_ == nullptr) {
    zeroing_ = std::make_unique<Stream>();
    OCTET_CUDA_CHECK(cudaEventCreateWithFlags(&used_, cudaEventDisableTiming));
    OCTET_CUDA_CHECK(cudaEventCreateWithFlags(&zeroed_, cudaEventDisableTiming));
  }
  OCTET_CUDA_CHECK(cudaEventRecord(used_, stream));
  OCTET_CUDA_CHECK(cudaStreamWaitEvent(zeroing_->get(), used_, 0));
  OCTET_CUDA_CHECK(cudaMemsetAsync(accumulator_.data(), 0, accumulator_.size(), zeroing_->get()));
  OCTET_CUDA_CHECK(cudaEventRecord(zeroed_, zeroing_->get()));
  accumulator_zeroed_ = true;
}

namespace {

void execute(const CudnnApi& api, cudnnHandle_t handle, const CudnnPlan& plan, const int64_t* uids,
             void* const* pointers, int64_t count, void* workspace) {
  Descriptor pack(api, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids, count);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers, count);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, workspace);
  pack.finalize("variant pack");
  api.check(api.execute(handle, plan.plan->get(), pack.get()), "cudnnBackendExecute");
}

}  // namespace

void CudnnAttention::forward(uint16_t* out, float* lse, const uint16_t* qkv, int64_t B, int64_t T, int64_t C,
                             int64_t NH, int64_t KVH, cudaStream_t stream) {
  if (B == 0 || T == 0) return;
  const CudnnPlan& plan = plans_for(B, T, C, NH, KVH).forward;
  const int64_t kv_C = KVH * (C / NH);
  const auto cudnn = static_cast<cudnnHandle_t>(handle_);
  api_->check(api_->set_stream(cudnn, stream), "cudnnSetStream");
  float scale = 1.0f / std::sqrt(static_cast<float>(C / NH));
  float neg_inf = -std::numeric_limits<float>::infinity();
  void* workspace = reserve_workspace(static_cast<size_t>(plan.workspace_bytes), stream);
  const int64_t uids[] = {kQ, kKt, kV, kO, kStats, kScale, kNegInf};
  void* pointers[] = {const_cast<uint16_t*>(qkv),
                      const_cast<uint16_t*>(qkv + C),
                      const_cast<uint16_t*>(qkv + C + kv_C),
                      out,
                      lse,
                      &scale,
                      &neg_inf};
  execute(*api_, cudnn, plan, uids, pointers, 7, workspace);
}

void CudnnAttention::backward(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const uint16_t* out,
                              const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t KVH,
                              cudaStream_t stream) {
  if (B == 0 || T == 0) return;
  const CudnnPlan& plan = plans_for(B, T, C, NH, KVH).backward;
  const int64_t kv_C = KVH * (C / NH);
  const auto cudnn = static_cast<cudnnHandle_t>(handle_);
  api_->check(api_->set_stream(cudnn, stream), "cudnnSetStream");
  float scale = 1.0f / std::sqrt(static_cast<float>(C / NH));
  float neg_inf = -std::numeric_limits<float>::infinity();
  float one = 1.0f;
  const size_t row_dot_bytes = align_up(static_cast<size_t>(B * NH * T) * sizeof(float));
  const size_t accum_bytes = align_up(static_cast<size_t>(B * T * C) * sizeof(float));
  auto* base = static_cast<uint8_t*>(
      reserve_workspace(row_dot_bytes + static_cast<size_t>(plan.workspace_bytes), stream));
  void* accum = zeroed_accumulator(accum_bytes, stream);
  const int64_t uids[] = {kQ,  kKt, kVt,    kO,      kDO,  kStats,  kDQ,
                          kDK, kDV, kScale, kNegInf, kOne, kRowDot, kDQAccum};
  void* pointers[] = {const_cast<uint16_t*>(qkv),
                      const_cast<uint16_t*>(qkv + C),
                      const_cast<uint16_t*>(qkv + C + kv_C),
                      const_cast<uint16_t*>(out),
                      const_cast<uint16_t*>(dout),
                      const_cast<float*>(lse),
                      dqkv,
                      dqkv + C,
                      dqkv + C + kv_C,
                      &scale,
                      &neg_inf,
                      &one,
                      base,
                      accum};
  execute(*api_, cudnn, plan, uids, pointers, 14, base + row_dot_bytes);
  zero_accumulator_after(stream);
}

}  // namespace octet::cuda
