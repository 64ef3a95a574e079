// The CUDA backend's releasable buffers (Backend::allocate_releasable): one range of device addresses,
// reserved whole, with memory mapped into it chunk by chunk through the driver's virtual memory calls
// (cuMemAddressReserve, cuMemCreate, cuMemMap), so that the chunks given back (Buffer::release) are unmapped
// and freed while the addresses of the rest stay where they are. Kernels, copies and NCCL see ordinary
// device memory. The driver's entry points are looked up at run time (cudaGetDriverEntryPointByVersion), so
// that nothing links libcuda: binaries still start on machines without a GPU.
#include <algorithm>
#include <memory>

#include <cuda.h>
#include <cuda_runtime.h>

#include "../released_pages.h"
#include "cuda_backend_impl.h"
#include "octet/check.h"

namespace octet::cuda::backend_internal {

namespace {

// The driver calls a releasable buffer makes; every member null where the driver lacks one.
struct DriverCalls {
  CUresult (*get_granularity)(size_t*, const CUmemAllocationProp*,
                              CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*free_addresses)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                     unsigned long long) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*release_handle)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;

  bool complete() const {
    return get_granularity && reserve && free_addresses && create && map && unmap && release_handle &&
           set_access && attribute;
  }
};

template <typename F>
void look_up(const char* symbol, F& call) {
  void* found = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion(symbol, &found, 12000, cudaEnableDefault, &status) == cudaSuccess &&
      status == cudaDriverEntryPointSuccess) {
    call = reinterpret_cast<F>(found);
  }
}

const DriverCalls& driver() {
  static const DriverCalls calls = [] {
    DriverCalls c;
    look_up("cuMemGetAllocationGranularity", c.get_granularity);
    look_up("cuMemAddressReserve", c.reserve);
    look_up("cuMemAddressFree", c.free_addresses);
    look_up("cuMemCreate", c.create);
    look_up("cuMemMap", c.map);
    look_up("cuMemUnmap", c.unmap);
    look_up("cuMemRelease", c.release_handle);
    look_up("cuMemSetAccess", c.set_access);
    look_up("cuDeviceGetAttribute", c.attribute);
    return c;
  }();
  return calls;
}

void check_driver(CUresult result, const char* what) {
  OCTET_CHECK(result == CUDA_SUCCESS, "the CUDA driver's {} failed (CUresult {})", what,
              static_cast<int>(result));
}

// At most this many chunks a buffer: larger buffers take larger chunks (a multiple of the granularity).
constexpr size_t kMaxChunks = 8192;

class DevicePagesBuffer final : public Buffer {
 public:
  DevicePagesBuffer(size_t bytes, int device, size_t granularity)
      : bytes_(bytes),
        device_(device),
        pages_(std::max<size_t>(bytes, 1), chunk_for(std::max<size_t>(bytes, 1), granularity)) {
    const DriverCalls& d = driver();
    reserved_ = pages_.pages() * pages_.page();
    check_driver(d.reserve(&base_, reserved_, pages_.page(), 0, 0), "cuMemAddressReserve");
    map_chunks(0, pages_.pages());
    OCTET_CUDA_CHECK(cudaMemset(data(), 0, reserved_));
    // As for every buffer (cuda_backend.cu): the zeroing on the default stream is done before other streams
    // use the memory.
    OCTET_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  ~DevicePagesBuffer() override {
    const DriverCalls& d = driver();
    cudaDeviceSynchronize();
    for (size_t c = 0; c < pages_.pages(); ++c) {
      if (!pages_.released(c)) d.unmap(base_ + c * pages_.page(), pages_.page());
    }
    d.free_addresses(base_, reserved_);
  }
  void* data() override { return reinterpret_cast<void*>(base_); }
  size_t bytes() const override { return bytes_; }

  size_t release(size_t offset, size_t bytes) override {
    const std::vector<ReleasedPages::Run> runs = pages_.release(offset, bytes);
    if (runs.empty()) return 0;
    // Nothing enqueued may still touch the chunks (cuMemUnmap would not wait for it everywhere).
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    size_t freed = 0;
    for (const ReleasedPages::Run& run : runs) {
      // One mapping a chunk: cuMemUnmap takes whole mappings.
      for (size_t c = run.first; c < run.first + run.count; ++c) {
        check_driver(driver().unmap(base_ + c * pages_.page(), pages_.page()), "cuMemUnmap");
      }
      freed += pages_.bytes_of(run);
    }
    return freed;
  }
  void restore() override {
    for (const ReleasedPages::Run& run : pages_.restore_all()) map_chunks(run.first, run.count);
  }
  size_t released_bytes() const override { return pages_.released_bytes(); }
  bool releasable() const override { return true; }

 private:
  static size_t chunk_for(size_t bytes, size_t granularity) {
    const size_t per_chunk = (bytes + kMaxChunks - 1) / kMaxChunks;
    return std::max<size_t>(1, (per_chunk + granularity - 1) / granularity) * granularity;
  }
  // Backs chunks [first, first + count) with device memory of their own, readable and writable here.
  void map_chunks(size_t first, size_t count) {
    const DriverCalls& d = driver();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device_;
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    const size_t chunk = pages_.page();
    for (size_t c = first; c < first + count; ++c) {
      CUmemGenericAllocationHandle handle{};
      const CUresult made = d.create(&handle, chunk, &prop, 0);
      if (made == CUDA_ERROR_OUT_OF_MEMORY) throw std::bad_alloc();
      check_driver(made, "cuMemCreate");
      const CUresult mapped = d.map(base_ + c * chunk, chunk, 0, handle, 0);
      // The mapping holds the memory from here on; unmapping it frees it.
      d.release_handle(handle);
      check_driver(mapped, "cuMemMap");
      check_driver(d.set_access(base_ + c * chunk, chunk, &access, 1), "cuMemSetAccess");
    }
  }

  size_t bytes_;
  int device_;
  ReleasedPages pages_;
  CUdeviceptr base_ = 0;
  size_t reserved_ = 0;
};

}  // namespace

std::unique_ptr<Buffer> make_device_pages_buffer(size_t bytes) {
  const DriverCalls& d = driver();
  if (!d.complete()) return nullptr;
  int device = 0;
  OCTET_CUDA_CHECK(cudaGetDevice(&device));
  int supported = 0;
  if (d.attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) !=
          CUDA_SUCCESS ||
      supported == 0) {
    return nullptr;
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  size_t granularity = 0;
  check_driver(d.get_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
               "cuMemGetAllocationGranularity");
  return std::make_unique<DevicePagesBuffer>(bytes, device, std::max<size_t>(granularity, 1));
}

}  // namespace octet::cuda::backend_internal
