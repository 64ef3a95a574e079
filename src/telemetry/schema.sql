-- The schema of RUN_DIR/telemetry.sqlite, the run's telemetry store. Fixed: `octet inspect` and `octet report`
-- both read it (docs/telemetry.md explains every column).
CREATE TABLE run(key TEXT PRIMARY KEY, value TEXT NOT NULL);
  -- keys: name, octet_version, started_at (ISO 8601 UTC), mode (fp32|bf16|fp16|fp8), device (cpu|cuda: name),
  --       recipe (one line), telemetry_interval, config (the resolved TOML), precision_map (JSON, as precision_map.json),
  --       alert_saturation, alert_underflow, alert_scale_jump (the run's alert thresholds),
  --       shadow_loss_threshold, shadow_cosine_threshold (with fp8.shadow_every),
  --       calibration (the fp8.calibration file the static recipe's scales came from, when one was given),
  --       precision_map_file and localization (the fp8.precision_map applied, and its totals in one line)
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
  -- kind: saturation|underflow|scale_jump|shadow_loss|shadow_cosine|skipped_step|layer_to_bf16|recalibration|mode_change|stop|info
CREATE TABLE shadow_loss(step INTEGER PRIMARY KEY, fp8_loss REAL, bf16_loss REAL, relative_difference REAL);
  -- one row per BF16 shadow check (fp8.shadow_every): the step's first micro-batch's loss in FP8 and in BF16
CREATE TABLE shadow(step INTEGER NOT NULL, layer TEXT NOT NULL, cosine REAL, PRIMARY KEY(step, layer));
  -- each FP8 layer's weight-gradient cosine, FP8 against BF16, at a shadow check (NULL: both gradients zero)
CREATE TABLE recalibrations(step INTEGER NOT NULL, layer TEXT NOT NULL, tensor TEXT NOT NULL,
  scale_before REAL NOT NULL, scale_after REAL NOT NULL, amax REAL, reason TEXT NOT NULL,
  PRIMARY KEY(step, layer, tensor));
  -- one row per FP8 operand at each recalibration in the run (fp8.recalibrate_every, fp8.on_alert = "recalibrate")
CREATE TABLE localization(layer TEXT PRIMARY KEY, position INTEGER NOT NULL, choice TEXT NOT NULL,
  reason TEXT NOT NULL, fp8_loss_change REAL, bf16_loss_change REAL, fp8_gradient_cosine REAL,
  bf16_gradient_cosine REAL, bf16_ms REAL, fp8_ms REAL, activation_sqnr_db REAL, weight_sqnr_db REAL,
  gradient_sqnr_db REAL);
  -- one row per linear layer of the precision map the run applied (fp8.precision_map, from `octet localize`):
  -- choice fp8|bf16|excluded, its reason, the loss change and weight-gradient cosine with the layer alone in FP8
  -- (against all in BF16) and alone in BF16 (against all in FP8), its GEMMs' time per micro-batch in BF16 and in
  -- FP8 with the casts, and each cast's SQNR; measurements NULL for an excluded layer
-- Layer names are the precision policy's: h.0.attn.c_attn, h.0.attn.c_proj, h.0.mlp.c_fc, h.0.mlp.c_proj, ..., lm_head.
