// The fused FP8 cast kernels (see octet/cuda/cast.h) and their launcher. Two kernels share one per-element
// step: a flat grid-stride kernel with float4 loads for the row-major codes alone, and a tiled kernel (float4
// loads and 32-bit code stores too) that also writes the transposed codes through shared memory. The
// per-element step (cast_element.cuh, shared with the producer-fused casts of fused.h) is the CPU
// reference's cast_one (src/numerics/quantize.cpp) line for line, so the bytes, amax and counts agree
// exactly.
#include "octet/cuda/cast.h"

#include "cast_element.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "octet/numerics/minifloat.h"

namespace octet::cuda {
namespace {

using cast_internal::cast_element;
using cast_internal::cast_elements;
using cast_internal::flush_tally;
using cast_internal::Tally;

constexpr int kThreads = 256;  // flat kernel block size
// Transposed casts: kTile x kTile tiles, 16 elements of each for every thread (as Tally assumes).
constexpr int kTile = 64;
constexpr int kTileGroups = kTile / 4;  // groups of four rows or columns in a tile edge
constexpr int kTransposeThreads = kTileGroups * kTileGroups;
constexpr int kTileWords = kTileGroups + 1;  // staged tile row, in 32-bit words: one word of padding
constexpr int kBlocksPerMultiprocessor = 8;
// The grid is kBlocksPerMultiprocessor blocks per multiprocessor, so they must all be resident at once (32
// registers a thread), or the last of them run as a second, mostly idle wave. Rounding to nearest fits; the
// stochastic encoder would spill, and is left to take what it needs.
template <bool Stochastic>
inline constexpr int kMinBlocks = Stochastic ? 1 : kBlocksPerMultiprocessor;

struct KernelParameters {
  const float* input;
  int64_t rows;
  int64_t cols;
  const float* scale;
  uint8_t* output;
  uint8_t* output_transposed;
  float* scale_inv;
  CastResults* results;
  Overflow overflow;
  uint64_t seed;
  int64_t vector_groups;  // flat kernel: groups of 4 elements read as float4 (0 when unaligned)
  bool vector_rows;       // tiled kernel: cols % 4 == 0, input 16-byte and output 4-byte aligned
  bool transposed_words;  // tiled kernel: rows % 4 == 0 and output_transposed 4-byte aligned
};

// Row-major codes only. Groups of four elements: one float4 load and one 32-bit store of four codes (little
// endian, so code i lands at byte i); then the n % 4 elements (or all of them when unaligned) one by one.
template <Dtype Format, bool Stochastic>
__global__ void __launch_bounds__(kThreads, kMinBlocks<Stochastic>)
    cast_amax_kernel(const KernelParameters p) {
  const float scale = *p.scale;
  const int64_t n = p.rows * p.cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  Tally t{};
  const float4* input4 = reinterpret_cast<const float4*>(p.input);
  uint32_t* output4 = reinterpret_cast<uint32_t*>(p.output);
  for (int64_t g = first; g < p.vector_groups; g += stride) {
    const float4 v = __ldg(input4 + g);
    const float x[4] = {v.x, v.y, v.z, v.w};
    output4[g] =
        cast_elements<Format, Stochastic, 4>(x, scale, p.overflow, p.seed, static_cast<uint64_t>(g) * 4u, t);
  }
  for (int64_t i = p.vector_groups * 4 + first; i < n; i += stride) {
    p.output[i] = static_cast<uint8_t>(cast_element<Format, Stochastic>(__ldg(p.input + i), scale, p.overflow,
                                                                        p.seed, static_cast<uint64_t>(i), t));
  }
  cast_internal::write_scale_inv(p.scale_inv, scale);
  flush_tally(t, p.results);
}

// Row-major and transposed codes. A block walks kTile x kTile tiles (grid-stride over tiles). Thread 16a + b
// first reads four-column group b of tile rows a, a + 16, a + 32 and a + 48 (a warp reads two 256-byte row
// segments per float4 load), writes their codes row-major as 32-bit words and stages them in shared memory;
// then it takes the 4 x 4 codes of row group b and column group a, transposes them in registers and writes
// four 32-bit words of the transposed output (a warp writes two 64-byte segments of each of four transposed
// rows per store). Groups that the tile edge cuts, or that the pointers' alignment or the shape does not
// allow as words, go element by element through the same staging, so every shape gives the bytes that one
// cast_element per element would.
template <Dtype Format, bool Stochastic>
__global__ void __launch_bounds__(kTransposeThreads, kMinBlocks<Stochastic>)
    cast_transpose_amax_kernel(const KernelParameters p) {
  // A staged row is 16 words and a padding word. Without it, the 16 row groups that half a warp reads in the
  // transposing step would all fall in one bank (16-way conflicts); with it, in 8 (2-way).
  __shared__ uint32_t staged[kTile][kTileWords];
  const float scale = *p.scale;
  const int64_t tile_rows = (p.rows + kTile - 1) / kTile;
  const int64_t tile_cols = (p.cols + kTile - 1) / kTile;
  const int64_t tiles = tile_rows * tile_cols;
  const int a = static_cast<int>(threadIdx.x) / kTileGroups;
  const int b = static_cast<int>(threadIdx.x) % kTileGroups;
  Tally t{};
  for (int64_t tile_index = blockIdx.x; tile_index < tiles; tile_index += gridDim.x) {
    const int64_t row0 = (tile_index / tile_cols) * kTile;
    const int64_t col0 = (tile_index % tile_cols) * kTile;
    // Row-major: rows a + 16 k, columns 4b .. 4b + 3 of the tile.
    const int64_t c = col0 + 4 * b;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int tile_row = a + kTileGroups * k;
      const int64_t r = row0 + tile_row;
      if (r >= p.rows || c >= p.cols) continue;
      const int64_t i = r * p.cols + c;
      uint32_t word = 0;
      if (p.vector_rows) {  // cols % 4 == 0: the whole group is inside the matrix
        const float4 v = __ldg(reinterpret_cast<const float4*>(p.input + i));
        const float x[4] = {v.x, v.y, v.z, v.w};
        word =
            cast_elements<Format, Stochastic, 4>(x, scale, p.overflow, p.seed, static_cast<uint64_t>(i), t);
        *reinterpret_cast<uint32_t*>(p.output + i) = word;
      } else {
        for (int j = 0; j < 4 && c + j < p.cols; ++j) {
          const uint32_t code = cast_element<Format, Stochastic>(__ldg(p.input + i + j), scale, p.overflow,
                                                                 p.seed, static_cast<uint64_t>(i + j), t);
          p.output[i + j] = static_cast<uint8_t>(code);
          word |= code << (8 * j);
        }
      }
      staged[tile_row][b] = word;
    }
    __syncthreads();
    // Transposed: tile rows 4b .. 4b + 3 of tile columns 4a .. 4a + 3 become, column by column, a word of
    // transposed row col0 + 4a + j at column row0 + 4b. Staged bytes beyond the matrix are never written out.
    const int64_t r = row0 + 4 * b;
    const int64_t c_t = col0 + 4 * a;
    if (r < p.rows && c_t < p.cols) {
      const uint32_t w0 = staged[4 * b][a];
      const uint32_t w1 = staged[4 * b + 1][a];
      const uint32_t w2 = staged[4 * b + 2][a];
      const uint32_t w3 = staged[4 * b + 3][a];
      // Byte j of each of w0..w3, in that order, for j = 0..3 (__byte_perm selects bytes 0-3 of its first
      // operand and 4-7 of its second).
      const uint32_t low01 = __byte_perm(w0, w1, 0x5140);   // w0.0 w1.0 w0.1 w1.1
      const uint32_t high01 = __byte_perm(w0, w1, 0x7362);  // w0.2 w1.2 w0.3 w1.3
      const uint32_t low23 = __byte_perm(w2, w3, 0x5140);
      const uint32_t high23 = __byte_perm(w2, w3, 0x7362);
      const uint32_t columns[4] = {__byte_perm(low01, low23, 0x5410), __byte_perm(low01, low23, 0x7632),
                                   __byte_perm(high01, high23, 0x5410), __byte_perm(high01, high23, 0x7632)};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (c_t + j >= p.cols) break;
        uint8_t* d = p.output_transposed + (c_t + j) * p.rows + r;
        if (p.transposed_words) {  // rows % 4 == 0: the whole group is inside the matrix
          *reinterpret_cast<uint32_t*>(d) = columns[j];
        } else {
          for (int k = 0; k < 4 && r + k < p.rows; ++k) d[k] = static_cast<uint8_t>(columns[j] >> (8 * k));
        }
      }
    }
    __syncthreads();  // the next tile overwrites `staged`
  }
  cast_internal::write_scale_inv(p.scale_inv, scale);
  flush_tally(t, p.results);
}

// amax only (current scaling needs it before the cast can start): |x| bits under an unsigned max, NaN
// winning as in cast_element.
__global__ void __launch_bounds__(kThreads) amax_kernel(const float* input, int64_t n, CastResults* results) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  Tally t{};
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t abs_bits = cast_internal::float_bits(__ldg(input + i)) & cast_internal::kAbsMask;
    const uint32_t candidate = abs_bits > cast_internal::kInfBits ? cast_internal::kQuietNanBits : abs_bits;
    t.amax_bits = candidate > t.amax_bits ? candidate : t.amax_bits;
  }
  flush_tally(t, results);
}

int multiprocessor_count() {
  int device = 0;
  int count = 0;
  OCTET_CUDA_CHECK(cudaGetDevice(&device));
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

// Enough blocks to fill the GPU, no more: the kernels stride over the rest. Always at least one block, which
// writes scale_inv even for an empty tensor, and never so few that a block strides more than
// kMaxBlockStrides times (see Tally). Results never depend on the grid size.
unsigned grid_size(int64_t work_items, int64_t items_per_block) {
  const int64_t wanted = (work_items + items_per_block - 1) / items_per_block;
  const int64_t most = static_cast<int64_t>(multiprocessor_count()) * kBlocksPerMultiprocessor;
  const int64_t blocks = wanted < 1 ? 1 : (wanted < most ? wanted : most);
  const int64_t least = (wanted + cast_internal::kMaxBlockStrides - 1) / cast_internal::kMaxBlockStrides;
  return static_cast<unsigned>(blocks > least ? blocks : least);
}

template <Dtype Format, bool Stochastic>
void launch(const KernelParameters& p, cudaStream_t stream) {
  if (p.output_transposed != nullptr) {
    const int64_t tiles = ((p.rows + kTile - 1) / kTile) * ((p.cols + kTile - 1) / kTile);
    cast_transpose_amax_kernel<Format, Stochastic><<<grid_size(tiles, 1), kTransposeThreads, 0, stream>>>(p);
    OCTET_CUDA_CHECK_LAUNCH("cast_transpose_amax_kernel");
  } else {
    const int64_t n = p.rows * p.cols;
    const int64_t work_items = p.vector_groups + (n - p.vector_groups * 4);
    cast_amax_kernel<Format, Stochastic><<<grid_size(work_items, kThreads), kThreads, 0, stream>>>(p);
    OCTET_CUDA_CHECK_LAUNCH("cast_amax_kernel");
  }
}

bool aligned(const void* pointer, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(pointer) % alignment == 0;
}

}  // namespace

void cast_amax(const CastAmaxArguments& a, cudaStream_t stream) {
  OCTET_REQUIRE(is_fp8(a.format), "cast_amax: the target format must be e4m3 or e5m2, got {}",
                dtype_name(a.format));
  OCTET_REQUIRE(a.rows >= 0 && a.cols >= 0, "cast_amax: the shape must not be negative, got [{}, {}]", a.rows,
                a.cols);
  const int64_t n = a.rows * a.cols;
  OCTET_REQUIRE(a.scale != nullptr && a.results != nullptr, "cast_amax: scale and results must be given");
  OCTET_REQUIRE(n == 0 || (a.input != nullptr && a.output != nullptr),
                "cast_amax: a [{}, {}] cast needs input and output pointers", a.rows, a.cols);

  KernelParameters p{};
  p.input = a.input;
  p.rows = a.rows;
  p.cols = a.cols;
  p.scale = a.scale;
  p.output = a.output;
  p.output_transposed = n > 0 ? a.output_transposed : nullptr;
  p.scale_inv = a.scale_inv;
  p.results = a.results;
  p.overflow = a.options.overflow;
  p.seed = a.options.seed;
  p.vector_groups = (aligned(a.input, 16) && aligned(a.output, 4)) ? n / 4 : 0;
  p.vector_rows = a.cols % 4 == 0 && aligned(a.input, 16) && aligned(a.output, 4);
  p.transposed_words = a.rows % 4 == 0 && aligned(a.output_transposed, 4);

  // The kernels accumulate into results with atomics: start from zero amax (+0.0f bits) and zero counts.
  if (!a.results_zeroed) OCTET_CUDA_CHECK(cudaMemsetAsync(a.results, 0, sizeof(CastResults), stream));
  const bool stochastic = a.options.rounding == Rounding::stochastic;
  if (a.format == Dtype::e4m3 && stochastic) {
    launch<Dtype::e4m3, true>(p, stream);
  } else if (a.format == Dtype::e4m3) {
    launch<Dtype::e4m3, false>(p, stream);
  } else if (stochastic) {
    launch<Dtype::e5m2, true>(p, stream);
  } else {
    launch<Dtype::e5m2, false>(p, stream);
  }
}

void amax_only(const float* input, int64_t n, CastResults* results, cudaStream_t stream) {
  OCTET_REQUIRE(n >= 0 && results != nullptr && (n == 0 || input != nullptr),
                "amax_only: an input of {} values and a results slot", n);
  OCTET_CUDA_CHECK(cudaMemsetAsync(results, 0, sizeof(CastResults), stream));
  if (n == 0) return;
  amax_kernel<<<grid_size(n, kThreads * 4), kThreads, 0, stream>>>(input, n, results);
  OCTET_CUDA_CHECK_LAUNCH("amax_kernel");
}

DeviceCastOutput cast_on_device(std::span<const float> x, int64_t rows, int64_t cols, Dtype format,
                                float scale, const CastOptions& options, bool transposed) {
  OCTET_REQUIRE(rows >= 0 && cols >= 0 && static_cast<int64_t>(x.size()) == rows * cols,
                "cast_on_device: a [{}, {}] matrix needs {} values, got {}", rows, cols, rows * cols,
                x.size());
  OCTET_REQUIRE(is_valid_scale(scale),
                "cast_on_device: the scale must be a positive finite number with a finite inverse, got {}",
                scale);
  const size_t n = x.size();
  DeviceBuffer<float> input(n);
  DeviceBuffer<float> scales(2);  // [0] scale, [1] scale_inv
  DeviceBuffer<uint8_t> output(n);
  DeviceBuffer<uint8_t> output_transposed(transposed ? n : 0);
  DeviceBuffer<CastResults> results(1);
  input.copy_from_host(x);
  scales.copy_from_host(std::span<const float>(&scale, 1));

  CastAmaxArguments a;
  a.input = input.data();
  a.rows = rows;
  a.cols = cols;
  a.format = format;
  a.scale = scales.data();
  a.output = output.data();
  a.output_transposed = output_transposed.data();
  a.scale_inv = scales.data() + 1;
  a.results = results.data();
  a.options = options;
  cast_amax(a, nullptr);  // the legacy default stream: the synchronous copies below wait for it
  OCTET_CUDA_CHECK(cudaStreamSynchronize(nullptr));

  DeviceCastOutput out;
  QuantizedTensor& q = out.tensor;
  q.format = format;
  q.rows = rows;
  q.cols = cols;
  q.granularity = ScaleGranularity::per_tensor;
  q.data.resize(n);
  output.copy_to_host(q.data);
  float scale_and_inverse[2] = {0.0f, 0.0f};
  scales.copy_to_host(scale_and_inverse);
  q.scale_inv = {scale_and_inverse[1]};
  CastResults r{};
  results.copy_to_host(std::span<CastResults>(&r, 1));
  q.amax = r.amax;
  q.stats.elements = static_cast<int64_t>(n);
  q.stats.saturated = static_cast<int64_t>(r.saturated);
  q.stats.underflowed = static_cast<int64_t>(r.underflowed);
  q.stats.nan_inputs = static_cast<int64_t>(r.nan_inputs);
  if (transposed) {
    out.transposed.resize(n);
    output_transposed.copy_to_host(out.transposed);
  }
  return out;
}

}  // namespace octet::cuda
