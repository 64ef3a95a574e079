// The gather of a sharded optimizer's updated parameters (ZeRO-1, docs/distributed.md): every rank's shard
// of the float32 master weights to every rank, and the weights' copies remade.
//
// The gather overlaps with the next step's forward. start() (after the update) enqueues one gather per run
// of the forward's parameters (Model::forward_parameter_bounds: the embeddings, each block, the final norm
// and head) on the communicator's stream and returns; the model's forward calls wait(end) before it reads
// a run (Model::set_parameters_needed), which makes the backend's stream wait for that run's gather and
// remakes its weight copies. Block l's weights thus arrive while blocks before it compute. Whatever else
// reads the parameters between steps calls finish() first (Trainer::gather_master_weights does).
//
// With FP8 weight gathers (distributed.fp8_weight_gather), a weight whose every GEMM runs in FP8 with one
// scale per tensor travels as its FP8 codes instead: the ranks take the largest of their parts' amaxes
// (one all-reduce of every such weight's amax), each rank casts the part of each weight that its shard holds
// with the scale that amax gives (the scale the whole weight's cast would take, so the same codes), the ranks
// gather the codes, and each rank makes the weights' copies from them (the transposes made after the
// gather). One byte an element where float32 takes four. The other parameters (embeddings, norms, biases,
// layers with a BF16 GEMM, a head tied to the embedding) travel in float32 as before: the small ones packed
// into one run per run of the forward, the large ones (an embedding, a head) gathered in place. A weight
// gathered as codes keeps stale float32 master values outside the rank's shard, which nothing reads during
// training (the copies stand for the weight); gather_master_weights() brings them up to date where something
// does (a checkpoint).
//
// The codes are not held for every weight at once: each rank casts its parts into a buffer of its own
// codes, and the gathers go through `buffers` buffers of one run each, in turn. The gathers of the first
// `buffers` runs with codes start with start(); each later one when wait() has made the copies of the run
// `buffers` before it (its buffer then free), so the gathers stay that many runs ahead of the forward. A
// run's own codes are copied into its buffer just before its gather. The casts all happen in start(), as
// before, so each weight's scaling state moves at the same point of the step.
//
// Fully sharded weights (reshard, DataParallel::reshard_after_forward): the copies of the weights gathered
// as codes are given back (Backend::release_weight_copies) as soon as the forward or the backward is done
// with their run, and gathered again from the ranks' own codes before the next pass reads them: a forward
// gives back each run's copies when it moves on to the next run (all but the last run with codes, which the
// backward reads first), a backward gathers each run again (Model::set_backward_parameters_needed) and
// gives it back when it moves on, each pass prefetching the runs it reads next through the gather buffers.
// Each rank then holds the copies of a run or two at a time instead of every weight's. The codes are those
// of the last cast (the same copies, bit for bit: the same training); where refresh_weight_copies remade
// every copy since (Model::weight_copies_made: the first step, a checkpoint loaded, a recalibration), a
// rank's own codes are taken from its copies (Backend::weight_part_codes).
//
// The memory of those stale masters is given back (the first step of fully sharded parameters): start()
// releases the pages of the parameter buffer (Model::parameter_memory, Buffer::release) that lie wholly
// inside the stale ranges, and maps every page back first where the ranges change (a layer changed mode,
// and a float32 gather may now write them). gather_master_weights() maps them back before it gathers.
// Touching a page given back is a fault on the CPU and on a GPU, never a silent read of stale values.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "octet/backend/backend.h"
#include "octet/dist/communicator.h"
#include "octet/model/model.h"
#include "octet/train/data_parallel.h"

namespace octet {

class ParameterGather {
 public:
  // The gathers of model's parameters over the communicator's ranks, rank r owning
  // dist::shard_range(parameter_count, r, ranks); fp8_weights: FP8 weight gathers (above), whose float32
  // runs of at least in_place_floats elements are gathered in place (DataParallel::in_place_gather_floats).
  // `buffers` (at least 1): the runs' codes held at once (DataParallel::gather_buffers).
  // reshard: fully sharded weights (above; only with fp8_weights).
  ParameterGather(Model& model, dist::Communicator& ranks, bool fp8_weights, int64_t in_place_floats,
                  int buffers = 2, bool reshard = false);
  // Waits for the gathers under way, if any (their buffers are this object's).
  ~ParameterGather();
  ParameterGather(const ParameterGather&) = delete;
  ParameterGather& operator=(const ParameterGather&) = delete;

  // After the update of this rank's shard: starts the gathers of every shard to every rank (above).
  void start();
  // Before the first gather (the first step, once the weights are loaded and their copies made from the
  // whole masters): gives back the memory of the masters the gathers will leave stale (above) at once, so
  // that it is free before the first step's activations are allocated. A no-op after the first start().
  void release_before_first_gather();
  // The parameters below `end` (one of the forward's bounds) and their weight copies are up to date for the
  // work enqueued on the backend from now on; with end = parameter_count(), every gather is also complete.
  // A no-op where nothing is under way. Every rank calls it at the same points.
  void wait(int64_t end);
  // Fully sharded weights: the backward is about to read the run that begins at `begin` (one of the
  // forward's bounds, in the reverse of their order): its copies are made again (prefetching the runs
  // before it), and those of the runs after it given back. A no-op without reshard.
  void wait_backward(int64_t begin);
  // Every gather under way complete and its copies made, the parameters gathered in float32 in place; with
  // reshard, the copies of the runs whose gathers had not started are made by the pass that reads them.
  void finish();
  // Every parameter's float32 master values on every rank, up to date (a no-op where the last gather left
  // none stale). Every rank calls it together.
  void gather_master_weights();
  // Every parameter's float32 master values, to the host of the ranks that keep them (the others get an
  // empty vector), without making them whole on the device: each window of the buffer (at most 256 MiB)
  // is gathered from the ranks' shards into a buffer of its own and copied out, so that the memory of stale
  // masters stays given back (a checkpoint's save). Every rank calls it together.
  std::vector<float> master_weights(bool keep);

  // The ranges of the parameters whose float32 master values this rank leaves stale: each weight gathered as
  // codes, less this rank's part of it. Nothing reads them until gather_master_weights() (a test poisons
  // them to show it), so fully sharded parameters can give their memory back. Empty where nothing is stale.
  std::vector<Backend::Range> stale_ranges() const;
  // The bytes of the parameter buffer given back (above); 0 where none are stale, or where the backend's
  // memory cannot be given back.
  size_t released_bytes() const { return released_bytes_; }
  // What one gather moves (data_parallel.h), planned from the layers' present modes.
  GatherVolume volume();
  bool fp8_weights() const { return fp8_weights_; }
  bool reshard() const { return reshard_; }

 private:
  // A run of parameters that travels in float32: through the packed buffer (where it lies there), or, from
  // in_place_floats elements on (a token embedding, a head), gathered in place in the parameters, which
  // spares the packed buffer a copy of it.
  struct Run {
    int64_t offset = 0;
    int64_t count = 0;
    int64_t packed = 0;
    bool in_place = false;
  };
  // One run of the forward's parameters [begin, end) and what its gather holds: its codes
  // [codes_begin, codes_end) of every weight's codes (gathered in gather buffer `buffer` while code_ticket
  // is not -1; `held` once the copies are made from them, until they are given back) and its float32
  // values [packed_begin, packed_end) of the packed one (FP8 gathers), or [begin, end) of the parameters
  // themselves (float32 gathers, in place); the indices of its parts, runs and other copies; the ticket of
  // its last gather (-1: none).
  struct Group {
    int64_t begin = 0, end = 0;
    int64_t codes_begin = 0, codes_end = 0;
    int buffer = -1;  // the gather buffer of its codes while their gather is under way (-1: none)
    int64_t code_ticket = -1;
    bool held = false;
    int64_t packed_begin = 0, packed_end = 0;
    size_t parts_begin = 0, parts_end = 0;
    size_t runs_begin = 0, runs_end = 0;
    size_t others_begin = 0, others_end = 0;
    int64_t ticket = -1;
  };
  struct Plan {
    std::vector<Backend::WeightPart> parts;     // every weight gathered as codes, with this rank's part
    std::vector<Model::WeightCopySlot> others;  // the copies of the other weights, remade from float32
    std::vector<Run> runs;                      // the float32 parameters (FP8 gathers only)
    std::vector<int64_t> code_bounds;           // of each rank's codes among every weight's codes (ranks + 1)
    std::vector<int64_t> packed_bounds;  // of each rank's float32 values in the packed buffer (ranks + 1)
    int64_t in_place = 0;                // the float32 values gathered in place
    std::vector<Group> groups;           // in the forward's order
    bool codes = false;                  // whether any weight travels as codes
  };
  // From the layers' present modes (a precision phase may change them between steps).
  Plan plan();
  // buffer holding at least `bytes` (backend memory), reallocated where smaller.
  void* reserve(std::unique_ptr<Buffer>& buffer, size_t bytes);
  // This rank's parts of plan_'s weights with their codes counted from the start of its own codes
  // (own_codes_, reserved, at *own): where cast_weight_parts writes them and weight_part_codes takes them.
  std::vector<Backend::WeightPart> own_parts(uint8_t** own);
  // Casts this rank's parts of the weights gathered as codes into its own codes and packs its float32
  // values (FP8 gathers).
  void cast_parts();
  // Copies this rank's codes of group `g` into a free gather buffer and starts their gather.
  void start_codes(Group& g);
  // Makes the copies of group `g` from its gathered codes (its gather started where it had not), freeing
  // its buffer; a no-op where they are held. A gather buffer is freed first where none is.
  void make_copies(Group& g);
  // Starts the gathers of the groups with codes that a pass reads next, from code_groups_[from] on, forward
  // or backward, while gather buffers are free: the groups not held and not under way, in order, up to the
  // first held or under way one past a not-held one.
  void prefetch(ptrdiff_t from, bool forward);
  // Gives back the copies of group `g` (reshard), if held.
  void release_copies(Group& g);
  // Where refresh_weight_copies remade every copy since this rank's own codes were cast (reshard): its own
  // codes taken from the copies, every group held.
  void adopt_copies();
  // The index in code_groups_ of the first group with codes at or after group `g` (its size where none).
  size_t code_position(size_t g) const;
  // The parts of group `g` with their codes counted from `at` (codes_offset - at).
  std::vector<Backend::WeightPart> parts_from(const Group& g, int64_t at) const;
  // Gives back the pages of the stale ranges of plan_, mapping every page back first where they differ from
  // the ranges given back before.
  void release_stale_masters();
  // Maps every page given back again (their values stale).
  void restore_masters();
  // Where each rank's shard of the parameters begins, in bytes, and the buffer's end (ranks + 1).
  std::vector<int64_t> shard_byte_bounds() const;
  // Starts the gather of [begin, end) of `values` (of `count` bytes split at each rank's bound `bounds`),
  // each rank's part its bounds' intersection with the range; -1 where the range is empty.
  int64_t start_range(std::byte* values, const std::vector<int64_t>& bounds, int64_t begin, int64_t end);
  // The float32 parameters of a group whose gather is complete for the backend's stream, and the copies
  // of the weights that travel in float32.
  void remake_copies(const Group& g);
  // Group i of the gather start() began: its float32 values and other copies, and (copies) its copies
  // from codes, prefetching the next group's codes.
  void complete_group(size_t i, bool copies);
  // plan_ from the layers' present modes, with its groups with codes and every gather buffer free.
  void set_plan();

  Model& model_;
  dist::Communicator& ranks_;
  bool fp8_weights_;
  int64_t in_place_floats_;
  int buffers_;
  bool reshard_;
  int64_t copies_seen_ = -1;       // the model's weight_copies_made() that own_codes_ match
  std::vector<int> free_buffers_;  // the gather buffers no gather is using
  // Whether the last gather left float32 masters stale (it gathered some weights as codes).
  bool stale_masters_ = false;
  // The stale ranges whose pages are given back, and the bytes that freed.
  std::vector<Backend::Range> released_;
  size_t released_bytes_ = 0;
  Plan plan_;              // of the gather under way
  size_t next_group_ = 0;  // its first group not yet waited for
  std::vector<size_t> code_groups_;  // the groups with codes, in order
  bool under_way_ = false;           // the float32 gathers started by start() (next_group_ on)
  bool started_ = false;  // whether start() ever ran
  std::unique_ptr<Buffer> own_codes_, packed_, amaxes_;
  std::vector<std::unique_ptr<Buffer>> gather_buffers_;
};

}  // namespace octet
