// The FP8 layers' scaling states on the device (device_scaling.h): made with a layer's weight copy from the
// host state, mapped from the host states and telemetry, moved to and from the host when asked
// (fetch_scaling, publish_scaling, fetch_telemetry), and updated after each cast: begin_cast prepares the
// scale a cast reads from device memory, end_cast records its update, and one kernel applies every pending
// update (apply_scaling_updates), so that nothing waits for the host inside a step. cast_operand is the
// unfused cast of a layer's operand between the two.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <iterator>

#include "cuda_backend_impl.h"

namespace octet::cuda::backend_internal {
namespace {

RecipeParameters recipe_parameters(const ScalingRecipe& recipe) {
  RecipeParameters p{recipe.kind(), 0, false};
  switch (recipe.kind()) {
    case RecipeKind::current:
      p.margin = static_cast<const CurrentScaling&>(recipe).margin();
      break;
    case RecipeKind::delayed: {
      const auto& d = static_cast<const DelayedScaling&>(recipe);
      OCTET_REQUIRE(d.history_length() <= kMaxHistory,
                    "the CUDA backend keeps amax histories of at most {} steps, the recipe asks for {}",
                    kMaxHistory, d.history_length());
      p.margin = d.margin();
      p.most_recent = d.algorithm() == AmaxAlgorithm::most_recent;
      break;
    }
    case RecipeKind::static_scale:  // each operand's scale is its state's (a calibrated one, or the recipe's)
      break;
    case RecipeKind::block:
    case RecipeKind::mxfp8:
      OCTET_REQUIRE(false,
                    "fp8.recipe = \"{}\" is not supported on the CUDA backend yet (its GEMMs need per-block "
                    "scales in the tensor cores' main loop); use \"delayed\", \"current\" or \"static\" on "
                    "the GPU, or train.device = \"cpu\"",
                    recipe_name(recipe.kind()));
      break;
  }
  return p;
}

// scale_from_amax of src/numerics/scaling.cpp, in the same double arithmetic.
__device__ float device_scale_from_amax(float amax, float fp8_max, int margin, float previous,
                                        bool* degenerate) {
  if (!(amax > 0.0f) || !isfinite(amax)) {
    *degenerate = true;
    return previous;
  }
  *degenerate = false;
  const double scale = static_cast<double>(fp8_max) / static_cast<double>(amax) / ldexp(1.0, margin);
  return scale > static_cast<double>(FLT_MAX) ? FLT_MAX : static_cast<float>(scale);
}

// A cast's results before a part of the tensor is cast: the whole tensor's amax, no counts.
__global__ void seed_results_kernel(CastResults* results, const float* amax) {
  *results = CastResults{};
  results->amax = *amax;
}

// ScalingRecipe::cast_scale: the scale this cast uses. `pre` holds the tensor's amax for current scaling.
__global__ void prepare_scale_kernel(DeviceLayerState* s, int operand, RecipeParameters r, float fp8_max,
                                     const CastResults* pre, float* out) {
  const DeviceTensorScaling& t = s->tensor[operand];
  bool unused = false;
  switch (r.kind) {
    case RecipeKind::current:
      *out = device_scale_from_amax(pre->amax, fp8_max, r.margin, t.scale, &unused);
      break;
    default:  // delayed and static: the state's scale
      *out = t.scale;
      break;
  }
}

// ScalingRecipe::update after a cast, and the cast's telemetry.
__device__ void apply_scaling_update(DeviceLayerState* s, int operand, RecipeParameters r, float fp8_max,
                                     unsigned long long elements, bool update, bool count) {
  DeviceTensorScaling& t = s->tensor[operand];
  const CastResults& c = s->results[operand];
  if (count) {
    DeviceCastTelemetry& tel = s->telemetry[operand];
    tel.casts += 1;
    tel.elements += elements;
    tel.nonzero += c.nonzero;
    tel.saturated += c.saturated;
    tel.underflowed += c.underflowed;
  }
  if (!update) return;
  const float amax = c.amax;
  bool degenerate = false;
  switch (r.kind) {
    case RecipeKind::current:
      t.scale = device_scale_from_amax(amax, fp8_max, r.margin, t.scale, &degenerate);
      t.scale_inv = __fdiv_rn(1.0f, t.scale);
      t.last_amax = amax;
      t.updates += 1;
      if (degenerate) t.degenerate += 1;
      break;
    case RecipeKind::delayed: {
      t.last_amax = amax;
      t.updates += 1;
      if (!isfinite(amax)) {
        t.degenerate += 1;
        break;
      }
      for (int i = t.history_length - 1; i > 0; --i) t.history[i] = t.history[i - 1];
      t.history[0] = amax;
      float window = t.history[0];
      if (!r.most_recent) {
        for (int i = 1; i < t.history_length; ++i) window = t.history[i] > window ? t.history[i] : window;
      }
      t.scale = device_scale_from_amax(window, fp8_max, r.margin, t.scale, &degenerate);
      t.scale_inv = __fdiv_rn(1.0f, t.scale);
      if (degenerate) t.degenerate += 1;
      break;
    }
    case RecipeKind::static_scale:  // the state's scale stays
      t.scale_inv = __fdiv_rn(1.0f, t.scale);
      t.last_amax = amax;
      t.updates += 1;
      if (!(amax > 0.0f) || !isfinite(amax)) t.degenerate += 1;
      break;
    default:
      break;
  }
}

// As many as fit a kernel's parameters (32 KB on Hopper): one launch covers a 1.5B model's every operand.
constexpr int kMaxScalingUpdates = 640;
struct ScalingUpdates {
  int count;
  ScalingUpdate entry[kMaxScalingUpdates];
};

// Every pending scaling update at once, one thread each: each entry is a different operand (an operand is
// never cast twice before its update is applied), so the threads touch disjoint state.
// Layer records between their places and one packed array (pack: to it; otherwise from it), one block each.
__global__ void move_states_kernel(DeviceLayerState* const* records, DeviceLayerState* packed, bool pack) {
  static_assert(sizeof(DeviceLayerState) % sizeof(uint4) == 0, "layer records of whole 16-byte words");
  constexpr int kWords = static_cast<int>(sizeof(DeviceLayerState) / sizeof(uint4));
  DeviceLayerState* record = records[blockIdx.x];
  const auto* from = reinterpret_cast<const uint4*>(pack ? record : packed + blockIdx.x);
  auto* to = reinterpret_cast<uint4*>(pack ? packed + blockIdx.x : record);
  for (int w = static_cast<int>(threadIdx.x); w < kWords; w += static_cast<int>(blockDim.x)) to[w] = from[w];
}

__global__ void update_scaling_kernel(const ScalingUpdates updates) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= updates.count) return;
  const ScalingUpdate& u = updates.entry[i];
  if (u.record_copy_scale) u.state->weight_copy_scale = u.state->tensor[u.operand].scale;
  apply_scaling_update(u.state, u.operand, u.recipe, u.fp8_max, u.elements, u.update, u.count);
  u.state->results[u.operand] = CastResults{};  // read: ready for the operand's next cast
}

// The cast's signal and quantization-noise energies over its finite inputs (noise = x - code * scale_inv, the
// dequantized value in float32 as octet::dequantize computes it), added to the operand's telemetry. Only
// when telemetry asks for the SQNR: it is one more read of the tensor.
__global__ void sqnr_kernel(const float* x, const uint8_t* codes, int64_t n, Dtype format,
                            const float* scale_inv, DeviceCastTelemetry* telemetry) {
  const MinifloatSpec spec = minifloat_spec(format);
  const float inverse = *scale_inv;
  double signal = 0.0, noise = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    if (!isfinite(v)) continue;
    const double e = static_cast<double>(v) - static_cast<double>(__fmul_rn(decode(spec, codes[i]), inverse));
    signal += static_cast<double>(v) * static_cast<double>(v);
    noise += e * e;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    signal += __shfl_xor_sync(0xFFFFFFFFu, signal, offset);
    noise += __shfl_xor_sync(0xFFFFFFFFu, noise, offset);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&telemetry->signal_energy, signal);
    atomicAdd(&telemetry->noise_energy, noise);
  }
}

}  // namespace

void forget_layer(CudaBackend* backend, const DeviceLayer* layer) {
  backend->forget(layer);
}

CudaBackend::Layer& CudaBackend::layer_of(LinearExecution& exec, CudaWeightCopy& copy) {
  OCTET_CHECK(exec.recipe != nullptr && exec.state != nullptr, "an FP8 layer with a recipe and a state");
  if (copy.layer == nullptr) {
    const RecipeParameters recipe = recipe_parameters(*exec.recipe);  // refuses recipes the GPU lacks
    copy.layer = std::make_unique<Layer>();
    copy.layer->recipe = recipe;
    copy.owner = this;
    OCTET_CUDA_CHECK(cudaMemsetAsync(copy.layer->device, 0, sizeof(DeviceLayerState), stream_));
    copy.layer->results_zeroed = (1u << kActivation) | (1u << kWeight) | (1u << kGradient);
    layers_[exec.state] = copy.layer.get();
    publish_scaling(*exec.state);
  }
  layers_[exec.state] = copy.layer.get();
  if (exec.telemetry != nullptr) telemetry_layers_[exec.telemetry] = copy.layer.get();
  return *copy.layer;
}

CudaBackend::Layer& CudaBackend::prepared_layer(LinearExecution& exec, const CudaWeightCopy* copy) {
  OCTET_CHECK(copy != nullptr && copy->layer != nullptr, "an FP8 weight copy with its device state");
  layers_[exec.state] = copy->layer.get();
  if (exec.telemetry != nullptr) telemetry_layers_[exec.telemetry] = copy->layer.get();
  return *copy->layer;
}

CudaBackend::Layer& CudaBackend::mapped_layer(LinearExecution& exec) {
  const auto it = layers_.find(exec.state);
  OCTET_CHECK(it != layers_.end(), "an FP8 layer whose weight copy was prepared");
  if (exec.telemetry != nullptr) telemetry_layers_[exec.telemetry] = it->second;
  return *it->second;
}

namespace {

// The host's scaling state of a layer written into its device record, and read back.
void write_device_state(const Fp8LinearState& state, DeviceLayerState& host) {
  const ScalingState* operands[3] = {&state.activation, &state.weight, &state.gradient};
  for (int i = 0; i < 3; ++i) {
    const ScalingState& s = *operands[i];
    DeviceTensorScaling& d = host.tensor[i];
    OCTET_REQUIRE(s.amax_history.size() <= static_cast<size_t>(kMaxHistory),
                  "an amax history of {} steps; the CUDA backend keeps at most {}", s.amax_history.size(),
                  kMaxHistory);
    d.scale = s.scale;
    d.scale_inv = s.scale_inv;
    d.last_amax = s.last_amax;
    d.history_length = static_cast<int32_t>(s.amax_history.size());
    d.updates = static_cast<unsigned long long>(s.updates);
    d.degenerate = static_cast<unsigned long long>(s.degenerate_amax);
    std::fill(std::begin(d.history), std::end(d.history), 0.0f);
    std::copy(s.amax_history.begin(), s.amax_history.end(), d.history);
  }
  host.weight_copy_scale = state.weight_copy_scale;
}

void read_device_state(const DeviceLayerState& host, Fp8LinearState& state) {
  ScalingState* operands[3] = {&state.activation, &state.weight, &state.gradient};
  for (int i = 0; i < 3; ++i) {
    ScalingState& s = *operands[i];
    const DeviceTensorScaling& d = host.tensor[i];
    s.scale = d.scale;
    s.scale_inv = d.scale_inv;
    s.last_amax = d.last_amax;
    s.amax_history.assign(d.history, d.history + d.history_length);
    s.updates = static_cast<int64_t>(d.updates);
    s.degenerate_amax = static_cast<int64_t>(d.degenerate);
  }
  state.weight_copy_scale = host.weight_copy_scale;
}

}  // namespace

DeviceLayerState* CudaBackend::pinned_layer_states(size_t count) {
  if (pinned_states_capacity_ < count) {
    if (pinned_states_ != nullptr) OCTET_CUDA_CHECK(cudaFreeHost(pinned_states_));
    if (pinned_state_addresses_ != nullptr) OCTET_CUDA_CHECK(cudaFreeHost(pinned_state_addresses_));
    pinned_states_ = nullptr;
    pinned_state_addresses_ = nullptr;
    OCTET_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned_states_), count * sizeof(DeviceLayerState)));
    OCTET_CUDA_CHECK(
        cudaMallocHost(reinterpret_cast<void**>(&pinned_state_addresses_), count * sizeof(DeviceLayerState*)));
    pinned_states_capacity_ = count;
  }
  return pinned_states_;
}

void CudaBackend::publish_scaling(const Fp8LinearState& state) {
  const Fp8LinearState* one[1] = {&state};
  publish_scaling(std::span<const Fp8LinearState* const>(one));
}

void CudaBackend::fetch_scaling(Fp8LinearState& state) {
  Fp8LinearState* one[1] = {&state};
  fetch_scaling(std::span<Fp8LinearState* const>(one));
}

DeviceLayerState* CudaBackend::read_layer_states(std::span<const Fp8LinearState* const> states,
                                                 std::vector<std::pair<size_t, DeviceLayerState*>>& found) {
  apply_scaling_updates();
  found.clear();
  for (size_t i = 0; i < states.size(); ++i) {
    const auto it = layers_.find(states[i]);
    if (it != layers_.end()) found.emplace_back(i, it->second->device);
  }
  if (found.empty()) return nullptr;
  const size_t n = found.size();
  DeviceLayerState* host = pinned_layer_states(n);
  for (size_t i = 0; i < n; ++i) pinned_state_addresses_[i] = found[i].second;
  auto* addresses = state_addresses_.as<DeviceLayerState*>(n, stream_);
  auto* packed = state_staging_.as<DeviceLayerState>(n, stream_);
  OCTET_CUDA_CHECK(cudaMemcpyAsync(addresses, pinned_state_addresses_, n * sizeof(DeviceLayerState*),
                                   cudaMemcpyHostToDevice, stream_));
  move_states_kernel<<<static_cast<unsigned>(n), 128, 0, stream_>>>(addresses, packed, true);
  OCTET_CUDA_CHECK_LAUNCH("move_states_kernel");
  OCTET_CUDA_CHECK(cudaMemcpyAsync(host, packed, n * sizeof(DeviceLayerState), cudaMemcpyDeviceToHost, stream_));
  OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return host;
}

void CudaBackend::write_layer_states(const std::vector<std::pair<size_t, DeviceLayerState*>>& found) {
  const size_t n = found.size();
  if (n == 0) return;
  // state_addresses_ holds found's records since read_layer_states, which waited for its copy.
  auto* addresses = state_addresses_.as<DeviceLayerState*>(n, stream_);
  auto* packed = state_staging_.as<DeviceLayerState>(n, stream_);
  OCTET_CUDA_CHECK(
      cudaMemcpyAsync(packed, pinned_states_, n * sizeof(DeviceLayerState), cudaMemcpyHostToDevice, stream_));
  move_states_kernel<<<static_cast<unsigned>(n), 128, 0, stream_>>>(addresses, packed, false);
  OCTET_CUDA_CHECK_LAUNCH("move_states_kernel");
  OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::publish_scaling(std::span<const Fp8LinearState* const> states) {
  // A layer not mapped yet is made with its weight copy, from the host state as it is then. The others' device
  // records are read first (the telemetry in them stays), then written, each direction with one wait.
  std::vector<std::pair<size_t, DeviceLayerState*>> found;
  DeviceLayerState* host = read_layer_states(states, found);
  for (size_t i = 0; i < found.size(); ++i) write_device_state(*states[found[i].first], host[i]);
  write_layer_states(found);
}

void CudaBackend::fetch_scaling(std::span<Fp8LinearState* const> states) {
  // A layer never used on the device keeps its host copy, which is its state.
  const std::vector<const Fp8LinearState*> read(states.begin(), states.end());
  std::vector<std::pair<size_t, DeviceLayerState*>> found;
  const DeviceLayerState* host = read_layer_states(read, found);
  for (size_t i = 0; i < found.size(); ++i) read_device_state(host[i], *states[found[i].first]);
}

void CudaBackend::fetch_telemetry(Fp8LinearTelemetry& telemetry) {
  apply_scaling_updates();
  auto it = telemetry_layers_.find(&telemetry);
  if (it == telemetry_layers_.end()) return;
  DeviceCastTelemetry device[3];
  DeviceLayerState* d = it->second->device;
  OCTET_CUDA_CHECK(cudaMemcpyAsync(device, d->telemetry, sizeof(device), cudaMemcpyDeviceToHost, stream_));
  OCTET_CUDA_CHECK(cudaMemsetAsync(d->telemetry, 0, sizeof(device), stream_));
  OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  CastTelemetry* host[3] = {&telemetry.activation, &telemetry.weight, &telemetry.gradient};
  for (int i = 0; i < 3; ++i) {
    host[i]->casts += static_cast<int64_t>(device[i].casts);
    host[i]->elements += static_cast<int64_t>(device[i].elements);
    host[i]->nonzero += static_cast<int64_t>(device[i].nonzero);
    host[i]->saturated += static_cast<int64_t>(device[i].saturated);
    host[i]->underflowed += static_cast<int64_t>(device[i].underflowed);
    host[i]->signal_energy += device[i].signal_energy;
    host[i]->noise_energy += device[i].noise_energy;
  }
}

const float* CudaBackend::begin_cast(Layer& layer, int operand, Dtype format, const float* x, int64_t n,
                                     float* slot) {
  if ((layer.pending & (1u << operand)) != 0) apply_scaling_updates();
  DeviceLayerState* s = layer.device;
  if (layer.recipe.kind == RecipeKind::delayed) return &s->tensor[operand].scale;
  if (layer.recipe.kind == RecipeKind::current) {
    amax_only(x, n, &s->results[operand], stream_);
    layer.results_zeroed &= ~(1u << operand);
  }
  prepare_scale_kernel<<<1, 1, 0, stream_>>>(s, operand, layer.recipe, dtype_info(format).max_finite,
                                             &s->results[operand], slot);
  OCTET_CUDA_CHECK_LAUNCH("prepare_scale_kernel");
  return slot;
}

void CudaBackend::end_cast(Layer& layer, int operand, Dtype format, int64_t n, bool update, bool count) {
  if (!update && !count) return;
  ScalingUpdate u{};
  u.state = layer.device;
  u.recipe = layer.recipe;
  u.fp8_max = dtype_info(format).max_finite;
  u.operand = operand;
  u.elements = static_cast<unsigned long long>(n);
  u.update = update;
  u.count = count;
  u.record_copy_scale = operand == kWeight && layer.recipe.kind == RecipeKind::delayed;
  pending_updates_.push_back(u);
  if (layer.pending == 0) pending_layers_.push_back(&layer);
  layer.pending |= 1u << operand;
}

void CudaBackend::apply_scaling_updates() {
  for (size_t first = 0; first < pending_updates_.size(); first += kMaxScalingUpdates) {
    ScalingUpdates batch;
    batch.count = static_cast<int>(std::min<size_t>(kMaxScalingUpdates, pending_updates_.size() - first));
    std::copy_n(pending_updates_.begin() + static_cast<ptrdiff_t>(first), batch.count, batch.entry);
    update_scaling_kernel<<<(batch.count + 127) / 128, 128, 0, stream_>>>(batch);
    OCTET_CUDA_CHECK_LAUNCH("update_scaling_kernel");
  }
  pending_updates_.clear();
  for (Layer* layer : pending_layers_) {
    layer->results_zeroed |= layer->pending;  // update_scaling_kernel cleared what it read
    layer->pending = 0;
  }
  pending_layers_.clear();
}

void CudaBackend::cast_operand(Layer& layer, int operand, Dtype format, const float* x, int64_t rows,
                               int64_t cols, uint8_t* codes, uint8_t* codes_transposed, float* scale_out,
                               float* scale_inv_out, bool update, const LinearExecution& exec) {
  const OpScope scope(*this, OpKind::casts);
  DeviceLayerState* s = layer.device;
  CastAmaxArguments a;
  a.input = x;
  a.rows = rows;
  a.cols = cols;
  a.format = format;
  a.scale = begin_cast(layer, operand, format, x, rows * cols, scale_out);
  a.output = codes;
  a.output_transposed = codes_transposed;
  a.scale_inv = scale_inv_out;
  a.results = &s->results[operand];
  a.results_zeroed = layer.take_zeroed_results(operand);
  cast_amax(a, stream_);
  // Telemetry counts a cast only where the layer collects it (not while evaluating, not when off).
  const bool count = exec.telemetry != nullptr;
  end_cast(layer, operand, format, rows * cols, update, count);
  if (count && exec.measure_sqnr && rows * cols > 0) {
    sqnr_kernel<<<blocks_for(rows * cols), 256, 0, stream_>>>(x, codes, rows * cols, format, scale_inv_out,
                                                              &s->telemetry[operand]);
    OCTET_CUDA_CHECK_LAUNCH("sqnr_kernel");
  }
}

void CudaBackend::cast_operand_part(Layer& layer, int operand, Dtype format, const float* amax, const float* x,
                                    int64_t n, uint8_t* codes, float* scale_out, float* scale_inv_out,
                                    const LinearExecution& exec) {
  const OpScope scope(*this, OpKind::casts);
  if ((layer.pending & (1u << operand)) != 0) apply_scaling_updates();
  DeviceLayerState* s = layer.device;
  // The results start from the whole tensor's amax (and zero counts): the scale and the update read it, and
  // the part's cast, whose own amax is no larger, adds its counts.
  seed_results_kernel<<<1, 1, 0, stream_>>>(&s->results[operand], amax);
  OCTET_CUDA_CHECK_LAUNCH("seed_results_kernel");
  layer.results_zeroed &= ~(1u << operand);
  const float* scale = &s->tensor[operand].scale;
  if (layer.recipe.kind != RecipeKind::delayed) {
    prepare_scale_kernel<<<1, 1, 0, stream_>>>(s, operand, layer.recipe, dtype_info(format).max_finite,
                                               &s->results[operand], scale_out);
    OCTET_CUDA_CHECK_LAUNCH("prepare_scale_kernel");
    scale = scale_out;
  }
  CastAmaxArguments a;
  a.input = x;
  a.rows = 1;
  a.cols = n;
  a.format = format;
  a.scale = scale;
  a.output = codes;
  a.scale_inv = scale_inv_out;
  a.results = &s->results[operand];
  a.results_zeroed = true;  // seeded above
  cast_amax(a, stream_);
  const bool count = exec.telemetry != nullptr;
  end_cast(layer, operand, format, n, true, count);
  if (count && exec.measure_sqnr && n > 0) {
    sqnr_kernel<<<blocks_for(n), 256, 0, stream_>>>(x, codes, n, format, scale_inv_out, &s->telemetry[operand]);
    OCTET_CUDA_CHECK_LAUNCH("sqnr_kernel");
  }
}

}  // namespace octet::cuda::backend_internal
