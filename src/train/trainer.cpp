// One optimizer step (see trainer.h).
#include "octet/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/io/atomic_file.h"
#include "octet/numerics/minifloat.h"
#include "overlapped_sums.h"
#include "parameter_gather.h"
#include "step_scaling.h"
#include "token_row_sums.h"

namespace octet {

namespace {

AdamW make_optimizer(Model& model, const TrainSettings& settings, const DataParallel& parallel) {
  // Emulated ranks keep the whole state: AdamW is element-wise, so updating the shards one after another is
  // updating the whole buffer.
  if (!parallel.shard_optimizer_state || parallel.communicator == nullptr) {
    return AdamW(model.backend(), model.parameters(), model.parameter_count(), settings.adamw);
  }
  const int ranks = static_cast<int>(parallel.shard_ranks());
  return AdamW(model.backend(), model.parameters(), model.parameter_count(), settings.adamw,
               dist::shard_range(model.parameter_count(), parallel.shard_rank(), ranks));
}

}  // namespace

Trainer::Trainer(Model& model, TrainSettings settings)
    : Trainer(model, std::move(settings), DataParallel{}) {}

Trainer::~Trainer() {
  if (gather_ != nullptr) {
    model_.set_parameters_needed(nullptr);
    model_.set_backward_parameters_needed(nullptr);
  }
}

DataParallel Trainer::checked(const TrainSettings& settings, const DataParallel& parallel) {
  OCTET_REQUIRE(settings.batch_size >= 1, "train.batch_size must be at least 1, got {}", settings.batch_size);
  OCTET_REQUIRE(settings.seq_len >= 1, "train.seq_len must be at least 1, got {}", settings.seq_len);
  OCTET_REQUIRE(settings.grad_accum_steps >= 1, "train.grad_accum_steps must be at least 1, got {}",
                settings.grad_accum_steps);
  OCTET_REQUIRE(settings.grad_clip >= 0.0f, "train.grad_clip must be 0 (off) or positive, got {}",
                settings.grad_clip);
  OCTET_REQUIRE(settings.max_consecutive_skips >= 1, "train.max_consecutive_skips must be at least 1, got {}",
                settings.max_consecutive_skips);
  OCTET_REQUIRE(
      parallel.emulated_ranks >= 1 && (parallel.communicator == nullptr || parallel.emulated_ranks == 1),
      "emulated ranks: at least 1, and only without a communicator; got {}", parallel.emulated_ranks);
  OCTET_REQUIRE(
      parallel.emulated_shard_ranks == 0 ||
          (parallel.communicator == nullptr && parallel.emulated_shard_ranks >= 1 &&
           parallel.emulated_ranks % parallel.emulated_shard_ranks == 0),
      "emulated shard groups of {} ranks: only without a communicator, and dividing the {} emulated "
      "ranks",
      parallel.emulated_shard_ranks, parallel.emulated_ranks);
  OCTET_REQUIRE(
      parallel.shard_communicator == nullptr ||
          (parallel.communicator != nullptr && parallel.shard_optimizer_state &&
           parallel.ranks() % parallel.shard_communicator->size() == 0),
      "a shard group's communicator: only with the optimizer state sharded, and with one over every "
      "rank");
  // A reduce-scatter over every rank leaves each rank the sums of a shard of the world, not of its group's.
  OCTET_REQUIRE(
      !parallel.reduce_scatter || parallel.shard_ranks() == parallel.ranks(),
      "distributed.sharded_gradient_sums = \"reduce_scatter\" with a hybrid layout (shard groups of {} of "
      "{} ranks) is not supported: use \"all_reduce\"",
      parallel.shard_ranks(), parallel.ranks());
  OCTET_REQUIRE(
      !parallel.reshard_after_forward || !parallel.shard_optimizer_state || parallel.fp8_weight_gather,
      "distributed.reshard_after_forward = true needs distributed.fp8_weight_gather = true: the "
      "copies given back and gathered again are those of the weights gathered as FP8 codes");
  return parallel;
}

std::unique_ptr<ParameterGather> Trainer::make_gather(Model& model, const DataParallel& parallel) {
  if (!parallel.shard_optimizer_state || parallel.communicator == nullptr) return nullptr;
  // Within the shard group: its ranks hold the shards of one copy of the state.
  auto gather = std::make_unique<ParameterGather>(model, *parallel.shard_group(), parallel.fp8_weight_gather,
                                                  parallel.in_place_gather_floats, parallel.gather_buffers,
                                                  parallel.reshard_after_forward);
  // The weights' copies are made from the whole masters by now: the masters the gathers will leave stale
  // are given back before the optimizer's moments take their memory.
  gather->release_before_first_gather();
  return gather;
}

Trainer::Trainer(Model& model, TrainSettings settings, DataParallel parallel)
    : model_(model),
      settings_(settings),
      parallel_(checked(settings, parallel)),
      gather_(make_gather(model, parallel_)),
      optimizer_(make_optimizer(model, settings, parallel)),
      scaler_(settings.loss_scale) {
  for (const Dtype storage : {Dtype::f32, Dtype::bf16}) {
    int64_t end = 0, last_offset = -1;
    for (const ParameterInfo& p : model.parameters()) {
      if (p.grad_type != storage) continue;
      // The shards' gradients are found by parameter (gradient_range): each buffer in the parameters' order.
      OCTET_CHECK(p.offset > last_offset && p.grad_offset >= end, "the gradient of {} after the ones before",
                  p.name);
      last_offset = p.offset;
      end = p.grad_offset + p.count;
    }
    (storage == Dtype::f32 ? gradient_floats_ : gradient_codes_) = end;
    (storage == Dtype::f32 ? float_runs_ : code_runs_) =
        gradient_runs(model.parameters(), storage, parallel_.reduce_type);
  }
  optimizer_.check_groups(model.weight_copy_slots());
  if (parallel_.ranks() > 1) step_scaling_ = std::make_unique<StepScaling>(model);
  OCTET_CHECK(optimizer_.sharded() == (gather_ != nullptr),
              "a gather of the parameters with a sharded optimizer");
  // The gather started after an update is waited for by the next forward, run by run.
  if (gather_ != nullptr) {
    model.set_parameters_needed([this](int64_t end) { gather_->wait(end); });
    // Fully sharded weights: the copies the forward gave back are gathered again for the backward.
    if (gather_->reshard()) {
      model.set_backward_parameters_needed([this](int64_t begin) { gather_->wait_backward(begin); });
    }
  }
  const std::optional<Model::TokenRowGradient> token_rows = model.token_row_gradient();
  if (parallel_.communicator != nullptr && parallel_.ranks() > 1 && parallel_.sparse_embedding_sums &&
      token_rows && !(optimizer_.sharded() && parallel_.reduce_scatter)) {
    token_rows_ = std::make_unique<TokenRowSums>(model.backend(), *token_rows);
  }
  // The buffer itself, taken now: grads() in the middle of a step would zero what the backward has not yet
  // written, and it moves no more.
  gradient_base_ = model.grads();
  gradient_codes_base_ = model.grads_bf16();
  for (const std::string& line : {model.policy().startup_line(), model.memory_line()}) {
    if (!line.empty() && settings_.log) settings_.log(line);
  }
  if (!settings_.run_directory.empty()) write_precision_map();
}

void Trainer::write_precision_map() {
  std::error_code ec;
  std::filesystem::create_directories(settings_.run_directory, ec);
  OCTET_REQUIRE(!ec, "cannot create the run directory {}: {}", settings_.run_directory.string(),
                ec.message());
  io::write_file_atomically(settings_.run_directory / "precision_map.json", precision_map_json(model_));
}

std::string Trainer::first_non_finite_gradient() {
  // In backward order: the LM head (tied to wte) first, then the last parameters back to the first.
  const auto& params = model_.parameters();
  std::vector<const ParameterInfo*> order = {&model_.parameter("wte")};
  for (auto it = params.rbegin(); it != params.rend(); ++it) order.push_back(&*it);
  if (!optimizer_.sharded()) {
    for (const ParameterInfo* p : order) {
      if (!model_.gradient_finite(*p)) return p->name;
    }
    return {};
  }
  // A rank holds the summed gradients of its shard only: each finds the first parameter whose part in its
  // shard is not finite, and the ranks agree on the first of those (a max of minus the positions).
  const dist::ShardRange& shard = optimizer_.shard();
  float first = -static_cast<float>(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const ParameterInfo& p = *order[i];
    const int64_t begin = std::max(p.offset, shard.begin);
    const int64_t end = std::min(p.offset + p.count, shard.end);
    if (begin >= end) continue;
    const void* at = static_cast<const std::byte*>(model_.gradient(p)) +
                     (begin - p.offset) * (p.grad_type == Dtype::f32 ? 4 : 2);
    // A float64 sum of squares is finite exactly when every value is.
    const bool finite =
        p.grad_type == Dtype::f32
            ? model_.backend().all_finite(static_cast<const float*>(at), end - begin)
            : std::isfinite(model_.backend().sum_of_squares(ConstTensorView(at, p.grad_type, {end - begin})));
    if (!finite) {
      first = -static_cast<float>(i);
      break;
    }
  }
  parallel_.shard_group()->all_reduce_max(std::span<float>(&first, 1));
  const auto position = static_cast<size_t>(-first);
  return position < order.size() ? order[position]->name : std::string();
}

double Trainer::gradient_sum_of_squares() {
  if (parallel_.ranks() == 1) return model_.gradient_sum_of_squares();
  // Each shard's sum of squares, and the shards' sums added in rank order: the ranks of a sharded state hold
  // the summed gradients of their shard only (reduce-scatter); without one, every rank holds every sum and
  // takes its shard's squares alone, a part of the work each. Emulated ranks add the same sums in the same
  // order. The shards are the shard group's.
  const int ranks = static_cast<int>(parallel_.shard_ranks());
  const float* grads = model_.grads();
  const void* codes = model_.grads_bf16();
  auto shard_sum = [&](int rank) {
    const dist::ShardRange s = dist::shard_range(model_.parameter_count(), rank, ranks);
    const auto [fb, fe] = gradient_range(Dtype::f32, s.begin, s.end);
    const auto [cb, ce] = gradient_range(Dtype::bf16, s.begin, s.end);
    double sum = fb < fe ? model_.backend().sum_of_squares(ConstTensorView(grads + fb, {fe - fb})) : 0.0;
    if (cb < ce) {
      sum += model_.backend().sum_of_squares(
          ConstTensorView(static_cast<const uint16_t*>(codes) + cb, Dtype::bf16, {ce - cb}));
    }
    return sum;
  };
  if (parallel_.communicator != nullptr) {
    double sum = shard_sum(parallel_.shard_rank());
    parallel_.shard_group()->all_reduce_sum(std::span<double>(&sum, 1));
    return sum;
  }
  double sum = shard_sum(0);
  for (int r = 1; r < ranks; ++r) sum = sum + shard_sum(r);
  return sum;
}

StepResult Trainer::step(const BatchSource& data) {
  const int64_t B = settings_.batch_size, T = settings_.seq_len, micro = settings_.grad_accum_steps;
  StepResult r;
  r.step = step_;
  r.loss_scale = scaler_.scale();
  r.learning_rate = settings_.schedule.at(step_);
  r.tokens = B * T * micro * parallel_.ranks();
  const GemmCounters before = model_.counters();
  const auto phase = [this](StepPhase p) {
    if (settings_.phase_began) settings_.phase_began(p);
  };
  host_part("step start");
  // Before the first step's activations take their memory: the masters the gathers will leave stale go now
  // (again, where weights were loaded since the trainer was made).
  if (gather_ != nullptr) gather_->release_before_first_gather();

  phase(StepPhase::optimizer);
  // The gradient of the scaled mean loss over the step's micro-batches on every rank; each forward runs the
  // LM head's backward with it, chunk by chunk.
  const int64_t micro_batches = micro * parallel_.ranks();
  const float dloss = r.loss_scale / static_cast<float>(B * T * micro_batches);
  double loss_sum = accumulate(data, dloss, phase);
  host_part("loss sum");
  if (parallel_.communicator != nullptr) {
    parallel_.communicator->all_reduce_sum(std::span<double>(&loss_sum, 1));
  }
  // A float64 sum of the losses is finite exactly when every loss is; every rank sees the same sum.
  const bool loss_finite = std::isfinite(loss_sum);
  if (step_scaling_) {
    host_part("step scaling");
    step_scaling_->finish(parallel_.communicator);
  }
  host_part("gradient sums");
  for (std::unique_ptr<OverlappedSums>* sums : {&overlapped_, &overlapped_codes_}) {
    if (*sums == nullptr) continue;  // the sums started during the last backward: finished whatever the loss
    (*sums)->finish();
    sums->reset();
  }
  phase(StepPhase::optimizer);
  r.loss = static_cast<float>(loss_sum / static_cast<double>(micro_batches));
  r.fp8_gemms = model_.counters().fp8_gemms - before.fp8_gemms;
  r.other_gemms = model_.counters().other_gemms - before.other_gemms;

  host_part("gradient norm");
  double sum_of_squares = 0.0;
  if (!loss_finite) {
    r.skip_reason = fmt::format("non-finite loss ({})", r.loss);
  } else {
    // A float64 sum of float32 squares is finite exactly when every gradient is: one reduction checks them
    // all, and only a non-finite sum pays for the search, tensor by tensor, for the first bad one.
    sum_of_squares = gradient_sum_of_squares();
    const std::string name = std::isfinite(sum_of_squares) ? std::string() : first_non_finite_gradient();
    if (!name.empty()) {
      r.skip_reason = fmt::format("non-finite gradient in {}", name);
      if (settings_.loss_scale.dynamic) r.skip_reason += fmt::format(" at loss scale {}", r.loss_scale);
    }
  }
  if (!r.skip_reason.empty()) {
    r.skipped = true;
    r.grad_norm = NAN;
    scaler_.update(true);
    ++step_;
    if (++consecutive_skips_ >= settings_.max_consecutive_skips) {
      throw Error(
          ErrorKind::training_failed,
          fmt::format("training stopped at step {}: {} consecutive steps skipped, the last for a {}; the "
                      "loss scale is now {}. Lower the learning rate, check the data, or train in bf16 "
                      "to see whether precision is the cause",
                      r.step + 1, consecutive_skips_, r.skip_reason, scaler_.scale()));
    }
    phase(StepPhase::done);
    return r;
  }

  r.grad_norm = static_cast<float>(std::sqrt(sum_of_squares) / r.loss_scale);
  const float clip = settings_.grad_clip > 0.0f && r.grad_norm > settings_.grad_clip
                         ? settings_.grad_clip / r.grad_norm
                         : 1.0f;
  host_part("update");
  // The weight copies for the next step are remade by the update itself.
  const std::vector<Model::WeightCopySlot> copies = model_.weight_copy_slots();
  optimizer_.step(model_.params(), model_.grads(), r.learning_rate, clip / r.loss_scale, copies,
                  model_.grads_bf16());
  if (optimizer_.sharded()) gather_parameters();
  scaler_.update(false);
  consecutive_skips_ = 0;
  ++step_;
  phase(StepPhase::done);
  return r;
}

double Trainer::accumulate(const BatchSource& data, float dloss,
                           const std::function<void(StepPhase)>& phase) {
  const int64_t B = settings_.batch_size, T = settings_.seq_len, micro = settings_.grad_accum_steps;
  std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  // Emulated ranks: each group of micro-batches accumulates from zero as a rank would, and the groups' sums
  // are added in order on the host, the additions the ranks' all-reduce makes (data_parallel.h): in
  // float32, or in BF16 with every operand and partial sum rounded as Communicator::all_reduce_sum_bf16 does.
  const int64_t groups = parallel_.communicator != nullptr ? 1 : parallel_.emulated_ranks;
  std::vector<float> group_sum, group;
  double loss_sum = 0.0;
  if (step_scaling_) step_scaling_->begin();
  if (token_rows_) token_rows_->clear();
  for (int64_t g = 0; g < groups; ++g) {
    model_.zero_grad();
    double group_loss = 0.0;
    for (int64_t m = 0; m < micro; ++m) {
      phase(StepPhase::data);
      host_part("data");
      data(tokens.data(), targets.data());
      if (token_rows_) token_rows_->add(tokens.data(), B * T);
      phase(StepPhase::forward);
      host_part("forward");
      const float loss = model_.forward(tokens.data(), targets.data(), B, T, dloss);
      group_loss += loss;
      phase(StepPhase::backward);
      host_part("backward");
      // The last micro-batch's backward starts the ranks' sums of the gradients it finishes.
      if (m == micro - 1 && overlap_gradient_sums()) {
        if (token_rows_) token_rows_->agree(*parallel_.communicator);
        const int64_t shard_total =
            optimizer_.sharded() && parallel_.reduce_scatter ? model_.parameter_count() : 0;
        overlapped_ = std::make_unique<OverlappedSums>(*parallel_.communicator, gradient_base_, Dtype::f32,
                                                       float_runs_, model_.backend().native_stream(),
                                                       bucket_elements(), shard_total, token_rows_.get());
        if (gradient_codes_ > 0) {
          overlapped_codes_ = std::make_unique<OverlappedSums>(
              *parallel_.communicator, gradient_codes_base_, Dtype::bf16, code_runs_,
              model_.backend().native_stream(), bucket_elements(), shard_total);
        }
        model_.set_gradient_ready([this](Dtype storage, int64_t begin, int64_t end) {
          (storage == Dtype::f32 ? overlapped_ : overlapped_codes_)->ready(begin, end);
        });
      }
      model_.backward(dloss);
      model_.set_gradient_ready(nullptr);
      // The last micro-batch's restored states go to the device once, updated, in finish() (the probe
      // runs the model in between, so it keeps the usual order).
      if (step_scaling_) {
        host_part("step scaling");
        step_scaling_->after_micro_batch(g == groups - 1 && m == micro - 1 && !probe_);
      }
      if (probe_ && g == 0 && m == 0) probe_(MicroBatch{tokens.data(), targets.data(), B, T, loss, dloss});
    }
    loss_sum = g == 0 ? group_loss : loss_sum + group_loss;
    if (groups == 1) break;
    // The float32 gradients, then the bf16 ones widened.
    group.resize(static_cast<size_t>(gradient_floats_ + gradient_codes_));
    model_.backend().copy_to_host(group.data(), model_.grads(),
                                  static_cast<size_t>(gradient_floats_) * sizeof(float));
    if (gradient_codes_ > 0) {
      std::vector<uint16_t> codes(static_cast<size_t>(gradient_codes_));
      model_.backend().copy_to_host(codes.data(), model_.grads_bf16(), codes.size() * sizeof(uint16_t));
      for (size_t i = 0; i < codes.size(); ++i)
        group[static_cast<size_t>(gradient_floats_) + i] = bf16_to_float(codes[i]);
    }
    add_emulated_rank(group_sum, group, g == 0);
  }
  if (groups > 1) {
    model_.backend().copy_from_host(model_.grads(), group_sum.data(),
                                    static_cast<size_t>(gradient_floats_) * sizeof(float));
    if (gradient_codes_ > 0) {
      std::vector<uint16_t> codes(static_cast<size_t>(gradient_codes_));
      for (size_t i = 0; i < codes.size(); ++i)
        codes[i] = float_to_bf16(group_sum[static_cast<size_t>(gradient_floats_) + i]);
      model_.backend().copy_from_host(model_.grads_bf16(), codes.data(), codes.size() * sizeof(uint16_t));
    }
  }
  return loss_sum;
}

void Trainer::add_emulated_rank(std::vector<float>& sum, const std::vector<float>& group, bool first) const {
  // The elements the ranks sum in BF16: every operand rounded, and every partial sum.
  std::vector<uint8_t> bf16(group.size(), 0);
  for (const Dtype storage : {Dtype::f32, Dtype::bf16}) {
    const int64_t at = storage == Dtype::f32 ? 0 : gradient_floats_;
    for (const GradientRun& r : storage == Dtype::f32 ? float_runs_ : code_runs_) {
      if (r.bf16) std::fill(bf16.begin() + at + r.begin, bf16.begin() + at + r.end, 1);
    }
  }
  if (first) sum.assign(group.size(), 0.0f);
  for (size_t i = 0; i < group.size(); ++i) {
    if (bf16[i] == 0) {
      sum[i] = first ? group[i] : sum[i] + group[i];
    } else {
      sum[i] = first ? round_to_bf16(group[i]) : round_to_bf16(sum[i] + round_to_bf16(group[i]));
    }
  }
}

std::pair<int64_t, int64_t> Trainer::gradient_range(Dtype storage, int64_t begin, int64_t end) const {
  int64_t first = 0, last = 0;
  bool any = false;
  for (const ParameterInfo& p : model_.parameters()) {
    const int64_t b = std::max(begin, p.offset), e = std::min(end, p.offset + p.count);
    if (p.grad_type != storage || b >= e) continue;
    if (!any) first = p.grad_offset + (b - p.offset);
    last = p.grad_offset + (e - p.offset);
    any = true;
  }
  return {first, last};
}

int64_t Trainer::bucket_elements() const {
  // 0: one bucket larger than every gradient, so that every sum starts in finish(), after the backward.
  return parallel_.bucket_elements > 0 ? parallel_.bucket_elements
                                       : std::max({gradient_floats_, gradient_codes_, int64_t{1}}) + 1;
}

bool Trainer::overlap_gradient_sums() const {
  // Every rank receives the whole buffer's sums, float32 or BF16; with a sharded optimizer and
  // DataParallel::reduce_scatter, the sums of its shard alone (half the bytes), and the gradients outside its
  // shard stay its own, unsummed: the norm, the non-finite search and the update read the shard only.
  return parallel_.communicator != nullptr;
}

void Trainer::gather_parameters() {
  gather_->start();
}

size_t Trainer::released_master_bytes() const {
  return gather_ != nullptr ? gather_->released_bytes() : 0;
}

void Trainer::gather_master_weights() {
  if (gather_ != nullptr) gather_->gather_master_weights();
}

std::vector<float> Trainer::master_weights(bool keep) {
  if (gather_ != nullptr) return gather_->master_weights(keep);
  std::vector<float> host(keep ? static_cast<size_t>(model_.parameter_count()) : 0);
  if (keep) model_.backend().copy_to_host(host.data(), model_.params(), host.size() * sizeof(float));
  return host;
}

std::vector<Backend::Range> Trainer::stale_master_ranges() const {
  return gather_ != nullptr ? gather_->stale_ranges() : std::vector<Backend::Range>{};
}

GatherVolume Trainer::parameter_gather_volume() {
  return gather_ != nullptr ? gather_->volume() : GatherVolume{};
}

bool Trainer::forwards_gather() const {
  return gather_ != nullptr && gather_->reshard();
}

float Trainer::evaluate(const BatchSource& data, int64_t batches) {
  const int64_t B = settings_.batch_size, T = settings_.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  // The parameters still on their way, and their copies, made as training makes them (an evaluation's
  // forward would remake them with its casts' telemetry off).
  if (gather_ != nullptr) gather_->finish();
  model_.set_scaling_updates(false);
  double sum = 0.0;
  for (int64_t i = 0; i < batches; ++i) {
    data(tokens.data(), targets.data());
    sum += model_.forward(tokens.data(), targets.data(), B, T);
  }
  model_.set_scaling_updates(true);
  return static_cast<float>(sum / static_cast<double>(batches));
}

}  // namespace octet
