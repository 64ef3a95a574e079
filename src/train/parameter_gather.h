// The gather of a sharded optimizer's updated parameters (ZeRO-1, docs/distributed.md): every rank's shard
// of the float32 master weights to every rank, and the weights' copies remade.
//
// With FP8 weight gathers (distributed.fp8_weight_gather), a weight whose every GEMM runs in FP8 with one
// scale per tensor travels as its FP8 codes instead: the ranks take the largest of their parts' amaxes
// (one all-reduce of every such weight's amax), each rank casts the part of each weight that its shard holds
// with the scale that amax gives (the scale the whole weight's cast would take, so the same codes), the ranks
// gather the codes, and each rank makes the weights' copies from them (the transposes made after the
// gather). One byte an element where float32 takes four. The other parameters (embeddings, norms, biases,
// layers with a BF16 GEMM, a head tied to the embedding) travel in float32 as before, packed into one run.
// A weight gathered as codes keeps stale float32 master values outside the rank's shard, which nothing
// reads during training (the copies stand for the weight); gather_master_weights() brings them up to date
// where something does (a checkpoint).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "octet/backend/backend.h"
#include "octet/dist/communicator.h"
#include "octet/model/model.h"

namespace octet {

class ParameterGather {
 public:
  // The gathers of model's parameters over the communicator's ranks, rank r owning
  // dist::shard_range(parameter_count, r, ranks); fp8_weights: FP8 weight gathers (above).
  ParameterGather(Model& model, dist::Communicator& ranks, bool fp8_weights);

  // After the update of this rank's shard: every shard on every rank, and the weights' copies remade.
  void gather();
  // Every parameter's float32 master values on every rank, up to date (a no-op where the last gather left
  // none stale). Every rank calls it together.
  void gather_master_weights();

  // What one gather moves: the bytes of the parameters gathered as FP8 codes and in float32 (the whole
  // buffer's; each rank receives all but its own part), and how many weights travel as codes. Planned
  // from the layers' present modes.
  struct Volume {
    int64_t fp8_bytes = 0;
    int64_t float32_bytes = 0;
    int64_t fp8_weights = 0;
  };
  Volume volume();
  bool fp8_weights() const { return fp8_weights_; }

 private:
  // A run of parameters that travels in float32, and where it lies in the packed buffer.
  struct Run {
    int64_t offset = 0;
    int64_t count = 0;
    int64_t packed = 0;
  };
  struct Plan {
    std::vector<Backend::WeightPart> parts;  // every weight gathered as codes, with this rank's part
    std::vector<Model::WeightCopySlot> others;  // the copies of the other weights, remade from float32
    std::vector<Run> runs;
    std::vector<int64_t> code_bounds;    // of each rank's codes in the codes buffer (ranks + 1)
    std::vector<int64_t> packed_bounds;  // of each rank's float32 values in the packed buffer (ranks + 1)
  };
  // From the layers' present modes (a precision phase may change them between steps).
  Plan plan();
  // buffer holding at least `bytes` (backend memory), reallocated where smaller.
  void* reserve(std::unique_ptr<Buffer>& buffer, size_t bytes);

  Model& model_;
  dist::Communicator& ranks_;
  bool fp8_weights_;
  // Whether the last gather left float32 masters stale (it gathered some weights as codes).
  bool stale_masters_ = false;
  std::unique_ptr<Buffer> codes_, packed_, amaxes_;
};

}  // namespace octet
