-- The schema of RUN_DIR/telemetry.sqlite, the run's telemetry store. Fixed: `octet inspect` and `octet report`
-- both read it (docs/telemetry.md explains every column).
CREATE TABLE run(key TEXT PRIMARY KEY, value TEXT NOT NULL);
  -- keys: name, octet_version, started_at (ISO 8601 UTC), mode (fp32|bf16|fp16|fp8), device (cpu|cuda: name),
  --       recipe (one line), telemetry_interval, config (the resolved TOML), precision_map (JSON, as precision_map.json),
  --       alert_saturation, alert_underflow, alert_scale_jump (the run's alert thresholds)
CREATE TABLE steps(step INTEGER PRIMARY KEY, loss REAL, learning_rate REAL, grad_norm REAL, loss_scale REAL,
  skipped INTEGER NOT NULL, skip_reason TEXT, tokens INTEGER, step_ms REAL, tokens_per_s REAL,
  fp8_gemms INTEGER, other_gemms INTEGER);
CREATE TABLE validation(step INTEGER PRIMARY KEY, loss REAL);
CREATE TABLE tensor_stats(step INTEGER NOT NULL, layer TEXT NOT NULL, tensor TEXT NOT NULL,  -- tensor: activation|weight|gradient
  amax REAL, scale REAL, saturated_fraction REAL, underflow_fraction REAL, sqnr_db REAL,   -- sqnr_db NULL unless measured
  PRIMARY KEY(step, layer, tensor));
CREATE TABLE gemms(layer TEXT NOT NULL, gemm TEXT NOT NULL, mode TEXT NOT NULL, reason TEXT, since_step INTEGER NOT NULL);
  -- gemm: forward|input_gradient|weight_gradient; mode: f32|bf16|f16|fp8; one row per GEMM at start (since_step 0),
  -- a new row when an alert moves a layer to BF16, and one per GEMM when a run resumes in another mode (the newest
  -- row per (layer, gemm) is the current one)
CREATE TABLE phases(step INTEGER NOT NULL, phase TEXT NOT NULL, ms REAL, PRIMARY KEY(step, phase));
  -- optional per-phase step time (forward, backward, optimizer, data, ...) when measured
CREATE TABLE events(id INTEGER PRIMARY KEY, step INTEGER, kind TEXT NOT NULL, layer TEXT, tensor TEXT,
  value REAL, threshold REAL, message TEXT NOT NULL);
  -- kind: saturation|underflow|scale_jump|skipped_step|layer_to_bf16|mode_change|stop|info
-- Layer names are the precision policy's: h.0.attn.c_attn, h.0.attn.c_proj, h.0.mlp.c_fc, h.0.mlp.c_proj, ..., lm_head.
