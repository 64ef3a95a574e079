// Planted trouble, reported: one layer's activations are made 64 times larger (its LayerNorm gain times 64,
// its weight divided by 64, so the layer computes the same function) under static scaling with a scale that
// suits every other tensor. That layer's activation saturates at every step; octet inspect must put it at
// the top of its saturation list, the alert must fire once with one event row, and with
// fp8.on_alert = "bf16_layer" the layer must move to BF16 (gemms table, precision map, three FP8 GEMMs fewer
// per step) while training goes on to the end with finite losses.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model_fixture.h"
#include "octet/telemetry/recorder.h"
#include "octet/train/telemetry_source.h"
#include "process.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kPlanted = "h.1.mlp.c_fc";
constexpr int64_t kSteps = 30;
constexpr int64_t kInterval = 5;

struct PlantedRun {
  fs::path dir;
  std::vector<std::string> log;
  std::vector<StepResult> steps;
};

// The planted layer: its LayerNorm gain times 64 and its weight divided by 64, so that the layer computes the
// same function with activations 64 times larger.
void plant(Model& model, Backend& backend) {
  std::vector<float> params(static_cast<size_t>(model.parameter_count()));
  backend.copy_to_host(params.data(), model.params(), params.size() * sizeof(float));
  const ParameterInfo& gain = model.parameter("h.1.ln_2.weight");
  const ParameterInfo& weight = model.parameter(std::string(kPlanted) + ".weight");
  for (int64_t i = 0; i < gain.count; ++i) params[static_cast<size_t>(gain.offset + i)] *= 64.0f;
  for (int64_t i = 0; i < weight.count; ++i) params[static_cast<size_t>(weight.offset + i)] /= 64.0f;
  backend.copy_from_host(model.params(), params.data(), params.size() * sizeof(float));
  model.refresh_weight_copies();
}

struct PlantOptions {
  RecipeKind recipe = RecipeKind::static_scale;
  std::optional<int64_t> planted_after;  // steps done before the layer is planted; nullopt: never
  float learning_rate = 1e-3f;
  int64_t warmup = 0;
};

PlantedRun run_planted(AlertAction action, PlantOptions plan = {RecipeKind::static_scale, 0}) {
  PlantedRun run;
  run.dir = fs::temp_directory_path() /
            ("octet-planted-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
  fs::remove_all(run.dir);
  fs::create_directories(run.dir);
  const ModelConfig config = testing::tiny_config();
  PrecisionSettings precision = testing::mode(MixedPrecision::fp8);
  precision.recipe = plan.recipe;
  precision.static_scale = 16.0f;  // LayerNorm outputs (|x| < ~5) x 16 stay well below E4M3's 448
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> model_owner =
      make_model(config, *backend, PrecisionPolicy(precision, config, 32), 2, 16);
  Model& model = *model_owner;
  model.init_weights(7);
  if (plan.planted_after == 0) plant(model, *backend);

  TelemetryStore store(run.dir / kTelemetryFile);
  TelemetrySettings telemetry;
  telemetry.interval = kInterval;
  telemetry.on_alert = action;
  // One static scale for every tensor leaves a few of this small model's gradients (E5M2) below its range
  // later in training: a true underflow alert, but not the trouble planted here.
  telemetry.alert_underflow = 1.0f;
  RecorderOptions options;
  options.run_directory = run.dir;
  options.log = [&run](std::string_view line) { run.log.emplace_back(line); };
  ModelLayerSource layers(model);
  TelemetryRecorder recorder(layers, store, telemetry, options);
  TrainSettings settings;
  settings.batch_size = 2;
  settings.seq_len = 16;
  settings.schedule.max_learning_rate = plan.learning_rate;
  settings.schedule.warmup_steps = plan.warmup;
  settings.schedule.total_steps = kSteps;
  settings.run_directory = run.dir;
  Trainer trainer(model, settings);
  recorder.start({{"name", "planted"}, {"mode", "fp8"}, {"device", "cpu"}, {"telemetry_interval", "5"}});
  const BatchSource data = testing::pattern_stream(11, 2, 16, config.vocab_size);
  for (int64_t i = 0; i < kSteps; ++i) {
    if (plan.planted_after && *plan.planted_after > 0 && i == *plan.planted_after) plant(model, *backend);
    run.steps.push_back(trainer.step(data));
    recorder.record_step(run.steps.back(), 1.0, 1.0, recorder.is_telemetry_step(i + 1, kSteps));
  }
  store.close();
  return run;
}

json inspect_json(const fs::path& dir) {
  const testing::ProcessResult r = testing::run_octet({"inspect", dir.string(), "--json", "--top", "3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out);
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int64_t count_containing(const std::vector<std::string>& lines, const std::string& a, const std::string& b) {
  int64_t n = 0;
  for (const std::string& l : lines) n += l.find(a) != std::string::npos && l.find(b) != std::string::npos;
  return n;
}

TEST(PlantedSaturation, TopsInspectAndAlertsOnce) {
  const PlantedRun run = run_planted(AlertAction::warn);
  const json j = inspect_json(run.dir);
  ASSERT_FALSE(j["saturation"].empty()) << j.dump(2);
  EXPECT_EQ(j["saturation"][0]["layer"], kPlanted) << j.dump(2);
  EXPECT_EQ(j["saturation"][0]["tensor"], "activation");
  EXPECT_GT(j["saturation"][0]["worst"].get<double>(), 0.5) << "most of the planted activations saturate";
  for (size_t i = 1; i < j["saturation"].size(); ++i)
    EXPECT_LT(j["saturation"][i]["worst"].get<double>(), 0.01) << j["saturation"][i].dump();

  // Saturating at all six telemetry steps, but alerting once: one line and one event row.
  EXPECT_EQ(count_containing(run.log, "FP8 saturation alert", std::string(kPlanted) + " activation"), 1)
      << ::testing::PrintToString(run.log);
  int64_t events = 0;
  for (const json& e : j["events"]) {
    if (e["kind"] != "saturation") continue;
    EXPECT_EQ(e["layer"], kPlanted) << "only the planted layer saturates: " << e.dump();
    EXPECT_EQ(e["tensor"], "activation");
    EXPECT_EQ(e["step"], kInterval);
    EXPECT_DOUBLE_EQ(e["threshold"].get<double>(), 0.01) << "as written, not float32's 0.0099999998";
    ++events;
  }
  EXPECT_EQ(events, 1);
  EXPECT_TRUE(j["precision_changes"].empty()) << "warn changes nothing";
  EXPECT_EQ(run.steps.back().fp8_gemms, 8 * 3);
  // It saturates at every telemetry step.
  const testing::ProcessResult layer =
      testing::run_octet({"inspect", run.dir.string(), "--json", "--layer", kPlanted});
  ASSERT_EQ(layer.exit_code, 0) << layer.err;
  int64_t readings = 0;
  const json history = json::parse(layer.out)["layer"]["history"];
  for (const json& h : history) {
    if (h["tensor"] != "activation") continue;
    EXPECT_GT(h["saturated_fraction"].get<double>(), 0.5) << h.dump();
    ++readings;
  }
  EXPECT_EQ(readings, kSteps / kInterval);
  fs::remove_all(run.dir);
}

TEST(PlantedSaturation, Bf16LayerMovesTheLayerAndTrainingGoesOn) {
  const PlantedRun run = run_planted(AlertAction::bf16_layer);
  ASSERT_EQ(count_containing(run.log, "FP8 saturation alert", "runs in BF16 from step 6"), 1)
      << ::testing::PrintToString(run.log);
  EXPECT_EQ(run.log.size(), 1u) << ::testing::PrintToString(run.log);
  // Three FP8 GEMMs fewer per step from the step after the alert; finite losses to the end.
  for (const StepResult& r : run.steps) {
    EXPECT_EQ(r.fp8_gemms, r.step < kInterval ? 8 * 3 : 7 * 3) << "step " << r.step + 1;
    EXPECT_TRUE(std::isfinite(r.loss)) << "step " << r.step + 1;
    EXPECT_FALSE(r.skipped) << r.skip_reason;
  }
  const json j = inspect_json(run.dir);
  ASSERT_EQ(j["precision_changes"].size(), 3u) << j.dump(2);
  for (const json& g : j["precision_changes"]) {
    EXPECT_EQ(g["layer"], kPlanted);
    EXPECT_EQ(g["mode"], "bf16");
    EXPECT_EQ(g["since_step"], kInterval + 1);
  }
  EXPECT_EQ(j["steps"]["fp8_gemms_first"], 24);
  EXPECT_EQ(j["steps"]["fp8_gemms_last"], 21);
  int64_t moved = 0;
  for (const json& e : j["events"]) moved += e["kind"] == "layer_to_bf16" && e["layer"] == kPlanted;
  EXPECT_EQ(moved, 1);
  // The precision map on disk says so, with the reason.
  const std::string map = read(run.dir / "precision_map.json");
  EXPECT_NE(
      map.find(std::string("{\"layer\": \"") + kPlanted +
               "\", \"in_features\": 64, \"out_features\": 256, \"forward\": \"bf16\", \"input_gradient\": "
               "\"bf16\", \"weight_gradient\": \"bf16\", \"reason\": \"BF16 from step 6 after an FP8 "
               "saturation alert at step 5"),
      std::string::npos)
      << map;
  // Its telemetry ends where its FP8 GEMMs end.
  const testing::ProcessResult layer =
      testing::run_octet({"inspect", run.dir.string(), "--json", "--layer", kPlanted});
  ASSERT_EQ(layer.exit_code, 0) << layer.err;
  const json history = json::parse(layer.out)["layer"]["history"];
  ASSERT_EQ(history.size(), 3u);
  for (const json& h : history) EXPECT_EQ(h["step"], kInterval);
  fs::remove_all(run.dir);
}

// The planted layer's activations become 64 times larger from one step to the next in the middle of the
// run under delayed scaling, and stay so: a lasting jump that the scale must follow. The alert names that
// layer's activation at the next reading; the only other scale jumps are those the planting causes in the
// same block (the planted weight, the next layer's input), none before it.
TEST(PlantedScaleJump, ALastingJumpIsAnAlertAtTheNextReading) {
  const PlantedRun run = run_planted(AlertAction::warn, {RecipeKind::delayed, 12});
  EXPECT_EQ(
      count_containing(run.log, "FP8 scale_jump alert at step 15", std::string(kPlanted) + " activation"), 1)
      << ::testing::PrintToString(run.log);
  const json j = inspect_json(run.dir);
  int64_t jumps = 0;
  for (const json& e : j["events"]) {
    if (e["kind"] != "scale_jump") continue;
    EXPECT_EQ(e["layer"].get<std::string>().rfind("h.1.mlp.", 0), 0u) << e.dump();
    EXPECT_GE(e["step"].get<int64_t>(), 15) << e.dump();
    EXPECT_DOUBLE_EQ(e["threshold"].get<double>(), 8.0);
    if (e["layer"] == kPlanted && e["tensor"] == "activation") {
      EXPECT_GT(e["value"].get<double>(), 32.0) << e.dump();
    }
    ++jumps;
  }
  EXPECT_GE(jumps, 1);
  // Without the planting, the same run raises none.
  const PlantedRun healthy = run_planted(AlertAction::warn, {RecipeKind::delayed, std::nullopt});
  EXPECT_EQ(count_containing(healthy.log, "scale_jump", ""), 0) << ::testing::PrintToString(healthy.log);
  fs::remove_all(run.dir);
  fs::remove_all(healthy.dir);
}

}  // namespace
}  // namespace octet
