// See telemetry_fixture.h.
#include "telemetry_fixture.h"

#include <sqlite3.h>

#include <fstream>
#include <sstream>

#include "octet/telemetry/store.h"

namespace octet::testing {

namespace fs = std::filesystem;

fs::path write_small_telemetry(const fs::path& run_dir) {
  fs::create_directories(run_dir);
  const fs::path file = run_dir / kTelemetryFile;
  fs::remove(file);
  TelemetryStore store(file);
  const char* layers[] = {"h.0.attn.c_attn", "h.0.mlp.c_fc", "lm_head"};
  const char* gemms[] = {"forward", "input_gradient", "weight_gradient"};
  store.add(RunInfoRecord{"name", "small"});
  store.add(RunInfoRecord{"mode", "fp8"});
  store.add(RunInfoRecord{"device", "cpu"});
  store.add(RunInfoRecord{"telemetry_interval", "2"});
  store.add(RunInfoRecord{"config", "[train]\nmixed_precision = \"fp8\"\n"});
  store.add(RunInfoRecord{
      "precision_map",
      R"([{"layer": "h.0.attn.c_attn", "forward": "fp8", "input_gradient": "fp8", "weight_gradient": "fp8", )"
      R"("reason": "FP8 by policy"}, {"layer": "h.0.mlp.c_fc", "forward": "bf16", "input_gradient": "bf16", )"
      R"("weight_gradient": "bf16", "reason": "BF16 from step 5"}, {"layer": "lm_head", "forward": "bf16", )"
      R"("input_gradient": "bf16", "weight_gradient": "bf16", "reason": "excluded by config"}])"});
  for (const char* layer : layers) {
    for (const char* gemm : gemms) {
      store.add(GemmRecord{layer, gemm, std::string(layer) == "lm_head" ? "bf16" : "fp8", "by policy", 0});
    }
  }
  for (const char* gemm : gemms) store.add(GemmRecord{"h.0.mlp.c_fc", gemm, "bf16", "alert", 5});
  for (int64_t step = 1; step <= 8; ++step) {
    StepRecord s;
    s.step = step;
    s.loss = 5.0 - 0.1 * static_cast<double>(step);
    s.learning_rate = 1e-3;
    s.grad_norm = step == 3 ? std::nullopt : std::optional<double>(1.5);
    s.skipped = step == 3;
    if (s.skipped) s.skip_reason = "non-finite gradient";
    s.tokens = 32;
    s.step_ms = 10.0;
    s.tokens_per_s = 3200.0;
    s.fp8_gemms = step <= 5 ? 6 : 3;
    s.other_gemms = step <= 5 ? 3 : 6;
    store.add(s);
    if (step % 2 == 0) {
      store.add(ValidationRecord{step, 4.5});
      for (const char* phase : {"data", "forward", "backward", "optimizer"})
        store.add(PhaseRecord{step, phase, 2.5});
      for (const char* layer : {"h.0.attn.c_attn", "h.0.mlp.c_fc"}) {
        if (step > 5 && std::string(layer) == "h.0.mlp.c_fc") continue;
        for (const char* tensor : {"activation", "weight", "gradient"}) {
          store.add(
              TensorRecord{step, layer, tensor, 3.0, 128.0, step == 4 ? 0.02 : 0.0, 1e-3, std::nullopt});
        }
      }
    }
  }
  store.add(EventRecord{3, "skipped_step", std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                        "step 3 skipped"});
  store.add(EventRecord{4, "saturation", "h.0.mlp.c_fc", "activation", 0.02, 0.01,
                        "warning: FP8 saturation alert"});
  store.add(
      EventRecord{4, "layer_to_bf16", "h.0.mlp.c_fc", std::nullopt, std::nullopt, std::nullopt, "moved"});
  store.close();
  return file;
}

std::string execute_sql(const fs::path& database, const std::string& sql) {
  sqlite3* db = nullptr;
  std::string error;
  if (sqlite3_open_v2(database.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    error = db != nullptr ? sqlite3_errmsg(db) : "cannot open";
  } else {
    char* message = nullptr;
    sqlite3_exec(db, "PRAGMA synchronous = OFF", nullptr, nullptr, nullptr);  // tests need no durability
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &message) != SQLITE_OK)
      error = message != nullptr ? message : "failed";
    sqlite3_free(message);
  }
  sqlite3_close(db);
  return error;
}

std::string file_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace octet::testing
