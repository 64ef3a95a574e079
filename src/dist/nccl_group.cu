// NcclGroup (nccl_group.h): NCCL loaded with dlopen, one communicator per GPU made by ncclCommInitAll, each
// collective enqueued on its rank's stream and waited for. The maximum runs over order-preserving integer
// keys of the floats, so that a NaN on any rank reaches every rank (NCCL's own float maximum need not keep
// it): an amax that is NaN on one rank must stop every rank's step alike.
#include "octet/dist/nccl_group.h"

#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include "octet/check.h"
#include "octet/dist/socket_group.h"

namespace octet::dist {

namespace {

// The NCCL functions octet calls, from libnccl.so.2.
struct NcclApi {
  void* library = nullptr;
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclReduce) reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclCommCount) comm_count = nullptr;
  decltype(&ncclCommUserRank) user_rank = nullptr;
  // NCCL 2.18 and later; null before, when only a hybrid layout's split needs it.
  decltype(&ncclCommSplit) comm_split = nullptr;
  std::string why_not;
};

template <typename F>
void load_symbol(void* library, const char* name, F*& out, std::string& missing) {
  out = reinterpret_cast<F*>(dlsym(library, name));
  if (out == nullptr && missing.empty()) missing = name;
}

// Loaded once per process; the library stays loaded.
const NcclApi& api() {
  static const NcclApi loaded = [] {
    NcclApi a;
    a.library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (a.library == nullptr) {
      a.why_not = fmt::format(
          "libnccl.so.2 could not be loaded ({}); install NCCL 2 or put its lib directory on LD_LIBRARY_PATH "
          "(PyTorch's wheel ships one under site-packages/nvidia/nccl/lib)",
          dlerror());
      return a;
    }
    std::string missing;
    load_symbol(a.library, "ncclGetVersion", a.get_version, missing);
    load_symbol(a.library, "ncclGetErrorString", a.error_string, missing);
    load_symbol(a.library, "ncclCommInitAll", a.comm_init_all, missing);
    load_symbol(a.library, "ncclGetUniqueId", a.get_unique_id, missing);
    load_symbol(a.library, "ncclCommInitRank", a.comm_init_rank, missing);
    load_symbol(a.library, "ncclCommGetAsyncError", a.async_error, missing);
    load_symbol(a.library, "ncclCommDestroy", a.comm_destroy, missing);
    load_symbol(a.library, "ncclCommAbort", a.comm_abort, missing);
    load_symbol(a.library, "ncclAllReduce", a.all_reduce, missing);
    load_symbol(a.library, "ncclReduceScatter", a.reduce_scatter, missing);
    load_symbol(a.library, "ncclReduce", a.reduce, missing);
    load_symbol(a.library, "ncclAllGather", a.all_gather, missing);
    load_symbol(a.library, "ncclBroadcast", a.broadcast, missing);
    load_symbol(a.library, "ncclGroupStart", a.group_start, missing);
    load_symbol(a.library, "ncclGroupEnd", a.group_end, missing);
    load_symbol(a.library, "ncclCommCount", a.comm_count, missing);
    load_symbol(a.library, "ncclCommUserRank", a.user_rank, missing);
    a.comm_split = reinterpret_cast<decltype(&ncclCommSplit)>(dlsym(a.library, "ncclCommSplit"));
    if (!missing.empty())
      a.why_not = fmt::format("libnccl.so.2 has no {}: NCCL 2.12 or later is needed", missing);
    return a;
  }();
  return loaded;
}

void check_nccl(ncclResult_t result, const char* what, int rank) {
  if (result == ncclSuccess) return;
  throw Error(ErrorKind::training_failed, fmt::format("NCCL {} on rank {} failed: {} (code {})", what, rank,
                                                      api().error_string(result), static_cast<int>(result)));
}

void check_cuda(cudaError_t result, const char* what, int rank) {
  if (result == cudaSuccess) return;
  throw Error(ErrorKind::training_failed,
              fmt::format("CUDA {} on rank {} failed: {}", what, rank, cudaGetErrorString(result)));
}

// Order-preserving keys of float bits: key(a) < key(b) exactly when a < b, every NaN the largest key (so a
// NaN wins the maximum) and mapped back to the canonical quiet NaN.
__global__ void float_keys_kernel(const float* x, uint32_t* keys, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = __float_as_uint(x[i]);
    const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    keys[i] = nan ? 0xFFFFFFFFu : ((bits & 0x80000000u) != 0u ? ~bits : bits | 0x80000000u);
  }
}

__global__ void keys_to_floats_kernel(const uint32_t* keys, float* x, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t k = keys[i];
    x[i] = k == 0xFFFFFFFFu ? __uint_as_float(0x7FC00000u)
                            : __uint_as_float((k & 0x80000000u) != 0u ? k & 0x7FFFFFFFu : ~k);
  }
}

// Gradients to BF16 (round to nearest even) for a BF16 sum, and the sums back to float32.
__global__ void to_bf16_kernel(const float* x, __nv_bfloat16* codes, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    codes[i] = __float2bfloat16_rn(x[i]);
  }
}

__global__ void from_bf16_kernel(const __nv_bfloat16* codes, float* x, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] = __bfloat162float(codes[i]);
  }
}

unsigned blocks_for(size_t n) {
  const size_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 1024 ? (blocks < 1 ? 1 : blocks) : 1024);
}

cudaError_t to_keys(const float* x, uint32_t* keys, size_t n, cudaStream_t stream) {
  float_keys_kernel<<<blocks_for(n), 256, 0, stream>>>(x, keys, n);
  return cudaGetLastError();
}

cudaError_t from_keys(const uint32_t* keys, float* x, size_t n, cudaStream_t stream) {
  keys_to_floats_kernel<<<blocks_for(n), 256, 0, stream>>>(keys, x, n);
  return cudaGetLastError();
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device, int rank, int size, std::chrono::milliseconds timeout)
      : comm_(comm), device_(device), rank_(rank), size_(size), timeout_(timeout) {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice", rank_);
    // The highest priority: a sum started during the backward gets SMs as soon as the compute kernels
    // running free some, rather than after the kernels queued behind them.
    int least = 0, greatest = 0;
    check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange", rank_);
    check_cuda(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest), "cudaStreamCreate",
               rank_);
  }
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (keys_ != nullptr) cudaFree(keys_);
    if (staging_ != nullptr) cudaFree(staging_);
    if (codes_ != nullptr) cudaFree(codes_);
    if (after_ != nullptr) cudaEventDestroy(after_);
    for (cudaEvent_t e : gather_events_) cudaEventDestroy(e);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (owns_comm_ && !aborted_) api().comm_destroy(comm_);  // ncclCommAbort freed an aborted one
  }
  // The communicator is this object's to destroy (a rank of processes; a group destroys its own).
  void own_comm() { owns_comm_ = true; }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(std::span<float> values) override {
    in_place("all_reduce_sum (float32)", std::as_writable_bytes(values), [&](void* d) {
      return api().all_reduce(d, d, values.size(), ncclFloat32, ncclSum, comm_, stream_);
    });
  }
  void all_reduce_sum(std::span<double> values) override {
    in_place("all_reduce_sum (float64)", std::as_writable_bytes(values), [&](void* d) {
      return api().all_reduce(d, d, values.size(), ncclFloat64, ncclSum, comm_, stream_);
    });
  }
  void all_reduce_sum_bf16(std::span<uint16_t> values) override {
    in_place("all_reduce_sum (bf16)", std::as_writable_bytes(values), [&](void* d) {
      return api().all_reduce(d, d, values.size(), ncclBfloat16, ncclSum, comm_, stream_);
    });
  }
  void all_reduce_max(std::span<float> values) override {
    const size_t n = values.size();
    if (n == 0) return barrier();
    in_place("all_reduce_max (float32)", std::as_writable_bytes(values), [&](void* d) {
      float* x = static_cast<float*>(d);
      if (keys_capacity_ < n) {
        if (keys_ != nullptr) check_cuda(cudaFree(keys_), "cudaFree", rank_);
        keys_ = nullptr;
        check_cuda(cudaMalloc(reinterpret_cast<void**>(&keys_), n * sizeof(uint32_t)), "cudaMalloc", rank_);
        keys_capacity_ = n;
      }
      check_cuda(to_keys(x, keys_, n, stream_), "launch of the amaxes' keys", rank_);
      const ncclResult_t r = api().all_reduce(keys_, keys_, n, ncclUint32, ncclMax, comm_, stream_);
      if (r == ncclSuccess) check_cuda(from_keys(keys_, x, n, stream_), "launch of the amaxes' keys", rank_);
      return r;
    });
  }
  void reduce_scatter_sum(std::span<const float> send, std::span<float> receive) override {
    OCTET_CHECK(send.size() == receive.size() * static_cast<size_t>(size_),
                "reduce_scatter_sum: {} values to send for {} ranks of {}", send.size(), size_,
                receive.size());
    moved("reduce_scatter_sum (float32)", std::as_bytes(send), std::as_writable_bytes(receive),
          [&](const void* from, void* to) {
            return api().reduce_scatter(from, to, receive.size(), ncclFloat32, ncclSum, comm_, stream_);
          });
  }
  void reduce_scatter_sum_in_place(std::span<float> values, int64_t offset, int64_t total) override {
    in_place("reduce_scatter_sum_in_place (float32)", std::as_writable_bytes(values),
             [&](void* d) { return to_owners(d, values.size(), offset, total, ncclFloat32); });
  }
  void reduce_scatter_sum_in_place_bf16(std::span<uint16_t> values, int64_t offset, int64_t total) override {
    in_place("reduce_scatter_sum_in_place (bf16)", std::as_writable_bytes(values),
             [&](void* d) { return to_owners(d, values.size(), offset, total, ncclBfloat16); });
  }
  void all_gather(std::span<const float> send, std::span<float> receive) override {
    OCTET_CHECK(receive.size() == send.size() * static_cast<size_t>(size_),
                "all_gather: {} values to receive from {} ranks of {}", receive.size(), size_, send.size());
    moved("all_gather (float32)", std::as_bytes(send), std::as_writable_bytes(receive),
          [&](const void* from, void* to) {
            return api().all_gather(from, to, send.size(), ncclFloat32, comm_, stream_);
          });
  }
  void all_gather(std::span<const std::byte> send, std::span<std::byte> receive) override {
    OCTET_CHECK(receive.size() == send.size() * static_cast<size_t>(size_),
                "all_gather: {} bytes to receive from {} ranks of {}", receive.size(), size_, send.size());
    moved("all_gather (bytes)", send, receive, [&](const void* from, void* to) {
      return api().all_gather(from, to, send.size(), ncclUint8, comm_, stream_);
    });
  }
  void broadcast(std::span<std::byte> data, int root) override {
    OCTET_CHECK(root >= 0 && root < size_, "broadcast: root {} of {} ranks", root, size_);
    in_place("broadcast", data, [&](void* d) {
      return api().broadcast(d, d, data.size(), ncclUint8, root, comm_, stream_);
    });
  }
  void start_all_reduce_sum(std::span<float> values, void* stream) override {
    select_device();
    if (host_memory(values.data())) return Communicator::start_all_reduce_sum(values, stream);
    wait_for(stream);
    check_nccl(api().all_reduce(values.data(), values.data(), values.size(), ncclFloat32, ncclSum, comm_, stream_),
               "all_reduce_sum (float32, overlapped)", rank_);
    count_all_reduce(static_cast<int64_t>(values.size_bytes()));
    started_ = true;
  }
  // On NCCL's stream: the values rounded into a BF16 buffer, NCCL's BF16 sum, the sums widened back. The
  // stream runs one bucket after another, so one buffer of the largest bucket serves them all.
  void start_all_reduce_sum_bf16(std::span<float> values, void* stream) override {
    select_device();
    if (host_memory(values.data())) return Communicator::start_all_reduce_sum_bf16(values, stream);
    const size_t n = values.size();
    if (n == 0) return;
    to_codes(values, stream);
    check_nccl(api().all_reduce(codes_, codes_, n, ncclBfloat16, ncclSum, comm_, stream_),
               "all_reduce_sum (bf16, overlapped)", rank_);
    from_bf16_kernel<<<blocks_for(n), 256, 0, stream_>>>(codes_, values.data(), n);
    check_cuda(cudaGetLastError(), "launch of the BF16 sums' widening", rank_);
    count_all_reduce(static_cast<int64_t>(n * sizeof(__nv_bfloat16)));
    started_ = true;
  }
  void start_reduce_scatter_sum(std::span<float> values, int64_t offset, int64_t total,
                                void* stream) override {
    select_device();
    if (host_memory(values.data()))
      return Communicator::start_reduce_scatter_sum(values, offset, total, stream);
    start_to_owners(values.data(), values.size(), offset, total, ncclFloat32, sizeof(float), "float32", stream);
  }
  // As start_all_reduce_sum_bf16, with the sums of this rank's part alone widened back.
  void start_reduce_scatter_sum_bf16(std::span<float> values, int64_t offset, int64_t total,
                                     void* stream) override {
    select_device();
    if (host_memory(values.data()))
      return Communicator::start_reduce_scatter_sum_bf16(values, offset, total, stream);
    const size_t n = values.size();
    const ShardPart mine = shard_part(offset, static_cast<int64_t>(n), total, rank_, size_);
    if (n == 0) return;
    to_codes(values, stream);
    check_nccl(to_owners(codes_, n, offset, total, ncclBfloat16),
               "reduce_scatter_sum_in_place (bf16, overlapped)", rank_);
    if (mine.size() > 0) {
      const auto m = static_cast<size_t>(mine.size());
      from_bf16_kernel<<<blocks_for(m), 256, 0, stream_>>>(codes_ + mine.begin, values.data() + mine.begin,
                                                           m);
      check_cuda(cudaGetLastError(), "launch of the BF16 sums' widening", rank_);
    }
    count_reduce_scatter(static_cast<int64_t>(n * sizeof(__nv_bfloat16)),
                         mine.size() * int64_t{sizeof(__nv_bfloat16)});
    started_ = true;
  }
  void start_all_reduce_sum_bf16_codes(std::span<uint16_t> values, void* stream) override {
    select_device();
    if (host_memory(values.data())) return Communicator::start_all_reduce_sum_bf16_codes(values, stream);
    if (values.empty()) return;
    wait_for(stream);
    check_nccl(api().all_reduce(values.data(), values.data(), values.size(), ncclBfloat16, ncclSum, comm_, stream_),
               "all_reduce_sum (bf16 codes, overlapped)", rank_);
    count_all_reduce(static_cast<int64_t>(values.size_bytes()));
    started_ = true;
  }
  void start_reduce_scatter_sum_bf16_codes(std::span<uint16_t> values, int64_t offset, int64_t total,
                                           void* stream) override {
    select_device();
    if (host_memory(values.data()))
      return Communicator::start_reduce_scatter_sum_bf16_codes(values, offset, total, stream);
    start_to_owners(values.data(), values.size(), offset, total, ncclBfloat16, sizeof(uint16_t), "bf16 codes",
                    stream);
  }
  void finish_started() override {
    if (!started_) return;
    started_ = false;
    select_device();
    finish("the gradient sums started during the backward", ncclSuccess);
  }
  // Each rank's shard broadcast from it, in place, the broadcasts grouped into one launch.
  void all_gather_shards(std::span<float> values) override {
    select_device();
    if (host_memory(values.data())) return Communicator::all_gather_shards(values);
    const auto count = static_cast<int64_t>(values.size());
    ncclResult_t r = api().group_start();
    for (int root = 0; root < size_ && r == ncclSuccess; ++root) {
      const ShardRange shard = shard_range(count, root, size_);
      if (shard.size() == 0) continue;
      float* at = values.data() + shard.begin;
      r = api().broadcast(at, at, static_cast<size_t>(shard.size()), ncclFloat32, root, comm_, stream_);
    }
    const ncclResult_t ended = api().group_end();
    finish("all_gather_shards (float32)", r != ncclSuccess ? r : ended);
  }
  // The same for parts of any sizes: each rank's part broadcast from it, grouped into one launch.
  void all_gather_parts(std::span<std::byte> values, std::span<const int64_t> bounds) override {
    select_device();
    if (host_memory(values.data())) return Communicator::all_gather_parts(values, bounds);
    finish("all_gather_parts", enqueue_parts(values, bounds));
  }
  // The same enqueued after the backend's work on `stream`, an event recorded behind it for the ticket.
  int64_t start_all_gather_parts(std::span<std::byte> values, std::span<const int64_t> bounds,
                                 void* stream) override {
    select_device();
    if (host_memory(values.data())) {
      all_gather_parts(values, bounds);  // at once: complete before the ticket's event
    } else {
      wait_for(stream);
      check_nccl(enqueue_parts(values, bounds), "all_gather_parts (started)", rank_);
    }
    const auto index = static_cast<size_t>(next_gather_ - first_gather_);
    if (index == gather_events_.size()) {
      cudaEvent_t e = nullptr;
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate", rank_);
      gather_events_.push_back(e);
    }
    check_cuda(cudaEventRecord(gather_events_[index], stream_), "cudaEventRecord", rank_);
    return next_gather_++;
  }
  void wait_gathered(int64_t ticket, void* stream) override {
    OCTET_CHECK(ticket >= 0 && ticket < next_gather_, "a gather's ticket {} (started: {})", ticket, next_gather_);
    if (ticket < first_gather_) return;  // finish_gathers saw it complete
    select_device();
    check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                   gather_events_[static_cast<size_t>(ticket - first_gather_)], 0),
               "cudaStreamWaitEvent", rank_);
  }
  void finish_gathers() override {
    if (first_gather_ == next_gather_) return;
    select_device();
    finish("the parameters' gathers started after the update", ncclSuccess);
    first_gather_ = next_gather_;  // every event may be recorded again
  }
  void barrier() override {
    float one = 0.0f;
    all_reduce_sum(std::span<float>(&one, 1));
  }
  // A communicator of its own for each group (ncclCommSplit, blocking: every rank of this one calls it), on
  // this rank's GPU, with this one's timeout; it watches its own errors, as this one does.
  std::unique_ptr<Communicator> split(int color, int key) override {
    OCTET_CHECK(color >= 0, "split: color {} (a group is named by a color of 0 or more)", color);
    OCTET_REQUIRE(api().comm_split != nullptr,
                  "a hybrid layout (distributed.dp_shard and dp_replicate both above 1) needs ncclCommSplit: "
                  "NCCL 2.18 or later (this one is {})",
                  nccl_version());
    select_device();
    ncclComm_t comm = nullptr;
    check_nccl(api().comm_split(comm_, color, key, &comm, nullptr), "ncclCommSplit", rank_);
    int rank = 0, size = 0;
    check_nccl(api().user_rank(comm, &rank), "ncclCommUserRank", rank_);
    check_nccl(api().comm_count(comm, &size), "ncclCommCount", rank_);
    auto group = std::make_unique<NcclCommunicator>(comm, device_, rank, size, timeout_);
    group->own_comm();
    return group;
  }

  // Ends this rank's collectives: one waiting now returns with an error.
  void abort() {
    if (aborted_) return;
    aborted_ = true;
    api().comm_abort(comm_);
  }
  bool aborted() const { return aborted_; }

 private:
  void select_device() { check_cuda(cudaSetDevice(device_), "cudaSetDevice", rank_); }

  // Each rank's part of `values` broadcast from it, in place, grouped into one launch on NCCL's stream.
  ncclResult_t enqueue_parts(std::span<std::byte> values, std::span<const int64_t> bounds) {
    check_part_bounds(bounds, static_cast<int64_t>(values.size()), size_);
    ncclResult_t r = api().group_start();
    for (int root = 0; root < size_ && r == ncclSuccess; ++root) {
      const int64_t bytes = bounds[root + 1] - bounds[root];
      if (bytes == 0) continue;
      std::byte* at = values.data() + bounds[root];
      r = api().broadcast(at, at, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream_);
    }
    const ncclResult_t ended = api().group_end();
    return r != ncclSuccess ? r : ended;
  }

  // NCCL's stream waits for the work the backend has enqueued so far on `stream` (the backward that wrote
  // the values a sum reads).
  void wait_for(void* stream) {
    if (stream == nullptr) return;
    if (after_ == nullptr) {
      check_cuda(cudaEventCreateWithFlags(&after_, cudaEventDisableTiming), "cudaEventCreate", rank_);
    }
    check_cuda(cudaEventRecord(after_, static_cast<cudaStream_t>(stream)), "cudaEventRecord", rank_);
    check_cuda(cudaStreamWaitEvent(stream_, after_, 0), "cudaStreamWaitEvent", rank_);
  }

  // `values` rounded to BF16 into codes_ on NCCL's stream, once the backend's work on `stream` is done.
  void to_codes(std::span<const float> values, void* stream) {
    const size_t n = values.size();
    if (codes_capacity_ < n) {  // the first step's buckets; what is under way may still read the old buffer
      check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", rank_);
      if (codes_ != nullptr) check_cuda(cudaFree(codes_), "cudaFree", rank_);
      codes_ = nullptr;
      check_cuda(cudaMalloc(reinterpret_cast<void**>(&codes_), n * sizeof(__nv_bfloat16)), "cudaMalloc",
                 rank_);
      codes_capacity_ = n;
    }
    wait_for(stream);
    to_bf16_kernel<<<blocks_for(n), 256, 0, stream_>>>(values.data(), codes_, n);
    check_cuda(cudaGetLastError(), "launch of the gradients' BF16 rounding", rank_);
  }

  // Enqueues the sum of each rank's part (shard_part) of the run data[0, n), at `offset` in a buffer of
  // `total` elements, into that rank, in place. Where every rank's part has the same size (a run that spans
  // the whole buffer, its size a multiple of the ranks), one ncclReduceScatter: every link busy in both
  // directions. Otherwise one ncclReduce per rank whose part is not empty, rooted at that rank and grouped
  // into one launch. ncclReduceScatter needs equal parts, and a bucket of the backward (64 MiB against
  // shards of a whole model's gradients) mostly lies in one shard or straddles two: padding it to equal
  // parts would send the zeros of every other rank's part, or wait for the backward to finish every shard's
  // part, giving up the overlap. The grouped reduces move the same bytes as a reduce-scatter of the run
  // (each rank sends every part but its own, once), with no padding and no wait.
  // Starts to_owners on the communicator's stream once the work enqueued on `stream` is done, for values
  // already in the type summed: counts the bytes sent and received, and marks the sums started.
  void start_to_owners(void* data, size_t n, int64_t offset, int64_t total, ncclDataType_t type, size_t element,
                       const char* what, void* stream) {
    const ShardPart mine = shard_part(offset, static_cast<int64_t>(n), total, rank_, size_);
    wait_for(stream);
    const ncclResult_t r = to_owners(data, n, offset, total, type);
    if (r != ncclSuccess) {
      check_nccl(r, fmt::format("reduce_scatter_sum_in_place ({}, overlapped)", what).c_str(), rank_);
    }
    count_reduce_scatter(static_cast<int64_t>(n * element), mine.size() * static_cast<int64_t>(element));
    started_ = true;
  }
  ncclResult_t to_owners(void* data, size_t n, int64_t offset, int64_t total, ncclDataType_t type) {
    if (n == 0) return ncclSuccess;
    const size_t element = type == ncclBfloat16 ? sizeof(__nv_bfloat16) : sizeof(float);
    std::vector<ShardPart> parts;
    bool equal = true;
    for (int r = 0; r < size_; ++r) {
      parts.push_back(shard_part(offset, static_cast<int64_t>(n), total, r, size_));
      equal = equal && parts.back().size() == parts.front().size();
    }
    auto* bytes = static_cast<std::byte*>(data);
    const auto at = [&](int r) {
      return bytes + static_cast<size_t>(parts[static_cast<size_t>(r)].begin) * element;
    };
    if (equal) {  // in place: this rank's part is the receive buffer, at rank x part size in the send buffer
      return api().reduce_scatter(data, at(rank_), static_cast<size_t>(parts.front().size()), type, ncclSum,
                                  comm_, stream_);
    }
    ncclResult_t result = api().group_start();
    for (int root = 0; root < size_ && result == ncclSuccess; ++root) {
      const ShardPart& part = parts[static_cast<size_t>(root)];
      if (part.size() == 0) continue;
      result = api().reduce(at(root), at(root), static_cast<size_t>(part.size()), type, ncclSum, root, comm_,
                            stream_);
    }
    const ncclResult_t ended = api().group_end();
    return result != ncclSuccess ? result : ended;
  }

  // Whether `p` is host memory, which NCCL cannot read: the collective then runs on a device copy.
  bool host_memory(const void* p) const {
    if (p == nullptr) return false;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return true;
    }
    return a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost;
  }

  std::byte* staging(size_t bytes) {
    if (staging_capacity_ < bytes) {
      if (staging_ != nullptr) check_cuda(cudaFree(staging_), "cudaFree", rank_);
      staging_ = nullptr;
      check_cuda(cudaMalloc(reinterpret_cast<void**>(&staging_), bytes), "cudaMalloc", rank_);
      staging_capacity_ = bytes;
    }
    return staging_;
  }

  // A collective over one buffer, read and written in place (through a device copy where it is host memory).
  template <typename Enqueue>
  void in_place(const char* what, std::span<std::byte> data, Enqueue enqueue) {
    select_device();
    if (!host_memory(data.data())) {
      finish(what, enqueue(static_cast<void*>(data.data())));
      return;
    }
    std::byte* d = staging(data.size());
    check_cuda(cudaMemcpyAsync(d, data.data(), data.size(), cudaMemcpyHostToDevice, stream_), what, rank_);
    finish(what, enqueue(static_cast<void*>(d)));
    check_cuda(cudaMemcpy(data.data(), d, data.size(), cudaMemcpyDeviceToHost), what, rank_);
  }

  // A collective from one buffer into another (through device copies where they are host memory).
  template <typename Enqueue>
  void moved(const char* what, std::span<const std::byte> send, std::span<std::byte> receive, Enqueue enqueue) {
    select_device();
    if (!host_memory(send.data()) && !host_memory(receive.data())) {
      finish(what, enqueue(static_cast<const void*>(send.data()), static_cast<void*>(receive.data())));
      return;
    }
    std::byte* d = staging(send.size() + receive.size());
    check_cuda(cudaMemcpyAsync(d, send.data(), send.size(), cudaMemcpyDefault, stream_), what, rank_);
    finish(what, enqueue(static_cast<const void*>(d), static_cast<void*>(d + send.size())));
    check_cuda(cudaMemcpy(receive.data(), d + send.size(), receive.size(), cudaMemcpyDefault), what, rank_);
  }

  // Waits for the collective just enqueued, watching NCCL's asynchronous errors: a rank that died or hangs
  // makes this one abort its communicator and throw within the timeout, never wait forever.
  void finish(const char* what, ncclResult_t enqueued) {
    check_nccl(enqueued, what, rank_);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (int polls = 0;; ++polls) {
      const cudaError_t done = cudaStreamQuery(stream_);
      if (done == cudaSuccess) return;
      if (done != cudaErrorNotReady) check_cuda(done, what, rank_);
      ncclResult_t async = ncclSuccess;
      api().async_error(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        abort();
        check_nccl(async, what, rank_);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        throw Error(ErrorKind::training_failed,
                    fmt::format("NCCL {} on rank {} did not complete within {} s: another rank hangs or died "
                                "(OCTET_DIST_TIMEOUT sets how long ranks wait)",
                                what, rank_, std::chrono::duration<double>(timeout_).count()));
      }
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  ncclComm_t comm_;
  int device_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  bool aborted_ = false;
  bool owns_comm_ = false;
  bool started_ = false;            // sums started and not yet finished
  cudaEvent_t after_ = nullptr;     // the backend's work a started sum waits for
  cudaStream_t stream_ = nullptr;
  uint32_t* keys_ = nullptr;
  size_t keys_capacity_ = 0;
  std::byte* staging_ = nullptr;
  size_t staging_capacity_ = 0;
  __nv_bfloat16* codes_ = nullptr;  // the BF16 sums started during the backward
  size_t codes_capacity_ = 0;
  // The gathers started (start_all_gather_parts): ticket t's event is gather_events_[t - first_gather_];
  // those before first_gather_ are complete.
  std::vector<cudaEvent_t> gather_events_;
  int64_t first_gather_ = 0;
  int64_t next_gather_ = 0;
};

}  // namespace

bool nccl_available(std::string* why_not) {
  const NcclApi& a = api();
  if (why_not != nullptr) *why_not = a.why_not;
  return a.why_not.empty();
}

int nccl_version() {
  if (!nccl_available(nullptr)) return 0;
  int version = 0;
  return api().get_version(&version) == ncclSuccess ? version : 0;
}

struct NcclGroup::State {
  std::vector<ncclComm_t> comms;
  std::vector<std::unique_ptr<NcclCommunicator>> ranks;
  bool aborted = false;
};

NcclGroup::NcclGroup(std::span<const int> devices) : state_(std::make_unique<State>()) {
  std::string why;
  OCTET_REQUIRE(nccl_available(&why), "several GPUs need NCCL: {}", why);
  const int n = static_cast<int>(devices.size());
  OCTET_REQUIRE(n >= 1, "an NCCL group needs at least one GPU");
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount", 0);
  for (const int d : devices) {
    OCTET_REQUIRE(d >= 0 && d < count, "GPU {} asked for, this machine has {} (0 .. {})", d, count,
                  count - 1);
  }
  state_->comms.resize(static_cast<size_t>(n));
  check_nccl(api().comm_init_all(state_->comms.data(), n, devices.data()), "ncclCommInitAll", 0);
  for (int r = 0; r < n; ++r) {
    state_->ranks.push_back(std::make_unique<NcclCommunicator>(
        state_->comms[static_cast<size_t>(r)], devices[static_cast<size_t>(r)], r, n, rank_timeout()));
  }
}

NcclGroup::~NcclGroup() {
  for (size_t r = 0; r < state_->ranks.size(); ++r) {
    const bool aborted = state_->aborted || state_->ranks[r]->aborted();  // ncclCommAbort freed it
    state_->ranks[r].reset();  // its stream and buffers first
    if (!aborted) api().comm_destroy(state_->comms[r]);
  }
}

int NcclGroup::size() const {
  return static_cast<int>(state_->ranks.size());
}

Communicator& NcclGroup::communicator(int rank) {
  OCTET_CHECK(rank >= 0 && rank < size(), "rank {} of an NCCL group of {}", rank, size());
  return *state_->ranks[static_cast<size_t>(rank)];
}

void NcclGroup::abort() {
  if (state_->aborted) return;
  state_->aborted = true;
  for (auto& rank : state_->ranks) rank->abort();
}

std::unique_ptr<Communicator> join_nccl(Communicator& control, int device) {
  std::string why;
  OCTET_REQUIRE(nccl_available(&why), "training on several GPUs needs NCCL: {}", why);
  ncclUniqueId id{};
  if (control.rank() == 0) check_nccl(api().get_unique_id(&id), "ncclGetUniqueId", 0);
  control.broadcast(std::as_writable_bytes(std::span<ncclUniqueId>(&id, 1)), 0);
  check_cuda(cudaSetDevice(device), "cudaSetDevice", control.rank());
  ncclComm_t comm = nullptr;
  check_nccl(api().comm_init_rank(&comm, control.size(), id, control.rank()), "ncclCommInitRank",
             control.rank());
  auto rank = std::make_unique<NcclCommunicator>(comm, device, control.rank(), control.size(), rank_timeout());
  rank->own_comm();
  return rank;
}

}  // namespace octet::dist
