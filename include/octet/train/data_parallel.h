// Data-parallel training: how the trainer (trainer.h) spreads an optimizer step over ranks, each holding a
// replica of the model, and which rank reads which micro-batches.
//
// A step of G = ranks x train.grad_accum_steps micro-batches runs as follows. Rank r reads micro-batches
// r * M .. r * M + M - 1 of the step (M = train.grad_accum_steps) and accumulates their gradients as one
// rank always has; the ranks' gradients and losses are then summed through the communicator in rank order;
// every rank takes the same gradient norm, the same skip decision and the same update. FP8 scaling moves once
// per step: every micro-batch casts with the scales the step began with, and the step's amax of each operand
// is the largest any rank saw (one all-reduce of all amaxes), so that every rank keeps the same scaling
// state.
//
// The sum of the step's gradients is therefore (((g_0 + g_1) + g_2) + ...), g_r being rank r's accumulated
// gradient. One rank reproduces that sum bit for bit by accumulating its G micro-batches in `emulated_ranks`
// groups of M, each group from zero as a rank does, and adding the groups' sums in order: the very same
// additions (in float32, or in BF16 with the same roundings). Accumulating all G micro-batches into one
// buffer would add in a different order (the backward GEMMs, the embedding's and the biases' gradients add
// each micro-batch into the running sum element by element), which is why a data-parallel run and a run with
// plain accumulation agree only to rounding; the grouped accumulation makes "the same bits on N ranks as on
// one" a property that tests check.
#pragma once

#include <cstdint>

#include "octet/dist/communicator.h"
#include "octet/dist/topology.h"
#include "octet/train/batch_source.h"

namespace octet {

struct DataParallel {
  // The ranks this one trains with; null: one rank on its own.
  dist::Communicator* communicator = nullptr;
  // ZeRO stage 1: each rank keeps the AdamW moments of its contiguous shard of the parameters only
  // (dist::shard_range over every rank, or over its shard group: shard_communicator below), receives the
  // summed gradients of that shard only (a reduce-scatter: the gradients outside its shard stay unsummed, and
  // nothing reads them), updates that shard of the float32 master weights, and the updated parameters are
  // all-gathered in place (Communicator::all_gather_shards) before the weight copies are remade. The gradient
  // norm's sum of squares is then taken shard by shard, the shards' sums added in rank order. Emulated ranks
  // take the norm the same way (their optimizer keeps the whole state, whose element-wise update is the
  // same).
  bool shard_optimizer_state = false;
  // With a sharded optimizer state: each rank receives the sums of its shard's gradients only (a
  // reduce-scatter, Communicator::start_reduce_scatter_sum) rather than the whole buffer's (all-reduce). The
  // update, the norm and the non-finite search read the shard only either way.
  bool reduce_scatter = false;
  // With a sharded optimizer state: the weights whose GEMMs all run in FP8 are gathered as their FP8 codes,
  // cast by each rank for its shard with the scale of the whole weight's amax over every rank (one byte an
  // element where float32 takes four; the same copies, so the same training, bit for bit); the float32
  // master values of those weights outside a rank's shard are then brought up to date only where something
  // reads them (Trainer::gather_master_weights). src/train/parameter_gather.h.
  bool fp8_weight_gather = false;
  // With FP8 weight gathers, the parameters that still travel in float32 go packed into one buffer per run
  // of the forward (norms and biases: one gather for many small tensors), except the runs of at least this
  // many elements (a token embedding, a head), gathered in place in the parameters so that the packed
  // buffer holds no copy of them.
  int64_t in_place_gather_floats = int64_t{1} << 20;
  // With FP8 weight gathers, the gathered codes of this many runs of the forward (blocks) are held at once:
  // each rank keeps its own codes, and a run's gather starts once the run this many before it has made its
  // copies (prefetching that far ahead of the forward), in place of a buffer of every weight's codes.
  int gather_buffers = 2;
  // With FP8 weight gathers: fully sharded weights (FSDP's reshard after forward). The copies made from the
  // gathered codes are given back as soon as the forward, and then the backward, is done with their run,
  // and gathered again for the backward (and for every micro-batch's forward): each rank holds the copies
  // of a run or two instead of every weight's, for one more gather of the codes per pass. The same copies,
  // so the same training, bit for bit. src/train/parameter_gather.h.
  bool reshard_after_forward = false;
  // The type the ranks sum their gradients in: float32, or BF16, each rank's accumulated gradient and every
  // partial sum rounded to BF16 (Communicator::all_reduce_sum_bf16; emulated ranks round alike).
  dist::GradientReduceType reduce_type = dist::GradientReduceType::float32;
  // Float32 sums over a communicator start during the last micro-batch's backward in buckets of at least
  // this many gradients (src/train/overlapped_sums.h); 0: every sum starts after the backward.
  int64_t bucket_elements = int64_t{1} << 24;
  // Without a communicator: accumulate each step as this many ranks would (above), to reproduce a
  // data-parallel run on one rank. 1: plain accumulation, the behaviour of a run of one rank.
  int64_t emulated_ranks = 1;
  // A hybrid layout (topology.h: dp_shard and dp_replicate both above 1): the optimizer state is sharded
  // over this rank's shard group alone, whose communicator this is (Communicator::split of `communicator`),
  // and every group holds a whole copy of it. The gradients are still summed over every rank, in rank order
  // (so N ranks keep the bits of one rank emulating N); the shard, the update, the parameters' gather, the
  // norm's sum of squares and the non-finite search are the shard group's, and every group computes the
  // same. Null: the state is sharded over every rank of `communicator`. The reduce-scatter above is not
  // available with a hybrid layout.
  dist::Communicator* shard_communicator = nullptr;
  // Without a communicator: the ranks of a shard group that the emulated ranks stand for (the norm is taken
  // over that many shards, as such a group takes it); 0: every emulated rank.
  int64_t emulated_shard_ranks = 0;
  // Over a communicator, unless the sums are reduce-scatters: a gradient whose rows are indexed by input
  // tokens (Model::token_row_gradient: an untied token embedding) is summed in the rows that some rank's
  // micro-batches of the step read only (src/train/token_row_sums.h): the same bits as summing every row,
  // for a fraction of the bytes. False: every row.
  bool sparse_embedding_sums = true;

  int64_t ranks() const { return communicator != nullptr ? communicator->size() : emulated_ranks; }
  int rank() const { return communicator != nullptr ? communicator->rank() : 0; }
  // The ranks that share one copy of a sharded optimizer state, and this rank's place among them.
  dist::Communicator* shard_group() const {
    return shard_communicator != nullptr ? shard_communicator : communicator;
  }
  int64_t shard_ranks() const {
    if (shard_group() != nullptr) return shard_group()->size();
    return emulated_shard_ranks > 0 ? emulated_shard_ranks : emulated_ranks;
  }
  int shard_rank() const { return shard_group() != nullptr ? shard_group()->rank() : 0; }
};

// What one gather of a sharded optimizer's parameters moves (src/train/parameter_gather.h): the bytes of
// the parameters gathered as FP8 codes and in float32 (the whole buffer's; each rank receives all but its
// own part), and how many weights travel as codes. Zeros where the optimizer state is whole.
struct GatherVolume {
  int64_t fp8_bytes = 0;
  int64_t float32_bytes = 0;
  int64_t fp8_weights = 0;
  // Fully sharded weights (DataParallel::reshard_after_forward): the copies of the weights gathered as codes
  // given back after use, their codes gathered again for each backward (all but the last run's) and each
  // later micro-batch's forward; what those copies take when all are held.
  bool reshard = false;
  int64_t copy_bytes = 0;
};

// Rank `rank`'s micro-batches out of `global`, the source of every rank's micro-batches in order: of each
// step's ranks x micro_batches micro-batches of [B, T], it returns those of index rank * micro_batches ..
// (rank + 1) * micro_batches - 1 and reads past the others. Every rank's source thus reads the whole global
// batch of every step and stands, between steps, where one rank's would: a data loader's position is the
// same on every rank and holds for any number of ranks (a run resumes on another number of ranks exactly).
BatchSource rank_batches(BatchSource global, int rank, int ranks, int64_t micro_batches, int64_t B,
                         int64_t T);

}  // namespace octet
