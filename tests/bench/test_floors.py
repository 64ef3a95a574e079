#!/usr/bin/env python3
"""bench/floors.py against numbers worked out by hand. Inputs: H100 results kept in tests/bench/data/
(`octet bench train --json` of GPT-2 124M and 350M, the table of `octet bench gemm` for 124M; the
"-fused" result carries the precision plan, the others come from an octet that did not write it) and a result
of the built `octet bench train` on a tiny configuration on the CPU. Exit 0 pass, 1 fail. Every result, old
or new, gets the floors of the ops this octet runs: the forward GEMM adds the bias in its epilogue (no pass
over its output), no input gradient is rounded, a BF16 LM head keeps its chunk in BF16, under the delayed
recipe every FP8 layer's gradient cast sums its bias gradient (mlp.c_fc's in GELU's backward), and where
attention runs on BF16 tensor cores (every mode but fp32; none of these results' device lines say so; GPT-2's
hs = 64 qualifies) q, k, v are stored in bf16, written so by attn.c_attn's GEMM where it can (FP8 on FP8
tensor cores, BF16) and converted from its float32 output where it cannot (FP16, FP8 emulated).

  test_floors.py FLOORS_SCRIPT INPUTS_DIR OCTET_BINARY WORK_DIR

Hand counts for GPT-2 124M (L = 12, C = 768, NH = 12, hs = 64, V = 50257, Vp = 50304, B = 32, T = 1024,
N = B*T = 32768, P = 124475904 parameters):
  parameters in matrices: 12 L C^2 + Vp C = 84934656 + 38633472 = 123568128
  GEMM FLOPs per step: 6 x 123568128 x 32768 = 24294.48 GFLOP
    block linears forward 24 N C^2 L = 5566.28 GFLOP; LM head forward 2 N C Vp = 2531.88 GFLOP
  attention forward 2 B NH T^2 hs L = 618.48 GFLOP, backward 2.5x = 1546.19 GFLOP
  total 24294.48 + 618.48 + 1546.19 = 26459.15 GFLOP
  attention bytes, q, k, v in bf16 (fp8, bf16, fp16): forward (2 x 3NC + 4 (NC + B NH T)) L
    = (150994944 + 4 x 25559040) x 12 = 3038773248, backward (2 x 3NC + 4 (NC + NC + B NH T + 3NC)) L
    = (150994944 + 4 x 126222336) x 12 = 7870611456; q, k, v in float32 (fp32, or attention in float32):
    forward 4 (3NC + NC + B NH T) L = 4850712576, backward 4 (8NC + B NH T) L = 9682550784
  attn.c_attn forward GEMM, its output qkv in bf16 from the epilogue with a BF16 bias (2 x 3C x N and 2 x 3C):
    fp8 (N C + 3C C + 2 x 3C N + 2 x 3C) L = 177934848 x 12 = 2135218176; bf16 (2 N C + 2 x 3C C + 2 x 3C N
    + 2 x 3C) L = 204870144 x 12 = 2458441728. Where the GEMM cannot write bf16 (fp16, fp8 emulated), it
    writes float32 (4 x 3C N) and a conversion reads it and writes bf16: 6 x 3C N L = 5435817984 (casts)
  optimizer bytes (fp8): 32 P + 2 x 84934656 (FP8 copies) + 6 x 38633472 (BF16 copy of the head) = 4384899072
  cross-entropy bytes, the BF16 head chunk (fp8 and bf16 alike): (2 V + 4 + 2 Vp + 4) N = 201130 x 32768
  = 6590627840
  the MLP's hidden activation (mlp.c_fc's output) and its gradient (mlp.c_proj's input gradient) are bf16 in
  fp8 and bf16 modes, written so by the GEMMs' epilogues (with a BF16 bias in mlp.c_fc's), read so by GELU:
  GELU backward fused with mlp.c_fc's gradient cast (both its backward GEMMs FP8, so no float32 gradient):
  ((2 + 2 + 2) N 4C + 8 x 4C) L = (603979776 + 24576) x 12 = 7248052224; GELU forward, fp8, FP8 codes and
  transposed codes only: (2 + 2) N 4C L = 4831838208; mlp.c_fc's forward GEMM, fp8: (N C + 4C C + 2 N 4C
  + 2 x 4C) L = 228857856 x 12 = 2746294272
  the block linears' outputs and biases: sum of out = 3C + C + 4C + C = 9C = 6912, of in = 7C = 5376
  embeddings, residuals, biases, zeroing, forward: encoder 4 (N + 2 N C + T C) = 4 x 51150848 = 204603392,
    no residual add (attn.c_proj's and mlp.c_proj's GEMMs read the residual, 4 N C each, in their epilogue:
    fp8 attn.c_proj (N C + C C + 4 N C + 4 N C + 2 C) L = 9 x 25165824 + 589824 + 1536 = 227083776 x 12
    = 2725005312), the biases for the GEMM epilogues: fp8 converted to BF16, 6 x 9C x L = 497664 (total
    205101056); bf16: attn.c_attn's and mlp.c_fc's converted to BF16 for their bf16 outputs, 6 x 7C x L
    = 387072, the others copied and rounded, 16 x 2C x L = 294912 (total 205285376). Emulated FP8 (no FP8
    tensor cores): the two layers' GEMMs write their output and residual adds follow, 12 N C x 2L
    = 7247757312.
    No pass over a GEMM's output.
  embeddings, residuals, biases, zeroing, backward: zeroing the residual gradient 4 N C = 100663296, encoder
    backward 4 (N C + N + 2 N C + 2 T C) = 4 x 77103104 = 308412416; fp8: no bias gradient of its own (total
    409075712); bf16: bias gradients (4 N + 8) x 9C x L = 131080 x 82944 = 10872299520 (total 11281375232)
  casts, fp8: forward attn.c_proj's input cast 6 N C L = 1811939328 and ln_f to BF16 for the head 6 N C =
    150994944 (total 1962934272); backward the gradient casts of attn.c_attn, attn.c_proj and mlp.c_proj with
    their bias gradients, (6 N + 8) x 5C x L = 196616 x 46080 = 9060065280; no input gradient rounded
  casts, bf16, backward: dy and the input to BF16, 6 N (9C + 7C) L = 6 x 32768 x 12288 x 12 = 28991029248
  under the current recipe (fp8): GELU's backward (reading bf16, writing float32), bias_backward and the
    cast with its amax read in one op, ((2 + 2 + 4 + 4 + 4 + 4 + 2) N 4C + 8 x 4C) L = (2214592512 + 24576)
    x 12 = 26575405056; the other three
    layers' casts (4 + 4 + 2) N 5C L = 15099494400 and bias gradients (4 N + 8) 5C L = 6040166400 (other,
    backward: 409075712 + 6040166400 = 6449242112)
GPT-2 350M (L = 24, C = 1024, NH = 16, B = 16, N = 16384): GEMMs 34750.58 GFLOP, total with attention
  37636.80 GFLOP. fp8 bytes: embeddings, residuals, biases, zeroing forward 4 (N + 2 N C + T C)
  + 6 x 9C x L = 138477568 + 1327104 = 139804672, backward 4 N C + 4 (3 N C + N + 2 T C)
  = 67108864 + 209780736 = 276889600; casts backward (6 N + 8) x 5C x L = 98312 x 122880 = 12080578560.
"""
import contextlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import unittest

FLOORS, INPUTS, OCTET, WORK = sys.argv[1:5]


def load_floors():
    spec = importlib.util.spec_from_file_location("floors", FLOORS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


floors = load_floors()


def run(*args):
    """floors.main in this process: (exit code, standard output, standard error)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = floors.main(list(args))
        except SystemExit as e:  # argparse
            code = e.code
    return code, out.getvalue(), err.getvalue()


def result_of(*args):
    code, out, err = run(*args, "--json")
    assert code == 0, err
    return json.loads(out)["results"]


def row(result, kind, phase):
    for r in result["rows"]:
        if r["kind"] == kind and r["phase"] == phase:
            return r
    raise AssertionError(f"no row {kind} / {phase}")


def gflop(result, kind):
    return sum(r["gflop"] for r in result["rows"] if r["kind"] == kind)


def gb(result, kind):
    return sum(r["gb"] for r in result["rows"] if r["kind"] == kind)


def ops_by_name(result):
    return {(o["phase"], o["op"]): o for o in result["ops"]}


def inputs(name):
    return os.path.join(INPUTS, name)


def variant(name, source, **changes):
    """A copy of the result `source` in WORK with top-level keys changed (device_line: the device's line)."""
    with open(inputs(source)) as f:
        train = json.load(f)
    if "device_line" in changes:
        train["device"]["line"] = changes.pop("device_line")
    train.update(changes)
    os.makedirs(WORK, exist_ok=True)
    path = os.path.join(WORK, name)
    with open(path, "w") as f:
        json.dump(train, f)
    return path


# Rates that make every GEMM and attention compute-bound: the floors are then FLOPs over the rate.
FAST_MEMORY = ["--fp8-tflops", "1000", "--bf16-tflops", "500", "--bandwidth-gbs", "1000000"]


class Gpt2Small(unittest.TestCase):
    def setUp(self):
        self.fp8, self.bf16 = result_of(inputs("gpt2-124M-octet-fp8.json"), inputs("gpt2-124M-octet-bf16.json"),
                                        *FAST_MEMORY)

    def test_flops_match_the_hand_count(self):
        for r in (self.fp8, self.bf16):
            self.assertAlmostEqual(r["total"]["gflop"], 26459.146, places=2)
            self.assertAlmostEqual(gflop(r, "FP8 GEMMs") + gflop(r, "BF16/FP16/FP32 GEMMs"), 24294.483, places=2)
            self.assertAlmostEqual(row(r, "attention", "forward")["gflop"], 618.475, places=2)
            self.assertAlmostEqual(row(r, "attention", "backward")["gflop"], 1546.188, places=2)
        # fp8: the block linears in FP8, the LM head in BF16, its backward inside the forward phase.
        self.assertAlmostEqual(row(self.fp8, "FP8 GEMMs", "forward")["gflop"], 5566.278, places=2)
        self.assertAlmostEqual(row(self.fp8, "FP8 GEMMs", "backward")["gflop"], 2 * 5566.278, places=2)
        self.assertAlmostEqual(row(self.fp8, "BF16/FP16/FP32 GEMMs", "forward")["gflop"], 3 * 2531.883, places=2)
        self.assertEqual(gflop(self.bf16, "FP8 GEMMs"), 0.0)
        self.assertAlmostEqual(row(self.bf16, "BF16/FP16/FP32 GEMMs", "backward")["gflop"], 2 * 5566.278, places=2)

    def test_bytes_match_the_hand_count(self):
        for r in (self.fp8, self.bf16):
            self.assertAlmostEqual(row(r, "attention", "forward")["gb"], 3.038773248, places=9)
            self.assertAlmostEqual(row(r, "attention", "backward")["gb"], 7.870611456, places=9)
            self.assertAlmostEqual(gb(r, "cross-entropy"), 6.59062784, places=9)
        # Zeroing is its own kind; the gradient norm 4P, AdamW 28P, the block matrices' FP8 codes and transpose
        # 2 x 85M, the BF16 head's copy of wte written in the AdamW pass, 2 x 38.6M.
        P, C, L, Vp = 124475904, 768, 12, 50304
        self.assertAlmostEqual(gb(self.fp8, "optimizer (fused weight casts included)"),
                               (32 * P + 2 * 12 * C * C * L + 2 * Vp * C) / 1e9, places=9)
        self.assertAlmostEqual(gb(self.fp8, "optimizer (fused weight casts included)"), 4.230365184, places=9)

    def test_biases_cost_no_pass_over_the_gemm_outputs(self):
        other = "embeddings, residuals, biases, zeroing"
        self.assertAlmostEqual(row(self.fp8, other, "forward")["gb"], 0.205101056, places=9)
        self.assertAlmostEqual(row(self.bf16, other, "forward")["gb"], 0.205285376, places=9)
        self.assertAlmostEqual(row(self.fp8, other, "backward")["gb"], 0.409075712, places=9)
        # bf16: zeroing the residual gradient 4NC, the encoder's backward 4 (NC + N + 2NC + 2TC), and per block
        # mlp.c_fc's bias gradient over its bf16 gradient, 2 N 4C + 8 x 4C; the other layers' bias gradients
        # are summed in their gradient's conversion (casts).
        N, C, T, L = 32768, 768, 1024, 12
        self.assertAlmostEqual(row(self.bf16, other, "backward")["gb"],
                               (4 * N * C + 4 * (3 * N * C + N + 2 * T * C) + L * (2 * N * 4 * C + 8 * 4 * C)) / 1e9,
                               places=9)
        self.assertAlmostEqual(row(self.bf16, other, "backward")["gb"], 2.825289728, places=9)
        names = [o["op"] for o in self.fp8["ops"] + self.bf16["ops"]]
        self.assertFalse([n for n in names if "rounded" in n or "rounding" in n], names)

    def test_the_first_backward_writes_the_weight_gradients(self):
        # Zeroing leaves the linear layers' weights (12 L C^2 in the blocks, wte's Vp C for the head) to their
        # first backward: 4 (P - 12 L C^2 - Vp C) = 4 x 907776 bytes. With one micro-batch a step, a weight
        # gradient GEMM writes its gradient once: attn.c_proj's reads dy and x in bf16 and writes 4 C^2.
        P, N, C, L, Vp = 124475904, 32768, 768, 12, 50304
        other = "embeddings, residuals, biases, zeroing"
        for r in (self.fp8, self.bf16):
            self.assertAlmostEqual(row(r, other, "optimizer")["gb"], 4 * (P - 12 * L * C * C - Vp * C) / 1e9,
                                   places=9)
            self.assertAlmostEqual(row(r, other, "optimizer")["gb"], 0.003631104, places=9)
        bf16 = ops_by_name(self.bf16)
        self.assertAlmostEqual(bf16[("backward", "attn.c_proj weight-gradient GEMM")]["gb"],
                               L * (2 * N * C + 2 * N * C + 4 * C * C) / 1e9, places=9)
        self.assertAlmostEqual(bf16[("backward", "attn.c_proj weight-gradient GEMM")]["gb"], 1.236271104,
                               places=9)

    def test_bf16_weight_gradients_halve_their_bytes(self):
        # train.weight_gradients = "bf16": the block layers' weight-gradient GEMMs (FP8 on FP8 tensor cores,
        # BF16) write 2 C^2-sized bytes instead of 4, and the norm and AdamW read 2 bytes less for each of the
        # 12 L C^2 elements; the LM head's (wte's) stays float32.
        N, C, L = 32768, 768, 12
        W = 12 * L * C * C
        fp8, bf16 = result_of(variant("fp8-bf16-grads.json", "gpt2-124M-octet-fp8.json", weight_gradients="bf16"),
                              variant("bf16-bf16-grads.json", "gpt2-124M-octet-bf16.json", weight_gradients="bf16"),
                              *FAST_MEMORY)
        optimizer = "optimizer (fused weight casts included)"
        self.assertAlmostEqual(gb(fp8, optimizer), gb(self.fp8, optimizer) - 4 * W / 1e9, places=9)
        self.assertAlmostEqual(gb(bf16, optimizer), gb(self.bf16, optimizer) - 4 * W / 1e9, places=9)
        for new, old in ((fp8, self.fp8), (bf16, self.bf16)):
            ops, before = ops_by_name(new), ops_by_name(old)
            self.assertAlmostEqual(ops[("optimizer", "gradient norm")]["gb"],
                                   before[("optimizer", "gradient norm")]["gb"] - 2 * W / 1e9, places=9)
            self.assertAlmostEqual(ops[("backward", "attn.c_proj weight-gradient GEMM")]["gb"],
                                   before[("backward", "attn.c_proj weight-gradient GEMM")]["gb"]
                                   - L * 2 * C * C / 1e9, places=9)
            self.assertAlmostEqual(ops[("forward", "lm_head weight-gradient GEMM")]["gb"],
                                   before[("forward", "lm_head weight-gradient GEMM")]["gb"], places=9)
        # Emulated FP8 GEMMs write float32: only BF16 layers' gradients are bf16 there (none in fp8 mode).
        line = ("training on NVIDIA A100-SXM4-80GB (CUDA device 0, compute capability 8.0); WARNING: no FP8 "
                "tensor cores, FP8 GEMMs run as BF16 GEMMs on the FP8 values (FP8 numerics, no FP8 speed)")
        emulated, = result_of(variant("fp8-emulated-bf16-grads.json", "gpt2-124M-octet-fp8.json",
                                      weight_gradients="bf16", device_line=line), *FAST_MEMORY)
        float32, = result_of(variant("fp8-emulated-float32-grads.json", "gpt2-124M-octet-fp8.json",
                                     device_line=line), *FAST_MEMORY)
        self.assertAlmostEqual(gb(emulated, optimizer), gb(float32, optimizer), places=9)

    def test_the_c_proj_gemms_add_the_residual(self):
        N, C, L = 32768, 768, 12
        fp8 = ops_by_name(self.fp8)
        # The input codes, the weight codes, the float32 output, the residual read in the epilogue, the bias.
        self.assertAlmostEqual(fp8[("forward", "attn.c_proj forward GEMM")]["gb"],
                               L * (N * C + C * C + 4 * N * C + 4 * N * C + 2 * C) / 1e9, places=9)
        self.assertAlmostEqual(fp8[("forward", "attn.c_proj forward GEMM")]["gb"], 2.725005312, places=9)
        names = [o["op"] for o in self.fp8["ops"] + self.bf16["ops"]]
        self.assertFalse([n for n in names if "residual add" in n], names)
        # Emulated FP8 GEMMs are not cuBLASLt's: their outputs are written, then the residual adds run.
        line = ("training on NVIDIA A100-SXM4-80GB (CUDA device 0, compute capability 8.0); WARNING: no FP8 tensor "
                "cores, FP8 GEMMs run as BF16 GEMMs on the FP8 values (FP8 numerics, no FP8 speed)")
        [r] = result_of(variant("emulated-residual.json", "gpt2-124M-octet-fp8.json", device_line=line),
                        *FAST_MEMORY)
        ops = ops_by_name(r)
        for label in ("attn.c_proj", "mlp.c_proj"):
            self.assertAlmostEqual(ops[("forward", f"{label} residual add")]["gb"], L * 12 * N * C / 1e9, places=9)
        self.assertAlmostEqual(ops[("forward", "attn.c_proj forward GEMM")]["gb"],
                               L * (N * C + C * C + 4 * N * C + 2 * C) / 1e9, places=9)

    def test_the_qkv_gemm_writes_bf16_for_attention(self):
        N, C, L = 32768, 768, 12
        fp8 = ops_by_name(self.fp8)
        bf16 = ops_by_name(self.bf16)
        # FP8 on FP8 tensor cores: the input codes, the weight codes, qkv in bf16 and the BF16 bias.
        self.assertAlmostEqual(fp8[("forward", "attn.c_attn forward GEMM")]["gb"],
                               L * (N * C + 3 * C * C + 2 * N * 3 * C + 2 * 3 * C) / 1e9, places=9)
        self.assertAlmostEqual(fp8[("forward", "attn.c_attn forward GEMM")]["gb"], 2.135218176, places=9)
        # BF16: input and weight in BF16, qkv in bf16, the bias converted to BF16 (read 4, write 2 bytes)
        # rather than copied and rounded as the layers' that write float32 (16 bytes).
        self.assertAlmostEqual(bf16[("forward", "attn.c_attn forward GEMM")]["gb"],
                               L * (2 * N * C + 2 * 3 * C * C + 2 * N * 3 * C + 2 * 3 * C) / 1e9, places=9)
        self.assertAlmostEqual(bf16[("forward", "attn.c_attn forward GEMM")]["gb"], 2.458441728, places=9)
        self.assertAlmostEqual(bf16[("forward", "attn.c_attn bias for the epilogue")]["gb"], L * 6 * 3 * C / 1e9,
                               places=12)
        self.assertAlmostEqual(bf16[("forward", "attn.c_proj bias for the epilogue")]["gb"], L * 16 * C / 1e9,
                               places=12)
        # The GEMM writes bf16 itself: no conversion after it, nor of q, k, v in attention.
        names = [o["op"] for o in self.fp8["ops"] + self.bf16["ops"]]
        self.assertNotIn("attn.c_attn output to bf16", names)
        # Where attention ran is inferred and said so.
        for r in (self.fp8, self.bf16):
            self.assertIn("where attention ran is not on the device line: taken from the mode and the head size 64 "
                          "(BF16 tensor cores, q, k, v in bf16)", r["notes"])

    def test_the_mlp_hidden_tensors_are_bf16(self):
        N, C, L = 32768, 768, 12
        fp8 = ops_by_name(self.fp8)
        bf16 = ops_by_name(self.bf16)
        # mlp.c_fc's FP8 GEMM: the input codes, the weight codes, its output in bf16 and the BF16 bias.
        self.assertAlmostEqual(fp8[("forward", "mlp.c_fc forward GEMM")]["gb"],
                               L * (N * C + 4 * C * C + 2 * N * 4 * C + 2 * 4 * C) / 1e9, places=9)
        self.assertAlmostEqual(fp8[("forward", "mlp.c_fc forward GEMM")]["gb"], 2.746294272, places=9)
        # GELU reads its bf16 input and writes the FP8 codes and transposed codes of mlp.c_proj's input.
        self.assertAlmostEqual(fp8[("forward", "gelu forward")]["gb"], 4.831838208, places=9)
        # mlp.c_proj's input gradient comes out of its GEMM in bf16, in both modes.
        for ops, e in ((fp8, 1), (bf16, 2)):
            self.assertAlmostEqual(ops[("backward", "mlp.c_proj input-gradient GEMM")]["gb"],
                                   L * (e * N * C + e * C * 4 * C + 2 * N * 4 * C) / 1e9, places=9)
        # bf16: GELU's backward reads both bf16 tensors and writes the gradient of mlp.c_fc in bf16 (both of that
        # layer's backward GEMMs are BF16); LayerNorm writes ln_1's and ln_2's outputs, GELU its own, in bf16.
        self.assertAlmostEqual(bf16[("backward", "gelu backward")]["gb"], L * (2 + 2 + 2) * N * 4 * C / 1e9,
                               places=9)
        self.assertAlmostEqual(bf16[("forward", "gelu forward")]["gb"], L * (2 + 2) * N * 4 * C / 1e9, places=9)
        self.assertAlmostEqual(bf16[("forward", "ln_1 forward")]["gb"],
                               L * (4 * N * C + 8 * C + 8 * N + 2 * N * C) / 1e9, places=9)
        names = [o["op"] for o in self.fp8["ops"] + self.bf16["ops"]]
        self.assertNotIn("mlp.c_fc output to bf16", names)
        self.assertNotIn("mlp.c_proj input gradient to bf16", names)

    def test_layernorm_reads_a_bf16_gradient_from_the_gemms(self):
        N, C, L = 32768, 768, 12
        for ops, e in ((ops_by_name(self.fp8), 1), (ops_by_name(self.bf16), 2)):
            # attn.c_attn's and mlp.c_fc's input gradients come out of their GEMMs in bf16, in both modes.
            self.assertAlmostEqual(ops[("backward", "attn.c_attn input-gradient GEMM")]["gb"],
                                   L * (e * N * 3 * C + e * 3 * C * C + 2 * N * C) / 1e9, places=9)
            self.assertAlmostEqual(ops[("backward", "mlp.c_fc input-gradient GEMM")]["gb"],
                                   L * (e * N * 4 * C + e * 4 * C * C + 2 * N * C) / 1e9, places=9)
            # ln_1's and ln_2's backward read them so: dout 2, x 4, dx read and written 8 bytes an element, mean
            # and rstd 8 a row, the weight 4 and its two gradients read and written 16 a column; ln_f's dout,
            # from the LM head, is float32.
            for name in ("ln_1", "ln_2"):
                self.assertAlmostEqual(ops[("backward", f"{name} backward")]["gb"],
                                       L * (14 * N * C + 8 * N + 20 * C) / 1e9, places=9)
            self.assertAlmostEqual(ops[("backward", "ln_f backward")]["gb"], (16 * N * C + 8 * N + 20 * C) / 1e9,
                                   places=9)
            self.assertNotIn(("backward", "attn.c_attn input gradient to bf16"), ops)
        self.assertAlmostEqual(ops_by_name(self.fp8)[("backward", "ln_1 backward")]["gb"], 4.23118848, places=9)

    def test_fp8_gradient_casts_carry_the_bias_gradients(self):
        casts = "casts and conversions"
        self.assertAlmostEqual(row(self.fp8, casts, "forward")["gb"], 1.962934272, places=9)
        self.assertAlmostEqual(row(self.fp8, casts, "backward")["gb"], 9.06006528, places=9)
        # bf16, per block: the float32 gradients of mlp.c_proj, attn.c_proj (the residual stream's) and attn.c_attn
        # (d(qkv), float32 where attention is not cuDNN's) converted in their bias gradient's pass, 6 bytes an
        # element and 8 a column; attn.c_proj's float32 input converted for its weight gradient. The inputs
        # LayerNorm and GELU write are bf16, and so is mlp.c_fc's gradient: nothing converted for them.
        N, C, L = 32768, 768, 12
        self.assertAlmostEqual(row(self.bf16, casts, "backward")["gb"],
                               L * (6 * N * C + 8 * C + 6 * N * C + 8 * C + 6 * N * C + 6 * N * 3 * C + 8 * 3 * C) / 1e9,
                               places=9)
        self.assertAlmostEqual(row(self.bf16, casts, "backward")["gb"], 10.872004608, places=9)
        bf16 = ops_by_name(self.bf16)
        self.assertNotIn(("backward", "attn.c_attn input to bf16 (weight gradient)"), bf16)
        self.assertIn(("backward", "attn.c_proj input to bf16 (weight gradient)"), bf16)

    def test_compute_bound_floors_are_flops_over_the_rate(self):
        self.assertAlmostEqual(row(self.fp8, "FP8 GEMMs", "forward")["floor_ms"], 5566.278 / 1000, places=3)
        self.assertAlmostEqual(row(self.fp8, "attention", "backward")["floor_ms"], 1546.188 / 500, places=3)
        self.assertEqual(row(self.fp8, "attention", "backward")["bound"], "compute")

    def test_measured_times_and_ratios_come_from_the_result(self):
        with open(inputs("gpt2-124M-octet-fp8.json")) as f:
            train = json.load(f)
        kinds = {k["kind"]: k for k in train["phases"]["device_ms_by_kind"]}
        r = row(self.fp8, "FP8 GEMMs", "forward")
        self.assertEqual(r["measured_ms"], kinds["FP8 GEMMs"]["forward_ms"])
        self.assertAlmostEqual(r["measured_over_floor"], r["measured_ms"] / r["floor_ms"])
        total = sum(k["forward_ms"] + k["backward_ms"] + k["optimizer_ms"] for k in kinds.values())
        self.assertAlmostEqual(self.fp8["total"]["measured_ms"], total)
        self.assertAlmostEqual(self.fp8["total"]["floor_ms"], sum(r["floor_ms"] for r in self.fp8["rows"]))

    def test_an_older_result_says_what_was_assumed(self):
        notes = " ".join(self.fp8["notes"])
        self.assertIn("GEMM precision per layer not in the result", notes)
        self.assertIn("delayed recipe", notes)
        self.assertIn("the floors are those of the ops this octet runs", notes)
        self.assertIn("rates given", notes)

    def test_memory_floors_are_bytes_over_the_bandwidth(self):
        [r] = result_of(inputs("gpt2-124M-octet-fp8.json"), "--fp8-tflops", "1000", "--bf16-tflops", "500",
                        "--bandwidth-gbs", "2000")
        ce = row(r, "cross-entropy", "forward")
        self.assertAlmostEqual(ce["floor_ms"], 6.59062784 / 2000 * 1e3, places=6)
        self.assertEqual(ce["bound"], "memory")
        # attn.c_proj's forward GEMM (N x C x C, FP8) moves more bytes than it computes at these rates: its
        # floor is its bytes, 32768 x 768 (codes) + 768 x 768 (weight codes) + 4 x 32768 x 768 (float32 out)
        # + 4 x 32768 x 768 (the residual its epilogue adds) + 2 x 768 (the BF16 bias its epilogue adds).
        ops = {(o["phase"], o["op"]): o for o in r["ops"]}
        proj = ops[("forward", "attn.c_proj forward GEMM")]
        self.assertAlmostEqual(proj["gb"], 12 * (32768 * 768 + 768 * 768 + 8 * 32768 * 768 + 2 * 768) / 1e9,
                               places=9)
        self.assertAlmostEqual(proj["floor_ms"], proj["gb"] / 2000 * 1e3, places=9)


class Gpt2SmallFused(unittest.TestCase):
    def setUp(self):
        [self.fp8] = result_of(inputs("gpt2-124M-octet-fp8-fused.json"), *FAST_MEMORY)

    def test_flops_do_not_depend_on_the_fusion(self):
        self.assertAlmostEqual(self.fp8["total"]["gflop"], 26459.146, places=2)

    def test_the_bf16_head_chunk_moves_bf16_logits(self):
        self.assertAlmostEqual(gb(self.fp8, "cross-entropy"), 6.59062784, places=9)
        names = [o["op"] for o in self.fp8["ops"]]
        self.assertNotIn("lm_head bias and rounding", names)
        self.assertNotIn("lm_head gradient to bf16", names)

    def test_gelu_backward_carries_the_fc_gradient_cast(self):
        names = [o["op"] for o in self.fp8["ops"]]
        self.assertFalse([n for n in names if n.startswith("mlp.c_fc gradient cast")], names)
        self.assertFalse([n for n in names if n.endswith("bias gradient") and "cast" not in n], names)
        self.assertIn("attn.c_attn gradient cast and bias gradient", names)
        gelu = [o for o in self.fp8["ops"] if o["op"].startswith("gelu backward")]
        self.assertEqual(len(gelu), 1)
        self.assertAlmostEqual(gelu[0]["gb"], 7.248052224, places=9)

    def test_the_current_recipe_sums_the_bias_gradients_apart(self):
        with open(inputs("gpt2-124M-octet-fp8-fused.json")) as f:
            train = json.load(f)
        train["fp8"]["recipe"] = "current"
        os.makedirs(WORK, exist_ok=True)
        path = os.path.join(WORK, "gpt2-124M-current.json")
        with open(path, "w") as f:
            json.dump(train, f)
        [r] = result_of(path, *FAST_MEMORY)
        gelu = [o for o in r["ops"] if o["op"].startswith("gelu backward")]
        self.assertEqual(len(gelu), 1)
        self.assertEqual(gelu[0]["kind"], "LayerNorm and GELU (fused casts included)")
        self.assertAlmostEqual(gelu[0]["gb"], 26.575405056, places=9)
        self.assertAlmostEqual(row(r, "casts and conversions", "backward")["gb"], 15.0994944, places=9)
        self.assertAlmostEqual(row(r, "embeddings, residuals, biases, zeroing", "backward")["gb"], 6.449242112,
                               places=9)


class AttentionInput(unittest.TestCase):
    """Where q, k, v are stored, and who converts them, by mode and by what the device line says (124M)."""
    N, C, L = 32768, 768, 12
    H100 = "training on NVIDIA H100 80GB HBM3 (CUDA device 0, compute capability 9.0)"

    def floors_of(self, path):
        [r] = result_of(path, *FAST_MEMORY, "--tf32-tflops", "250")
        return r, ops_by_name(r)

    def test_fp32_keeps_float32_qkv(self):
        r, ops = self.floors_of(variant("fp32.json", "gpt2-124M-octet-bf16.json", mode="fp32"))
        N, C, L = self.N, self.C, self.L
        self.assertAlmostEqual(row(r, "attention", "forward")["gb"], 4.850712576, places=9)
        self.assertAlmostEqual(row(r, "attention", "backward")["gb"], 9.682550784, places=9)
        # TF32 GEMM: float32 input, weight and qkv, the float32 bias read where it lies.
        self.assertAlmostEqual(ops[("forward", "attn.c_attn forward GEMM")]["gb"],
                               L * 4 * (N * C + 3 * C * C + N * 3 * C + 3 * C) / 1e9, places=9)
        self.assertNotIn(("forward", "attn.c_attn output to bf16"), ops)
        self.assertNotIn(("forward", "attn.c_attn bias for the epilogue"), ops)
        self.assertEqual(ops[("forward", "attention forward")]["tflops"], 250.0)
        self.assertFalse([n for n in r["notes"] if "where attention ran" in n], r["notes"])

    def test_fp16_converts_the_float32_qkv(self):
        r, ops = self.floors_of(variant("fp16.json", "gpt2-124M-octet-bf16.json", mode="fp16"))
        N, C, L = self.N, self.C, self.L
        self.assertAlmostEqual(row(r, "attention", "forward")["gb"], 3.038773248, places=9)
        self.assertAlmostEqual(row(r, "attention", "backward")["gb"], 7.870611456, places=9)
        # The FP16 GEMM writes float32 (and reads its bias, copied and rounded to FP16, in float32); then
        # read 4, write 2 bytes an element of qkv: 6 x 3C N L = 5435817984.
        self.assertAlmostEqual(ops[("forward", "attn.c_attn forward GEMM")]["gb"],
                               L * (2 * N * C + 2 * 3 * C * C + 4 * N * 3 * C + 4 * 3 * C) / 1e9, places=9)
        self.assertAlmostEqual(ops[("forward", "attn.c_attn bias for the epilogue")]["gb"], L * 16 * 3 * C / 1e9,
                               places=12)
        convert = ops[("forward", "attn.c_attn output to bf16")]
        self.assertEqual(convert["kind"], "casts and conversions")
        self.assertAlmostEqual(convert["gb"], 5.435817984, places=9)

    def test_emulated_fp8_converts_the_float32_qkv(self):
        path = variant("fp8-emulated.json", "gpt2-124M-octet-fp8.json",
                       device_line="training on NVIDIA A100-SXM4-80GB (CUDA device 0, compute capability 8.0); "
                                   "WARNING: no FP8 tensor cores, FP8 GEMMs run as BF16 GEMMs on the FP8 values "
                                   "(FP8 numerics, no FP8 speed)")
        r, ops = self.floors_of(path)
        N, C, L = self.N, self.C, self.L
        # Codes in, float32 out, the BF16 bias; then the conversion, 6 x 3C N L.
        self.assertAlmostEqual(ops[("forward", "attn.c_attn forward GEMM")]["gb"],
                               L * (N * C + 3 * C * C + 4 * N * 3 * C + 2 * 3 * C) / 1e9, places=9)
        self.assertAlmostEqual(ops[("forward", "attn.c_attn output to bf16")]["gb"], 5.435817984, places=9)
        self.assertAlmostEqual(row(r, "attention", "forward")["gb"], 3.038773248, places=9)

    def test_the_device_line_says_where_attention_ran(self):
        r, ops = self.floors_of(variant("bf16-float32-attention.json", "gpt2-124M-octet-bf16.json",
                                        device_line=self.H100 + "; WARNING: attention in float32, not on BF16 "
                                        "tensor cores (head size 64 is not a multiple of 16 up to 128, or the "
                                        "GPU predates compute capability 8.0): correct but much slower"))
        N, C, L = self.N, self.C, self.L
        self.assertAlmostEqual(row(r, "attention", "forward")["gb"], 4.850712576, places=9)
        self.assertEqual(ops[("forward", "attention forward")]["tflops"], 250.0)
        # A BF16 GEMM writing float32 qkv, its bias copied and rounded (16 bytes) and read in float32.
        self.assertAlmostEqual(ops[("forward", "attn.c_attn forward GEMM")]["gb"],
                               L * (2 * N * C + 2 * 3 * C * C + 4 * N * 3 * C + 4 * 3 * C) / 1e9, places=9)
        self.assertAlmostEqual(ops[("forward", "attn.c_attn bias for the epilogue")]["gb"], L * 16 * 3 * C / 1e9,
                               places=12)
        self.assertNotIn(("forward", "attn.c_attn output to bf16"), ops)
        self.assertFalse([n for n in r["notes"] if "where attention ran" in n], r["notes"])
        r, _ = self.floors_of(variant("bf16-tensor-core-attention.json", "gpt2-124M-octet-bf16.json",
                                      device_line=self.H100 + "; attention on BF16 tensor cores"))
        self.assertAlmostEqual(row(r, "attention", "forward")["gb"], 3.038773248, places=9)
        self.assertFalse([n for n in r["notes"] if "where attention ran" in n], r["notes"])

    def test_cudnn_keeps_attention_outputs_in_bf16(self):
        """Where the device line names cuDNN, atty, d(atty) and d(qkv) are bf16 (hand counts in ops)."""
        cudnn = self.H100 + ("; attention on BF16 tensor cores: cuDNN 9.19.0 fused flash attention (forward "
                             "engine 2, backward engine 6)")
        N, C, L = self.N, self.C, self.L
        for source in ("gpt2-124M-octet-fp8.json", "gpt2-124M-octet-bf16.json"):
            r, ops = self.floors_of(variant("cudnn-" + source, source, device_line=cudnn))
            # Forward (2 x 3NC + 2 NC + 4 B NH T) L = 2434793472; backward (2 x 3NC + 2 (NC + NC + 3NC)
            # + 4 B NH T) L = 4850712576.
            self.assertAlmostEqual(row(r, "attention", "forward")["gb"], 2.434793472, places=9)
            self.assertAlmostEqual(row(r, "attention", "backward")["gb"], 4.850712576, places=9)
            if "fp8" in source:
                # The fused cast reads bf16 atty and writes codes and transpose: (2 + 2) N C L = 1207959552.
                self.assertAlmostEqual(ops[("forward", "attn.c_proj input cast (from bf16)")]["gb"], 1.207959552,
                                       places=9)
                self.assertNotIn(("forward", "attn.c_proj input cast"), ops)
                # The FP8 input-gradient GEMM writes d(atty) in bf16: (N C + C^2 + 2 N C) L = 913047552.
                self.assertAlmostEqual(ops[("backward", "attn.c_proj input-gradient GEMM")]["gb"], 0.913047552,
                                       places=9)
                self.assertNotIn(("backward", "attn.c_proj input gradient to bf16"), ops)
                # attn.c_attn's cast and bias gradient read d(qkv) in bf16: ((2 + 2) N 3C + 8 x 3C) L.
                self.assertAlmostEqual(ops[("backward", "attn.c_attn gradient cast and bias gradient")]["gb"],
                                       L * (4 * N * 3 * C + 8 * 3 * C) / 1e9, places=9)
            else:
                # BF16 GEMMs read atty and d(qkv) as they lie: no conversion of either.
                for op in (("forward", "attn.c_proj input to bf16"), ("backward", "attn.c_attn gradient to bf16"),
                           ("backward", "attn.c_proj input to bf16 (weight gradient)"),
                           ("backward", "attn.c_proj input gradient to bf16")):
                    self.assertNotIn(op, ops)
                self.assertAlmostEqual(ops[("backward", "attn.c_attn bias gradient")]["gb"],
                                       L * (2 * N * 3 * C + 8 * 3 * C) / 1e9, places=9)
                # The BF16 input-gradient GEMM writes d(atty) in bf16: (2 N C + 2 C^2 + 2 N C) L.
                self.assertAlmostEqual(ops[("backward", "attn.c_proj input-gradient GEMM")]["gb"],
                                       L * (4 * N * C + 2 * C * C) / 1e9, places=9)


class Gpt2Medium(unittest.TestCase):
    def setUp(self):
        [self.fp8] = result_of(inputs("gpt2-350M-octet-fp8.json"), *FAST_MEMORY)

    def test_flops_match_the_hand_count(self):
        self.assertAlmostEqual(self.fp8["total"]["gflop"], 37636.798, places=2)
        self.assertAlmostEqual(gflop(self.fp8, "FP8 GEMMs") + gflop(self.fp8, "BF16/FP16/FP32 GEMMs"), 34750.580,
                               places=2)

    def test_bytes_match_the_hand_count(self):
        other = "embeddings, residuals, biases, zeroing"
        self.assertAlmostEqual(row(self.fp8, other, "forward")["gb"], 0.139804672, places=9)
        self.assertAlmostEqual(row(self.fp8, other, "backward")["gb"], 0.2768896, places=9)
        self.assertAlmostEqual(row(self.fp8, "casts and conversions", "backward")["gb"], 12.08057856, places=9)


class GemmRates(unittest.TestCase):
    def test_the_table_of_octet_bench_gemm_gives_each_shape_its_rate(self):
        [r] = result_of(inputs("gpt2-124M-octet-fp8.json"), "--gemm", inputs("bench-gemm-gpt2-124M-h100.md"),
                        "--bandwidth-gbs", "3000")
        ops = {(o["phase"], o["op"]): o for o in r["ops"]}
        # Rows of docs/bench/bench-gemm-gpt2-124M-h100.md: the forward with fast accumulation (e4m3 fast),
        # the backward E5M2 gradients without (e4m3xe5m2).
        self.assertEqual(ops[("forward", "attn.c_attn forward GEMM")]["tflops"], 1126.2)
        self.assertEqual(ops[("backward", "attn.c_attn input-gradient GEMM")]["tflops"], 1239.7)
        self.assertEqual(ops[("backward", "mlp.c_proj weight-gradient GEMM")]["tflops"], 1425.5)
        # The BF16 head runs 4096-row chunks, which that table does not have: the highest bf16 rate stands in.
        self.assertEqual(ops[("forward", "lm_head forward GEMM")]["tflops"], 763.4)
        self.assertEqual(ops[("forward", "attention forward")]["tflops"], 763.4)
        self.assertIn("bf16: shapes not measured take the highest bf16 rate measured (763.4 TFLOP/s)", r["notes"])

    def test_the_json_of_octet_bench_gemm_gives_rates_and_bandwidth(self):
        os.makedirs(WORK, exist_ok=True)
        path = os.path.join(WORK, "gemm.json")
        rates = {k: {"tflops": 400.0, "median_ms": 1.0} for k in floors.GEMM_KIND_KEYS}
        shape = dict(rates, e4m3_fast_accum={"tflops": 900.0, "median_ms": 1.0})
        with open(path, "w") as f:
            json.dump({"benchmark": "gemm", "device": {"name": "test"},
                       "rows": [{"M": 32768, "N": 2304, "K": 768, "results": shape},
                                {"M": 8, "N": 8, "K": 8, "results": dict(rates, tf32={"skipped": "no"})}],
                       "memory_bandwidth": {"copy_gbs": 2500.0, "read_gbs": 2800.0}}, f)
        [r] = result_of(inputs("gpt2-124M-octet-fp8.json"), "--gemm", path)
        self.assertEqual(r["bandwidth_gbs"], 2500.0)
        ops = {(o["phase"], o["op"]): o for o in r["ops"]}
        self.assertEqual(ops[("forward", "attn.c_attn forward GEMM")]["tflops"], 900.0)
        self.assertEqual(ops[("forward", "mlp.c_fc forward GEMM")]["tflops"], 900.0)  # the best e4m3 fast
        self.assertEqual(ops[("backward", "mlp.c_fc input-gradient GEMM")]["tflops"], 400.0)
        # An override wins over the measured rates.
        [r] = result_of(inputs("gpt2-124M-octet-fp8.json"), "--gemm", path, "--fp8-tflops", "1234")
        ops = {(o["phase"], o["op"]): o for o in r["ops"]}
        self.assertEqual(ops[("forward", "attn.c_attn forward GEMM")]["tflops"], 1234.0)


class Outputs(unittest.TestCase):
    def test_markdown_has_one_table_per_result_and_a_total(self):
        code, out, err = run(inputs("gpt2-124M-octet-fp8.json"), inputs("gpt2-124M-octet-bf16.json"),
                             *FAST_MEMORY, "--markdown")
        self.assertEqual(code, 0, err)
        self.assertEqual(out.count("| kind of op | phase | GFLOP | GB | floor ms | measured ms | measured/floor |"), 2)
        self.assertEqual(out.count("\n| total |"), 2)
        self.assertIn("| FP8 GEMMs | forward | 5566.3 |", out)

    def test_text_is_the_default(self):
        code, out, err = run(inputs("gpt2-124M-octet-fp8.json"), *FAST_MEMORY)
        self.assertEqual(code, 0, err)
        self.assertIn("kind of op", out)
        self.assertNotIn("|", out)

    def test_bad_inputs_fail_with_one_line(self):
        cases = [[inputs("gpt2-124M-peer.json"), *FAST_MEMORY],  # not octet's result
                 [inputs("gpt2-124M-octet-fp8.json"), "--fp8-tflops", "1000"],  # no bandwidth
                 [inputs("gpt2-124M-octet-fp8.json"), "--bandwidth-gbs", "1000"],  # no GEMM rates
                 [os.path.join(INPUTS, "missing.json"), *FAST_MEMORY]]
        for args in cases:
            code, out, err = run(*args)
            self.assertEqual(code, 2, args)
            self.assertEqual(out, "")
            self.assertEqual(len(err.strip().splitlines()), 1, err)
            self.assertTrue(err.startswith("floors.py: error: "), err)
        code, _, err = run(inputs("gpt2-124M-octet-fp8.json"), *FAST_MEMORY[:-1], "-5")
        self.assertEqual(code, 2)
        self.assertIn("--bandwidth-gbs", err)


class CurrentOctetResult(unittest.TestCase):
    """A result of this build's `octet bench train`: the precision of every layer's GEMMs comes from it."""

    def test_an_excluded_layer_counts_as_bf16(self):
        if not os.path.exists(OCTET):
            self.skipTest(f"no octet binary at {OCTET}")
        os.makedirs(WORK, exist_ok=True)
        config = os.path.join(WORK, "tiny.toml")
        with open(config, "w") as f:
            f.write('[model]\nvocab_size = 256\nmax_seq_len = 16\nlayers = 2\nheads = 2\nchannels = 32\n'
                    '[train]\nmixed_precision = "fp8"\ndevice = "cpu"\nbatch_size = 2\nseq_len = 16\n'
                    'steps = 10\n')
        p = subprocess.run([OCTET, "bench", "train", config, "--steps", "1", "--warmup", "0", "--json", "--set",
                            'fp8.exclude=["h.1.mlp.c_proj"]'], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        train = os.path.join(WORK, "tiny.json")
        with open(train, "w") as f:
            f.write(p.stdout)
        [r] = result_of(train, *FAST_MEMORY)
        self.assertFalse([n for n in r["notes"] if "not in the result" in n or "model line" in n], r["notes"])
        N, C, L, Vp = 32, 32, 2, 256
        # FP8: every block linear but one mlp.c_proj; BF16: that one and the LM head (forward and backward in
        # the forward phase).
        fp8_forward = 2 * N * C * (3 * C + C + 4 * C) * L + 2 * N * 4 * C * C
        self.assertAlmostEqual(row(r, "FP8 GEMMs", "forward")["gflop"], fp8_forward / 1e9, places=12)
        self.assertAlmostEqual(row(r, "FP8 GEMMs", "backward")["gflop"], 2 * fp8_forward / 1e9, places=12)
        self.assertAlmostEqual(row(r, "BF16/FP16/FP32 GEMMs", "forward")["gflop"],
                               (2 * N * 4 * C * C + 3 * 2 * N * C * Vp) / 1e9, places=12)
        self.assertAlmostEqual(row(r, "BF16/FP16/FP32 GEMMs", "backward")["gflop"], 2 * 2 * N * 4 * C * C / 1e9,
                               places=12)
        # No device times on the CPU: nothing measured.
        self.assertIsNone(r["total"]["measured_ms"])


if __name__ == "__main__":
    shutil.rmtree(WORK, ignore_errors=True)
    result = unittest.main(argv=[sys.argv[0], "-v"], exit=False).result
    sys.exit(0 if result.wasSuccessful() else 1)
