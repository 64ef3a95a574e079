// The CUDA backend's KernelProfiler (octet/backend/kernel_profiler.h): CUPTI's activity API records every
// kernel, copy and fill of the process while it is on. Internal to the CUDA backend; registration.cpp hands
// it out through BackendFactory::make_kernel_profiler.
#pragma once

#include <memory>

#include "octet/backend/kernel_profiler.h"

namespace octet::cuda {

// CUPTI is one per process: a second profiler started while one records is refused (Error, training_failed).
std::unique_ptr<KernelProfiler> make_cupti_kernel_profiler();

}  // namespace octet::cuda
