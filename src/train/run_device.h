// Where a training run trains, internal to src/train/: the backend train.device picks (and refuses), made
// with the run's options, and allocations that fail turned into refusals. Shared by the run loop
// (training_run.cpp) and the commands that rebuild a run from its checkpoint (checkpoint_commands.cpp).
#pragma once

#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "octet/backend/registry.h"
#include "octet/check.h"
#include "octet/config/run_config.h"

namespace octet {

// Where the run trains, decided (and refused) before anything is written.
struct DeviceChoice {
  const BackendFactory* backend = nullptr;  // the registered "cpu" or "cuda" backend
  bool cuda = false;
  bool emulate_fp8 = false;  // fp8 on a GPU without FP8 tensor cores: BF16 GEMMs on the FP8 codes
  int gpu = 0;               // the CUDA device this process trains on
  std::string line;          // what the run says about it at start
};

// The backend the configuration's train.device asks for, on CUDA device `gpu` (a rank's GPU on its machine),
// with the line the run says about it; refused (invalid_input) where it cannot be had or cannot run the
// configuration.
DeviceChoice choose_device(const RunConfig& config, int gpu = 0);
std::unique_ptr<Backend> make_backend(const DeviceChoice& device, const RunConfig& config);

// Runs `allocate` (building a model, its trainer), turning a failed allocation into a refusal that says
// which configuration asked for too much: std::bad_alloc and std::length_error are not internal errors here.
template <typename Allocate>
void allocate_or_refuse(const RunConfig& config, Allocate&& allocate) {
  try {
    allocate();
  } catch (const std::bad_alloc&) {
    OCTET_REQUIRE(
        false,
        "the model ({}) with train.batch_size {} and train.seq_len {} needs more memory than can be "
        "allocated; choose smaller model.* sizes, batch or sequence",
        config.model.describe(), config.train.batch_size, config.train.seq_len);
  } catch (const std::length_error&) {
    OCTET_REQUIRE(false,
                  "the model ({}) with train.batch_size {} and train.seq_len {} is too large to be "
                  "allocated; choose smaller model.* sizes, batch or sequence",
                  config.model.describe(), config.train.batch_size, config.train.seq_len);
  }
}

}  // namespace octet
