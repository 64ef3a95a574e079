#!/usr/bin/env python3
"""Floors of a GPT-2 training step, per kind of op and phase, next to the device time octet measured: the FLOPs
the work must do, the bytes it must move, and

    floor = max(FLOPs / GEMM rate, bytes / memory bandwidth)

taken op by op and summed (the ops of a step run one after another on one stream). One table per result.

    bench/floors.py TRAIN.json [TRAIN.json ...] [--gemm GEMM.json|GEMM.md ...]
                    [--fp8-tflops X] [--bf16-tflops X] [--tf32-tflops X] [--bandwidth-gbs X]
                    [--markdown | --json]

TRAIN.json: `octet bench train CONFIG --json` (the shape, the mode, the precision of every linear layer's GEMMs
and `phases.device_ms_by_kind`, the measured column). GEMM.json: `octet bench gemm --config CONFIG --json`
(TFLOP/s per shape and kind, and `memory_bandwidth.copy_gbs`); the Markdown table `octet bench gemm` prints
is read too. A GEMM takes the rate measured for its own shape (M, N, K) and kind, or else the highest rate of
that kind over every shape given (stated in the notes); attention takes the highest BF16 rate where its
products run on BF16 tensor cores, the TF32 rate where they do not (below). --fp8-tflops, --bf16-tflops
and --tf32-tflops replace every rate of that precision, --bandwidth-gbs the bandwidth (the copy figure of
`octet bench gemm`, read + write bytes).

The work is octet's, as the CUDA backend of this octet runs it (src/model/gpt2.cpp,
src/backends/cuda/cuda_backend.cu, fused_*.cu, gemm.cu): the floors describe the op sequence of the octet
this script ships with, whatever octet produced the result. A result of an older octet, which ran other ops (a
rounding pass after every GEMM, say), gets the floors of this octet's ops next to the times of its own; the
result's `octet_version` names the release, not the build, so the script cannot tell the two apart.
N = B*T rows, C channels, L layers, NH heads of hs = C/NH, V vocabulary, Vp padded vocabulary, P parameters.
Activations and gradients are float32 (4 bytes an element), FP8 codes 1 byte, BF16/FP16 copies 2 bytes;
attention's input qkv [N, 3C] is bf16 where attention runs on BF16 tensor cores, and its output atty [N, C]
and the gradients on either side of it (d(atty) [N, C], d(qkv) [N, 3C]) are bf16 where it runs on cuDNN (the
device line names cuDNN; Backend::storage_type, role attention_output): then attn.c_proj's forward cast reads bf16 (fused,
one pass, under the delayed and static recipes; widened to float32 first under "current"), a BF16
attn.c_proj reads atty as it lies, attn.c_proj's input gradient is written as bf16 by the GEMM (BF16, and FP8
on FP8 tensor cores; the others write float32 and convert), and attn.c_attn's gradient cast, bias gradient
and BF16 GEMMs read d(qkv) as bf16.

Where attention runs: on BF16 tensor cores in every mode but fp32 (the driver asks for them,
CudaBackendOptions::bf16_attention) when hs is a multiple of 16 up to 128 (attention_uses_tensor_cores; every
GPT-2 size), in float32 otherwise. A result's device line says which ("attention on BF16 tensor cores", or a
warning that it ran in float32); where it does not (older results, the CPU backend's), the script takes it
from the mode and hs as above, which assumes a GPU of compute capability 8.0 or newer. The same line says
when FP8 GEMMs were emulated on a GPU without FP8 tensor cores ("no FP8 tensor cores"); otherwise they are
taken to run on FP8 tensor cores.

FLOPs, counted for the GEMMs and attention only (element-wise ops, normalisation, softmax and AdamW do a few
FLOPs per byte: they are bandwidth-bound):
  - linear layer x [N, in] -> y [N, out] (attn.c_attn C->3C, attn.c_proj C->C, mlp.c_fc C->4C, mlp.c_proj
    4C->C in each block; lm_head C->Vp): forward 2 N in out; backward 2x that, input gradient (N x in, K =
    out) and weight gradient (out x in, K = N). So 24 N C^2 per block forward and 3 x (12 L C^2 + C Vp) 2N =
    6 N x (parameters in matrices) per step.
  - attention, causal: forward 4 B NH T^2 hs / 2 (QK^T and PV, half by causality); backward 2.5x the forward
    (FlashAttention's count: five products instead of two).
  (`octet bench train`'s MFU counts 6 N + 12 L C T per token instead: no causal halving, backward 2x.)

Bytes, the least each op octet runs must move: every input read once, every output written once, an
accumulation read and written. Per op:
  - GEMM: A, B in their storage type, D float32 (octet's GEMMs write float32, and nothing rounds it
    afterwards), or bf16 where attn.c_attn writes qkv for attention (below); a weight gradient is written by
    the step's first micro-batch and read and written by the others (zeroing leaves it to the first). A forward GEMM adds its layer's bias in its epilogue (every linear layer but the LM
    head, which has none) and reads it: BF16 (2 bytes an element) for an FP8 GEMM and for a GEMM writing
    bf16, float32 (4) for the others; attn.c_proj's and mlp.c_proj's also read the residual (below). No pass
    over y follows the GEMM.
  - the bias as the epilogue reads it (kind embeddings/residuals/biases), once per forward GEMM: converted to
    BF16 (read 4, write 2 bytes an element) for an FP8 layer or a GEMM writing bf16, a BF16/FP16 layer's
    otherwise copied and rounded in place (16 bytes), a float32 layer's read where it lies (nothing).
  - attn.c_attn's output qkv where attention runs on BF16 tensor cores (CudaBackend::linear_forward_as):
    written as bf16 by the GEMM's epilogue (2 bytes an element) when the GEMM can (BF16, and FP8 on FP8
    tensor cores), its bias converted to BF16 as above; otherwise (FP16, FP8 emulated, float32) the GEMM
    writes float32 into scratch and a conversion (casts) reads it and writes bf16 (read 4, write 2 bytes).
  - bias gradient (column sums of dy, added into the bias's gradient: read and write 8 bytes a column):
    bias_backward reads dy (kind embeddings/residuals/biases) for a layer without an FP8 backward GEMM, and
    under the "current" recipe; under the delayed and static recipes an FP8 layer's gradient cast sums it in
    its own pass over dy (kind casts; mlp.c_fc's in GELU's backward, below), which then reads dy once for
    both. The column partial sums those fused passes write and read again (32-row tiles: 1/8 byte an element
    each way) are scratch of the kernel, not counted.
  - FP8 cast of an operand (casts, or fused into its producer): reads float32, writes the codes and their
    transpose (2 bytes an element; both are always written); the "current" recipe reads the tensor once more
    for its amax. The forward input of attn.c_proj is cast on its own (casts); the inputs of attn.c_attn,
    mlp.c_fc, mlp.c_proj (and an FP8 lm_head) are written as codes by LayerNorm and GELU (kind LayerNorm/GELU)
    under the delayed and static recipes, and their float32 output is then not written at all when the FP8
    cast is all that the layer reads (forward and weight gradient in FP8). Gradient casts (casts): dy of every
    layer with an FP8 backward GEMM, codes and transpose (with the bias gradient, as above).
  - BF16/FP16 GEMMs (casts): the float32 operand is converted first (read 4, write 2 bytes); dy once for both
    backward GEMMs when they run in the same type; the input again for the weight gradient. An input
    gradient is the GEMM's float32 output as it is, whatever the GEMM's type: no rounding pass (but
    LayerNorm's dout, below). Except: a
    block layer whose forward and weight gradient are both BF16 keeps its input in bf16 (Gpt2's input_type),
    written so by LayerNorm or GELU (2 bytes an element) and read as it lies by both GEMMs; a float32 dy with
    a bias and a BF16 input gradient is converted in the bias gradient's pass (bias_backward_convert, kind
    casts: read 4, write 2 bytes an element, the bias's 8 bytes a column); and where both of mlp.c_fc's
    backward GEMMs are BF16, GELU's backward writes its gradient in bf16 (2 bytes), which the bias gradient
    and both GEMMs read as it lies.
  - LayerNorm forward: reads x, writes mean and rstd and its output as above; backward reads dout, x, mean,
    rstd and adds into dx (read and write). ln_1's and ln_2's dout, the input gradient of attn.c_attn and
    mlp.c_fc, is bf16 where that layer's input-gradient GEMM is BF16 or FP8 (Gpt2::layernorm_gradient_type):
    the GEMM writes it so (2 bytes an element; an emulated FP8 GEMM writes float32 and a conversion
    follows), LayerNorm's backward reads it so; ln_f's is float32. GELU forward reads x; backward reads x and dout, writes dx.
  - attention: forward reads q, k, v [N, 3C] (bf16 on tensor cores, read as they lie; float32 otherwise),
    writes out [N, C] and lse [B, NH, T]; backward reads q, k, v (the same), out, dout and lse and writes
    dqkv [N, 3C] (float32). The backward's scratch on tensor cores, dO packed per head in bf16 and
    D = rowsum(dO * O) that a first kernel writes from its read of dout and out and the products read again
    (2 bytes an element of dout and 4 a row, each way), is not counted, as the partial sums above.
  - residual adds: attn.c_proj's and mlp.c_proj's GEMMs add the residual stream in their epilogue
    (CudaBackend::linear_forward_residual_as), which reads it (4 bytes an element, counted with the GEMM) and
    writes the sum as the GEMM's output; an FP8 layer without FP8 tensor cores (emulated) writes its output
    and a residual add follows (read two [N, C], write one). The encoder reads N rows of wte and T of wpe,
    writes [N, C]; its backward reads dout and reads and writes one row of dwte per token and dwpe; the
    backward zeroes the residual gradient [N, C] first.
  - LM head and cross-entropy, in the forward phase (octet runs the head's backward inside the forward),
    chunk by chunk (4096 rows unless one of the head's GEMMs is FP8, all N then): the head's GEMMs per chunk
    (the weight read per chunk, the weight gradient read and written per chunk), cross-entropy reading V
    logits and the target a row and writing the Vp-wide gradient over the logits and the loss. A head whose
    three GEMMs are BF16 (the default in the fp8 and bf16 modes; CudaBackend::lm_head_chunk) keeps the chunk
    in BF16: its GEMM writes the logits in BF16 (2 bytes a logit; no rounding pass), the loss reads and
    writes 2 bytes a logit, the backward GEMMs read that gradient as it is, and ln_f is converted to BF16
    once per chunk for both GEMMs that read it. Any other head writes float32 logits, and its backward runs
    as a block layer's (without a bias).
  - GELU's backward when mlp.c_fc has an FP8 backward GEMM (norm_activation, one op: gelu_backward_cast).
    Under the delayed and static recipes it also writes the gradient as FP8 codes and transposed codes and
    sums the layer's bias gradient in the same pass, and writes the float32 gradient only where one of the
    layer's backward GEMMs is not FP8. Under the "current" recipe the same op runs GELU's backward (the
    float32 gradient always written), bias_backward and the cast with its amax read one after another. That
    layer's backward then neither casts nor sums its bias.
  - optimizer phase, once a step whatever grad_accum_steps: zeroing the gradients but the linear layers'
    weights, which their first backward writes (4 (P - the weights' elements)), the gradient norm
    (reads 4P), AdamW (reads param, grad, m, v, writes param, m, v: 28P), both reading 2 bytes instead of 4
    for each weight gradient kept in bf16 (train.weight_gradients = "bf16": the block layers whose
    weight-gradient GEMM is BF16, or FP8 on FP8 tensor cores, which then writes 2 bytes an element instead
    of 4), and the weight copies: FP8 codes
    and transpose written in the AdamW pass (2 bytes an element; "current" recipe: a separate cast reading the
    weight twice, 10 bytes), a BF16 layer's BF16 copy in the AdamW pass too (2 bytes), and the BF16 copy
    that an FP8 layer's other GEMMs read, or an FP16 copy, by a separate conversion (6 bytes).
Forward and backward work repeats grad_accum_steps times a step.

Results of older octet builds lack `linear_gemms`, `fp8` and `vocab_size`: the script then takes the mode's
defaults (fp8: every block linear in FP8 when fp8_gemms_per_step says so, the LM head in BF16, the delayed
recipe, hybrid formats, fast accumulation in the forward only) and the vocabulary from the `model` line, and
says so in the notes, as it says that such a result's ops were not the ones counted.
"""
import argparse
import json
import math
import re
import sys

KINDS = [
    ("gemm_fp8", "FP8 GEMMs"),
    ("gemm_wide", "BF16/FP16/FP32 GEMMs"),
    ("attention", "attention"),
    ("casts", "casts and conversions"),
    ("norm_activation", "LayerNorm and GELU (fused casts included)"),
    ("loss", "cross-entropy"),
    ("optimizer", "optimizer (fused weight casts included)"),
    ("other", "embeddings, residuals, biases, zeroing"),
]
KIND_NAMES = dict(KINDS)
PHASES = ("forward", "backward", "optimizer")
F32 = 4
STORAGE_BYTES = {"fp8": 1, "bf16": 2, "f16": 2, "f32": 4}
HEAD_CHUNK_ROWS = 4096  # Gpt2::kHeadChunkRows
# The op that writes each linear layer's input.
PRODUCER = {"attn.c_attn": "ln_1", "attn.c_proj": "attention", "mlp.c_fc": "ln_2", "mlp.c_proj": "gelu",
            "lm_head": "ln_f"}
GEMM_KIND_KEYS = ("e4m3", "e4m3_fast_accum", "e4m3_e5m2", "e4m3_e5m2_fast_accum", "bf16", "tf32")
GEMM_HEADINGS = {"e4m3": "e4m3", "e4m3 fast": "e4m3_fast_accum", "e4m3xe5m2": "e4m3_e5m2",
                 "e4m3xe5m2 fast": "e4m3_e5m2_fast_accum", "bf16": "bf16", "tf32": "tf32"}


class Refusal(Exception):
    """An input the script cannot use: one line on standard error, exit code 2."""


# ---------------------------------------------------------------------------------------------------------
# The shape and precision of a result.

def model_of(train, source):
    if train.get("benchmark") != "train":
        raise Refusal(f"{source}: not the JSON of `octet bench train --json` (benchmark is "
                      f"{train.get('benchmark')!r})")
    notes = []
    m = {key: train[key] for key in ("layers", "channels", "heads", "padded_vocab", "batch_size", "seq_len",
                                     "mode", "parameters")}
    m["grad_accum_steps"] = train.get("grad_accum_steps", 1)
    m["vocab_size"] = train.get("vocab_size")
    if m["vocab_size"] is None:
        found = re.search(r"vocabulary (\d+)", train.get("model", ""))
        if not found:
            raise Refusal(f"{source}: no vocab_size, and no 'vocabulary V' in the model line")
        m["vocab_size"] = int(found.group(1))
        notes.append("vocabulary taken from the model line")
    mode = m["mode"]
    fp8 = train.get("fp8")
    if mode == "fp8" and fp8 is None:
        fp8 = {"recipe": "delayed", "formats": "hybrid", "fast_accumulation_forward": True,
               "fast_accumulation_backward": False}
        notes.append("FP8 settings not in the result: the delayed recipe, hybrid formats, fast accumulation "
                     "in the forward only assumed (the defaults)")
    if fp8 is not None and fp8.get("recipe") not in ("delayed", "current", "static"):
        raise Refusal(f"{source}: recipe {fp8.get('recipe')!r}: the floors cover the per-tensor recipes the CUDA "
                      f"backend runs (delayed, current, static)")
    m["fp8"] = fp8
    linears = train.get("linear_gemms")
    if linears is None:
        linears = infer_linears(train, m, source)
        notes.append("GEMM precision per layer not in the result: taken from the mode and the GEMM counts")
        notes.append("a result without the precision plan comes from an older octet, which ran other ops: the "
                     "floors are those of the ops this octet runs")
    backend = (train.get("device") or {}).get("backend")
    if backend is not None and backend != "cuda":
        notes.append(f"the result ran on the {backend} backend: the floors are those of the CUDA backend's ops")
    line = (train.get("device") or {}).get("line") or ""
    m["fp8_tensor_cores"] = "no FP8 tensor cores" not in line
    m["attention_tensor_cores"] = attention_on_tensor_cores(m, line, notes)
    m["attention_bf16_outputs"] = m["attention_tensor_cores"] and "cuDNN" in line
    # Gpt2: the MLP's hidden activation and its gradient are rounded to bf16 in bf16 and fp8 modes, and the
    # CUDA backend stores them so (Backend::storage_type, role rounded_activation).
    m["hidden_bf16"] = mode in ("bf16", "fp8")
    # train.weight_gradients (results of older builds: float32).
    m["bf16_weight_gradients"] = train.get("weight_gradients", "float32") == "bf16" and mode in ("bf16", "fp8")
    m["linears"] = linears
    m["notes"] = notes
    return m


def attention_on_tensor_cores(m, line, notes):
    """Whether attention ran on BF16 tensor cores, with q, k, v stored in bf16: as the device line says, or
    else as the CUDA backend decides from the mode and the head size (attention_uses_tensor_cores)."""
    if m["mode"] == "fp32":
        return False  # no bf16_attention: the float32 path
    if "attention on BF16 tensor cores" in line:
        return True
    if "attention in float32" in line:
        return False
    hs = m["channels"] // m["heads"]
    tensor_cores = m["channels"] % m["heads"] == 0 and hs % 16 == 0 and hs <= 128
    notes.append(f"where attention ran is not on the device line: taken from the mode and the head size {hs} "
                 f"({'BF16 tensor cores, q, k, v in bf16' if tensor_cores else 'float32'})")
    return tensor_cores


def infer_linears(train, m, source):
    L, C, Vp = m["layers"], m["channels"], m["padded_vocab"]
    base = {"fp32": "f32", "bf16": "bf16", "fp16": "f16", "fp8": "bf16"}.get(m["mode"])
    if base is None:
        raise Refusal(f"{source}: unknown mode {m['mode']!r}")
    head_fp8 = False
    blocks = base
    if m["mode"] == "fp8":
        per_micro_batch = train.get("fp8_gemms_per_step", 0) / m["grad_accum_steps"]
        if per_micro_batch == 12 * L:
            blocks = "fp8"
        elif per_micro_batch == 12 * L + 3:
            blocks, head_fp8 = "fp8", True
        else:
            raise Refusal(f"{source}: {train.get('fp8_gemms_per_step')} FP8 GEMMs per step do not say which "
                          f"layers ran in FP8; run `octet bench train --json` again with this octet "
                          f"(its result lists every layer's GEMMs)")
    shapes = [("attn.c_attn", C, 3 * C), ("attn.c_proj", C, C), ("mlp.c_fc", C, 4 * C), ("mlp.c_proj", 4 * C, C)]
    linears = [{"linear": name, "in_features": i, "out_features": o, "layers": L, "forward": blocks,
                "input_gradient": blocks, "weight_gradient": blocks} for name, i, o in shapes]
    head = "fp8" if head_fp8 else base
    linears.append({"linear": "lm_head", "in_features": C, "out_features": Vp, "layers": 1, "forward": head,
                    "input_gradient": head, "weight_gradient": head})
    return linears


# ---------------------------------------------------------------------------------------------------------
# The ops of one step, each with its kind, phase, FLOPs, rate and bytes.

class Step:
    def __init__(self, m):
        self.m = m
        self.ops = []
        fp8 = m["fp8"] or {}
        self.recipe = fp8.get("recipe", "delayed")
        self.fast_forward = fp8.get("fast_accumulation_forward", True)
        self.fast_backward = fp8.get("fast_accumulation_backward", False)
        self.gradient_kind = "e4m3" if fp8.get("formats") == "all_e4m3" else "e4m3_e5m2"
        # An extra read of every FP8 cast's input for its amax, before the cast ("current" scaling).
        self.amax_read = F32 if self.recipe == "current" else 0
        self.producer_fused = self.recipe in ("delayed", "static")

    def add(self, kind, phase, name, bytes_moved, count=1, flops=0.0, rate=None):
        if count <= 0:
            return
        if phase != "optimizer":
            count *= self.m["grad_accum_steps"]
        self.ops.append({"kind": kind, "phase": phase, "name": name, "count": count, "flops": float(flops),
                         "bytes": float(bytes_moved), "rate": rate})

    def gemm_rate(self, mode, role, M, N, K):
        if mode == "fp8":
            if role == "forward":
                key = "e4m3_fast_accum" if self.fast_forward else "e4m3"
            else:
                key = self.gradient_kind + ("_fast_accum" if self.fast_backward else "")
        else:
            key = "tf32" if mode == "f32" else "bf16"
        return ("gemm", key, M, N, K)

    def gemm(self, phase, name, mode, role, M, N, K, a_bytes, b_bytes, d_bytes, count, bias_bytes=0):
        kind = "gemm_fp8" if mode == "fp8" else "gemm_wide"
        self.add(kind, phase, name, a_bytes + b_bytes + d_bytes + bias_bytes, count, 2.0 * M * N * K,
                 self.gemm_rate(mode, role, M, N, K))


def keeps_float_input(g):
    """Whether the layer reads its float32 input: not when its FP8 cast is all it reads (input_cast_suffices)."""
    return not (g["forward"] == "fp8" and g["weight_gradient"] == "fp8")


def bf16_input(g):
    """Whether a layer fed by LayerNorm or GELU (attn.c_attn, mlp.c_fc, mlp.c_proj; the LM head reads float32)
    keeps its input in bf16 (Gpt2's input_type): its forward and weight gradient GEMMs are both BF16."""
    return g["linear"] in PRODUCER and PRODUCER[g["linear"]] in ("ln_1", "ln_2", "gelu") \
        and g["forward"] == "bf16" and g["weight_gradient"] == "bf16"


def bf16_gradient(g):
    """Whether the model rounds the layer's output gradient to bf16 where it makes it in a pass of its own
    (GELU's backward for mlp.c_fc): both GEMMs that read it are BF16."""
    return g["linear"] != "lm_head" and g["input_gradient"] == "bf16" and g["weight_gradient"] == "bf16"


def bf16_layernorm_gradient(g):
    """Whether a layer fed by LayerNorm (attn.c_attn, mlp.c_fc) hands LayerNorm's backward its input gradient in
    bf16 (Gpt2::layernorm_gradient_type): where its input-gradient GEMM is BF16 or FP8, which then writes it
    so; the CUDA backend stores it in bf16 (CudaBackendOptions::hidden_in_bf16, on by default)."""
    return g["linear"] in ("attn.c_attn", "mlp.c_fc") and g["input_gradient"] in ("bf16", "fp8")


def linear_forward(s, g, rows, phase, count, label, bf16_output=False, bf16_input=False, residual=False):
    """`bf16_output`: y is stored as bf16 (attn.c_attn's qkv where attention runs on BF16 tensor cores,
    mlp.c_fc's output in bf16 and fp8 modes).
    `bf16_input`: x is stored as bf16 (attn.c_proj's input where attention runs on cuDNN).
    `residual`: y joins the residual stream (attn.c_proj, mlp.c_proj)."""
    inn, out, f = g["in_features"], g["out_features"], g["forward"]
    producer = PRODUCER[g["linear"]]
    if f == "fp8" and producer == "attention":
        if bf16_input and s.producer_fused:
            s.add("casts", phase, f"{label} input cast (from bf16)", (2 + 2) * rows * inn, count)
        else:
            widen = (2 + F32) if bf16_input else 0
            s.add("casts", phase, f"{label} input cast", (widen + F32 + s.amax_read + 2) * rows * inn, count)
    elif f == "bf16" and bf16_input:
        pass  # the GEMM reads the bf16 input as it lies
    elif f in ("bf16", "f16"):
        widen = (2 + F32) if bf16_input else 0
        s.add("casts", phase, f"{label} input to {f}", (widen + F32 + 2) * rows * inn, count)
    # CudaBackend::linear_forward_as: BF16 GEMMs, and FP8 ones on FP8 tensor cores, write bf16 from their
    # epilogue; the others write float32 into scratch, converted to bf16 after the GEMM.
    direct_bf16 = bf16_output and (f == "bf16" or (f == "fp8" and s.m["fp8_tensor_cores"]))
    # The bias goes into the GEMM's epilogue (CudaBackend::epilogue_bias): BF16 for an FP8 GEMM or a GEMM
    # writing bf16 (converted first), float32 for the others (a BF16/FP16 layer's copied and rounded in place,
    # a float32 layer's read where it lies). Nothing runs over y after the GEMM but that conversion.
    bias_bytes = 0
    if g["linear"] != "lm_head":
        bf16_bias = f == "fp8" or direct_bf16
        bias_bytes = (2 if bf16_bias else F32) * out
        conversion = (F32 + 2 if bf16_bias else {"bf16": 4 * F32, "f16": 4 * F32, "f32": 0}[f]) * out
        if conversion:
            s.add("other", phase, f"{label} bias for the epilogue", conversion, count)
    # The residual as the GEMM's addend, read in its epilogue; an emulated FP8 product is not cuBLASLt's, and
    # a residual add follows it.
    addend_bytes = 0
    if residual:
        if f == "fp8" and not s.m["fp8_tensor_cores"]:
            s.add("other", phase, f"{label} residual add", 3 * F32 * rows * out, count)
        else:
            addend_bytes = F32 * rows * out
    e = STORAGE_BYTES[f]
    s.gemm(phase, f"{label} forward GEMM", f, "forward", rows, out, inn, rows * inn * e, out * inn * e,
           rows * out * (2 if direct_bf16 else F32), count, bias_bytes + addend_bytes)
    if bf16_output and not direct_bf16:
        s.add("casts", phase, f"{label} output to bf16", (F32 + 2) * rows * out, count)


def linear_backward(s, g, rows, phase, count, label, fused=False, bf16_dout=False, bf16_dinp=False,
                    bf16_input=False):
    """`fused`: the producer of the gradient cast it and summed the bias gradient (GELU's backward for mlp.c_fc).
    `bf16_dout`, `bf16_dinp`, `bf16_input`: dy, dx, x stored as bf16 (attn.c_attn's dy, attn.c_proj's dx and x
    where attention runs on cuDNN; mlp.c_proj's dx in bf16 and fp8 modes)."""
    inn, out, ig, wg = g["in_features"], g["out_features"], g["input_gradient"], g["weight_gradient"]
    has_bias = g["linear"] != "lm_head"
    dy = 2 if bf16_dout else F32
    widen_dy = (2 + F32) if bf16_dout else 0  # bf16 dy widened to float32 first, where nothing reads bf16
    converted = False  # dy's bf16 copy made in the bias gradient's pass
    if not fused:
        if "fp8" in (ig, wg) and has_bias and s.producer_fused:
            # CudaBackend::cast_gradient with a bias: bias_backward_cast sums it in the cast's pass over dy.
            s.add("casts", phase, f"{label} gradient cast and bias gradient",
                  (dy + 2) * rows * out + 2 * F32 * out, count)
        elif "fp8" not in (ig, wg) and has_bias and ig == "bf16" and not bf16_dout:
            # CudaBackend::linear_backward_as: bias_backward_convert sums the bias gradient and writes dy's
            # bf16 copy for both GEMMs in one pass over the float32 dy.
            s.add("casts", phase, f"{label} bias gradient and gradient to bf16",
                  (F32 + 2) * rows * out + 2 * F32 * out, count)
            converted = True
        else:
            if has_bias:
                s.add("other", phase, f"{label} bias gradient", dy * rows * out + 2 * F32 * out, count)
            if "fp8" in (ig, wg):
                s.add("casts", phase, f"{label} gradient cast",
                      (widen_dy + F32 + s.amax_read + 2) * rows * out, count)
    wide_dout = None
    if ig in ("bf16", "f16"):
        if not (ig == "bf16" and (bf16_dout or converted)):
            s.add("casts", phase, f"{label} gradient to {ig}", (widen_dy + F32 + 2) * rows * out, count)
        wide_dout = ig
    e = STORAGE_BYTES[ig]
    # A bf16 dx: written so by BF16 GEMMs and FP8 ones on FP8 tensor cores; the others write float32 into
    # scratch, converted after.
    direct_bf16 = bf16_dinp and (ig == "bf16" or (ig == "fp8" and s.m["fp8_tensor_cores"]))
    s.gemm(phase, f"{label} input-gradient GEMM", ig, "input_gradient", rows, inn, out, rows * out * e,
           out * inn * e, rows * inn * (2 if direct_bf16 else F32), count)
    if bf16_dinp and not direct_bf16:
        s.add("casts", phase, f"{label} input gradient to bf16", (F32 + 2) * rows * inn, count)
    if wg in ("bf16", "f16"):
        if wide_dout != wg and not (wg == "bf16" and bf16_dout):
            s.add("casts", phase, f"{label} gradient to {wg}", (widen_dy + F32 + 2) * rows * out, count)
        if not (wg == "bf16" and bf16_input):
            widen = (2 + F32) if bf16_input else 0
            s.add("casts", phase, f"{label} input to {wg} (weight gradient)", (widen + F32 + 2) * rows * inn,
                  count)
    e = STORAGE_BYTES[wg]
    # Written by the first micro-batch of a step, read and written by the others.
    accumulated = 2 - 1 / s.m["grad_accum_steps"]
    dw = 2 if bf16_weight_gradient(s.m, g) else F32
    s.gemm(phase, f"{label} weight-gradient GEMM", wg, "weight_gradient", out, inn, rows, rows * out * e,
           rows * inn * e, accumulated * dw * out * inn, count)


def bf16_weight_gradient(m, g):
    """Whether the CUDA backend stores g's weight gradient in bf16 (Backend::storage_type, role weight_gradient)."""
    wg = g["weight_gradient"]
    return (m["bf16_weight_gradients"] and g["linear"] != "lm_head"
            and (wg == "bf16" or (wg == "fp8" and m["fp8_tensor_cores"])))


def producer_output_bytes(s, g, rows):
    """What LayerNorm or GELU writes for its consumer g, over rows x in elements, and the cast it runs."""
    elements = rows * g["in_features"]
    if g["forward"] != "fp8":
        return (2 if bf16_input(g) else F32) * elements
    if s.producer_fused:
        return (F32 if keeps_float_input(g) else 0) * elements + 2 * elements
    # Current scaling: the float32 output (into scratch if the layer does not keep it), then the amax pass
    # and the cast, inside the producer's op.
    return F32 * elements + (s.amax_read + F32 + 2) * elements


def step_ops(m):
    s = Step(m)
    B, T, C, L, NH = m["batch_size"], m["seq_len"], m["channels"], m["layers"], m["heads"]
    V, Vp, P = m["vocab_size"], m["padded_vocab"], m["parameters"]
    N = B * T
    hs = C // NH
    attention_bf16 = m["attention_tensor_cores"]
    attention_rate = ("attention", attention_bf16)
    qkv_bytes = 2 if attention_bf16 else F32  # Backend::storage_type, role attention_input
    bf16_outputs = m["attention_bf16_outputs"]  # Backend::storage_type, role attention_output
    atty_bytes = 2 if bf16_outputs else F32
    hidden_bytes = 2 if m["hidden_bf16"] else F32  # mlp.c_fc's output and mlp.c_proj's input gradient
    blocks = [g for g in m["linears"] if g["linear"] != "lm_head"]
    heads = [g for g in m["linears"] if g["linear"] == "lm_head"]
    if len(heads) != 1:
        raise Refusal("linear_gemms has no single lm_head")
    head = heads[0]

    # Forward.
    s.add("other", "forward", "encoder", F32 * (N + N * C + T * C + N * C))
    for g in blocks:
        n, label = g["layers"], g["linear"]
        producer = PRODUCER[label]
        if producer in ("ln_1", "ln_2"):
            s.add("norm_activation", "forward", f"{producer} forward",
                  F32 * N * C + 2 * F32 * C + 2 * F32 * N + producer_output_bytes(s, g, N), n)
        elif producer == "gelu":
            s.add("norm_activation", "forward", "gelu forward",
                  hidden_bytes * N * 4 * C + producer_output_bytes(s, g, N), n)
        bf16_output = (attention_bf16 and label == "attn.c_attn") or (m["hidden_bf16"] and label == "mlp.c_fc")
        linear_forward(s, g, N, "forward", n, label, bf16_output=bf16_output,
                       bf16_input=(bf16_outputs and label == "attn.c_proj") or bf16_input(g),
                       residual=label in ("attn.c_proj", "mlp.c_proj"))
    attention_forward_flops = 4.0 * B * NH * T * T * hs / 2
    s.add("attention", "forward", "attention forward",
          qkv_bytes * 3 * N * C + atty_bytes * N * C + F32 * B * NH * T, L, attention_forward_flops,
          attention_rate)
    s.add("norm_activation", "forward", "ln_f forward",
          F32 * N * C + 2 * F32 * C + 2 * F32 * N + producer_output_bytes(s, head, N))
    # The LM head: forward, loss and backward chunk by chunk, in the forward phase.
    rows = N if head["forward"] == "fp8" or head["input_gradient"] == "fp8" or head["weight_gradient"] == "fp8" \
        else min(N, HEAD_CHUNK_ROWS)
    chunks = [rows] * (N // rows) + ([N % rows] if N % rows else [])
    bf16_head = all(head[k] == "bf16" for k in ("forward", "input_gradient", "weight_gradient"))
    for size in sorted(set(chunks)):
        count = chunks.count(size)
        if bf16_head:
            # Logits and their gradient stay BF16: the GEMM writes them so, no conversion of the gradient, ln_f
            # converted once for both GEMMs that read it.
            s.add("casts", "forward", "lm_head input to bf16", (F32 + 2) * size * C, count)
            s.gemm("forward", "lm_head forward GEMM", "bf16", "forward", size, Vp, C, 2 * size * C, 2 * Vp * C,
                   2 * size * Vp, count)
            s.add("loss", "forward", "cross-entropy", 2 * size * V + F32 * size + 2 * size * Vp + F32 * size,
                  count)
            s.gemm("forward", "lm_head input-gradient GEMM", "bf16", "input_gradient", size, C, Vp,
                   2 * size * Vp, 2 * Vp * C, F32 * size * C, count)
            s.gemm("forward", "lm_head weight-gradient GEMM", "bf16", "weight_gradient", Vp, C, size,
                   2 * size * Vp, 2 * size * C, 2 * F32 * Vp * C, count)
        else:
            # Float32 logits, no bias, nothing run over them before the loss.
            linear_forward(s, head, size, "forward", count, "lm_head")
            s.add("loss", "forward", "cross-entropy", F32 * (size * V + size + size * Vp + size), count)
            linear_backward(s, head, size, "forward", count, "lm_head")

    # Backward.
    s.add("other", "backward", "zero the residual gradient", F32 * N * C)
    def layernorm_backward(dout_bytes):
        return dout_bytes * N * C + F32 * (N * C + 2 * N + C + 2 * N * C + 4 * C)
    s.add("norm_activation", "backward", "ln_f backward", layernorm_backward(F32))
    for g in blocks:
        if g["linear"] in ("attn.c_attn", "mlp.c_fc"):
            name = "ln_1" if g["linear"] == "attn.c_attn" else "ln_2"
            s.add("norm_activation", "backward", f"{name} backward",
                  layernorm_backward(2 if bf16_layernorm_gradient(g) else F32), g["layers"])
    fc = next(g for g in blocks if g["linear"] == "mlp.c_fc")
    # Gpt2::gelu_backward_into: when mlp.c_fc has an FP8 backward GEMM, GELU's backward (one op) also makes
    # its gradient cast and bias gradient.
    fused_gelu = "fp8" in (fc["input_gradient"], fc["weight_gradient"])
    if fused_gelu and s.producer_fused:
        # One pass: the FP8 codes and transposed codes, the bias gradient as column sums; the float32
        # gradient only where a backward GEMM of the layer is not FP8.
        both_fp8 = fc["input_gradient"] == "fp8" and fc["weight_gradient"] == "fp8"
        gelu_bytes = (2 * hidden_bytes + 2 + (0 if both_fp8 else F32)) * N * 4 * C + 2 * F32 * 4 * C
        s.add("norm_activation", "backward", "gelu backward with mlp.c_fc's gradient cast and bias gradient",
              gelu_bytes, L)
    elif fused_gelu:
        # The "current" recipe: GELU's backward (the float32 gradient written, into scratch where the cast
        # suffices), bias_backward over it, then the cast with its amax read, inside the one op.
        gelu_bytes = (2 * hidden_bytes + F32 + F32 + s.amax_read + F32 + 2) * N * 4 * C + 2 * F32 * 4 * C
        s.add("norm_activation", "backward", "gelu backward, then mlp.c_fc's bias gradient and gradient cast",
              gelu_bytes, L)
    else:
        # Rounded to bf16 and stored so where both of mlp.c_fc's backward GEMMs are BF16.
        dfch_bytes = 2 if bf16_gradient(fc) and m["hidden_bf16"] else F32
        s.add("norm_activation", "backward", "gelu backward", (2 * hidden_bytes + dfch_bytes) * N * 4 * C, L)
    s.add("attention", "backward", "attention backward",
          qkv_bytes * 3 * N * C + atty_bytes * (N * C + N * C + 3 * N * C) + F32 * B * NH * T, L,
          2.5 * attention_forward_flops, attention_rate)
    for g in blocks:
        label = g["linear"]
        linear_backward(s, g, N, "backward", g["layers"], label, fused=fused_gelu and g is fc,
                        bf16_dout=(bf16_outputs and label == "attn.c_attn")
                        or (g is fc and not fused_gelu and bf16_gradient(fc) and m["hidden_bf16"]),
                        bf16_dinp=(bf16_outputs and label == "attn.c_proj")
                        or (m["hidden_bf16"] and label == "mlp.c_proj") or bf16_layernorm_gradient(g),
                        bf16_input=(bf16_outputs and label == "attn.c_proj") or bf16_input(g))
    s.add("other", "backward", "encoder backward", F32 * (N * C + N + 2 * N * C + 2 * T * C))

    # Optimizer, once a step.
    weights = sum(g["in_features"] * g["out_features"] * g["layers"] for g in m["linears"])
    s.add("other", "optimizer", "zero the gradients but the linear layers' weights", F32 * (P - weights))
    # Weight gradients stored in bf16: 2 bytes an element read less by the norm and by AdamW.
    bf16_gradients = sum(g["in_features"] * g["out_features"] * g["layers"] for g in m["linears"]
                         if bf16_weight_gradient(m, g))
    s.add("optimizer", "optimizer", "gradient norm", F32 * P - 2 * bf16_gradients)
    s.add("optimizer", "optimizer", "AdamW", 7 * F32 * P - 2 * bf16_gradients)
    for g in m["linears"]:
        elements = g["in_features"] * g["out_features"] * g["layers"]
        f, ig = g["forward"], g["input_gradient"]
        if "fp8" in (f, ig):
            per_element = 2 if s.producer_fused else s.amax_read + F32 + 2
            s.add("optimizer", "optimizer", f"{g['linear']} FP8 weight copy", per_element * elements)
        wide = f if f != "fp8" else ig
        if wide in ("bf16", "f16"):
            # A layer without FP8 GEMMs gets its BF16 copy from the AdamW pass (adamw_update_convert).
            in_adamw = wide == "bf16" and "fp8" not in (f, ig)
            s.add("optimizer", "optimizer", f"{g['linear']} {wide} weight copy", (2 if in_adamw else F32 + 2) * elements)
    return s.ops


# ---------------------------------------------------------------------------------------------------------
# Rates.

def read_gemm_file(path):
    """Rows (M, N, K, {kind key: TFLOP/s}), the copy bandwidth or None, the device name, and how cuBLASLt's
    algorithms were chosen ("heuristic" or "timed"; files from before the choice existed are "heuristic")."""
    with open(path) as f:
        text = f.read()
    if text.lstrip().startswith("{"):
        j = json.loads(text)
        if j.get("benchmark") != "gemm":
            raise Refusal(f"{path}: not the JSON of `octet bench gemm --json`")
        rows = []
        for r in j["rows"]:
            rates = {k: v["tflops"] for k, v in r["results"].items() if "tflops" in v and v["tflops"] > 0}
            rows.append((r["M"], r["N"], r["K"], rates))
        bandwidth = (j.get("memory_bandwidth") or {}).get("copy_gbs")
        return rows, bandwidth, j.get("device", {}).get("name", "?"), j.get("gemm_algorithms", "heuristic")
    # The Markdown table `octet bench gemm` prints: | shape | M | N | K | e4m3 | ... | fp8/bf16 |
    rows, columns = [], None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 4 and cells[:4] == ["shape", "M", "N", "K"]:
            columns = [GEMM_HEADINGS.get(c) for c in cells[4:]]
            continue
        if columns is None or len(cells) != 4 + len(columns) or not cells[1].isdigit():
            if columns is not None and not line.strip().startswith("|"):
                columns = None  # the table ended
            continue
        rates = {}
        for key, cell in zip(columns, cells[4:]):
            if key is not None and cell not in ("-", ""):
                rates[key] = float(cell)
        rows.append((int(cells[1]), int(cells[2]), int(cells[3]), rates))
    if not rows:
        raise Refusal(f"{path}: neither the JSON nor the table of `octet bench gemm`")
    found = re.search(r"TFLOP/s on (.+?) \(compute capability", text)
    algorithms = "timed" if "cuBLASLt algorithms: timed" in text else "heuristic"
    return rows, None, found.group(1) if found else "?", algorithms


class Rates:
    def __init__(self, gemm_files, args):
        self.files = gemm_files
        self.rows, self.devices, self.algorithms, bandwidths = [], [], set(), []
        for path in gemm_files:
            rows, bandwidth, device, algorithms = read_gemm_file(path)
            self.rows += rows
            self.devices.append(device)
            self.algorithms.add(algorithms)
            if bandwidth:
                bandwidths.append(bandwidth)
        self.override = {"fp8": args.fp8_tflops, "bf16": args.bf16_tflops, "tf32": args.tf32_tflops}
        if args.bandwidth_gbs is not None:
            self.bandwidth, self.bandwidth_source = args.bandwidth_gbs, "given (--bandwidth-gbs)"
        elif bandwidths:
            self.bandwidth, self.bandwidth_source = max(bandwidths), "measured copy (octet bench gemm)"
        else:
            raise Refusal("no memory bandwidth: pass the JSON of an `octet bench gemm` that measures it, or "
                          "--bandwidth-gbs")
        self.matched = set()  # kind keys some GEMM found its own shape's rate of
        self.fallbacks = set()  # kind keys some GEMM took the fastest shape's rate of

    def family(self, key):
        return "fp8" if key.startswith("e4m3") else key

    def best(self, key):
        rates = [r[3][key] for r in self.rows if key in r[3]]
        if not rates:
            raise Refusal(f"no {key} GEMM rate: pass `octet bench gemm` results with {key} measured, or "
                          f"--{self.family(key)}-tflops")
        return max(rates)

    def gemm(self, key, M, N, K):
        given = self.override[self.family(key)]
        if given is not None:
            return given
        for r in self.rows:
            if (r[0], r[1], r[2]) == (M, N, K) and key in r[3]:
                self.matched.add(key)
                return r[3][key]
        self.fallbacks.add(key)
        return self.best(key)

    def attention(self, tensor_cores):
        key = "bf16" if tensor_cores else "tf32"
        given = self.override[key]
        return given if given is not None else self.best(key)

    def tflops(self, rate):
        return self.gemm(*rate[1:]) if rate[0] == "gemm" else self.attention(rate[1])

    def notes(self, used, train_algorithms):
        """Where the rates of the kinds in `used` (and of attention) came from; `train_algorithms`: how the
        result's run chose its GEMM algorithms."""
        notes = []
        given = [f"{family.upper()} {v:g} TFLOP/s" for family, v in self.override.items() if v is not None]
        if given:
            notes.append("rates given: " + ", ".join(given))
        if self.matched:
            notes.append(f"GEMM rates ({', '.join(sorted(self.matched))}) measured for the GEMM's own shape in "
                         f"{', '.join(self.files)} ({', '.join(sorted(set(self.devices)))}; cuBLASLt "
                         f"algorithms: {', '.join(sorted(self.algorithms))})")
            if self.algorithms != {train_algorithms}:
                notes.append(f"the run chose its GEMM algorithms otherwise ({train_algorithms}): its GEMMs may "
                             f"run above or below these rates")
        for key in sorted(self.fallbacks):
            notes.append(f"{key}: shapes not measured take the highest {key} rate measured "
                         f"({self.best(key):.1f} TFLOP/s)")
        for key in sorted(k for k in used if k in ("attention bf16", "attention tf32")):
            family = key.split()[1]
            rate = self.attention(family == "bf16")
            where = "given" if self.override[family] is not None else f"the highest {family} rate measured"
            if family == "tf32":
                notes.append(f"attention runs in float32 here: at the TF32 rate, {where} ({rate:.1f} TFLOP/s), "
                             f"its floor is a lower bound")
            elif self.override[family] is None:
                notes.append(f"attention: {where} ({rate:.1f} TFLOP/s)")
        return notes


# ---------------------------------------------------------------------------------------------------------
# Tables.

def floors(train, source, rates):
    m = model_of(train, source)
    ops = step_ops(m)
    rates.matched, rates.fallbacks = set(), set()
    for op in ops:
        tflops = rates.tflops(op["rate"]) if op["rate"] else None
        compute_ms = op["flops"] / (tflops * 1e12) * 1e3 if tflops else 0.0
        memory_ms = op["bytes"] / (rates.bandwidth * 1e9) * 1e3
        op["tflops"] = tflops
        op["floor_ms"] = op["count"] * max(compute_ms, memory_ms)
        op["compute_bound"] = compute_ms >= memory_ms
    measured = {}
    by_name = {name: key for key, name in KINDS}
    for k in ((train.get("phases") or {}).get("device_ms_by_kind") or []):
        key = by_name.get(k["kind"])
        if key is None:
            raise Refusal(f"{source}: unknown kind of op {k['kind']!r}")
        for phase in PHASES:
            measured[(key, phase)] = k[f"{phase}_ms"]
    rows = []
    for key, name in KINDS:
        for phase in PHASES:
            mine = [op for op in ops if op["kind"] == key and op["phase"] == phase]
            floor_ms = sum(op["floor_ms"] for op in mine)
            got = measured.get((key, phase))
            if floor_ms == 0.0 and not got:
                continue
            compute_ms = sum(op["floor_ms"] for op in mine if op["compute_bound"])
            rows.append({"kind": name, "phase": phase,
                         "gflop": sum(op["count"] * op["flops"] for op in mine) / 1e9,
                         "gb": sum(op["count"] * op["bytes"] for op in mine) / 1e9,
                         "floor_ms": floor_ms, "measured_ms": got,
                         "bound": "compute" if compute_ms > floor_ms / 2 else "memory"})
    total = {"gflop": sum(r["gflop"] for r in rows), "gb": sum(r["gb"] for r in rows),
             "floor_ms": sum(r["floor_ms"] for r in rows),
             "measured_ms": sum(r["measured_ms"] for r in rows) if measured else None}
    for r in rows + [total]:
        r["measured_over_floor"] = (r["measured_ms"] / r["floor_ms"]
                                    if r["measured_ms"] is not None and r["floor_ms"] > 0 else None)
    used = {op["rate"][1] if op["rate"][0] == "gemm" else "attention " + ("bf16" if op["rate"][1] else "tf32")
            for op in ops if op["rate"]}
    notes = list(m["notes"]) + rates.notes(used, train.get("gemm_algorithms", "heuristic"))
    op_rows = {}
    for op in ops:
        o = op_rows.setdefault((op["kind"], op["phase"], op["name"]),
                               {"kind": KIND_NAMES[op["kind"]], "phase": op["phase"], "op": op["name"],
                                "count": 0, "gflop": 0.0, "gb": 0.0, "floor_ms": 0.0, "tflops": op["tflops"]})
        o["count"] += op["count"]
        o["gflop"] += op["count"] * op["flops"] / 1e9
        o["gb"] += op["count"] * op["bytes"] / 1e9
        o["floor_ms"] += op["floor_ms"]
    device = (train.get("device") or {}).get("name", "?")
    return {"source": source, "model": train.get("model", ""), "mode": m["mode"], "device": device,
            "batch_size": m["batch_size"], "seq_len": m["seq_len"], "grad_accum_steps": m["grad_accum_steps"],
            "ms_per_step": train.get("ms_per_step"), "bandwidth_gbs": rates.bandwidth,
            "bandwidth_from": rates.bandwidth_source, "notes": notes, "rows": rows, "total": total,
            "ops": list(op_rows.values())}


def number(v, digits):
    return "-" if v is None else f"{v:.{digits}f}"


def table_rows(result):
    out = []
    for r in result["rows"] + [dict(result["total"], kind="total", phase="", bound="")]:
        ratio = r["measured_over_floor"]
        out.append([r["kind"], r["phase"], number(r["gflop"], 1) if r["gflop"] else "-", number(r["gb"], 2),
                    number(r["floor_ms"], 2), number(r["measured_ms"], 2),
                    "-" if ratio is None else f"{ratio:.1f}x", r["bound"]])
    return out


HEADINGS = ["kind of op", "phase", "GFLOP", "GB", "floor ms", "measured ms", "measured/floor", "bound"]


def heading(result):
    return (f"{result['model']}; {result['mode']}, batch {result['batch_size']} x {result['seq_len']}"
            + (f" x {result['grad_accum_steps']} micro-batches" if result["grad_accum_steps"] > 1 else "")
            + (f": {result['ms_per_step']:.1f} ms/step timed" if result["ms_per_step"] else "")
            + f" ({result['device']}); memory bandwidth {result['bandwidth_gbs']:.0f} GB/s, "
            f"{result['bandwidth_from']}")


def print_markdown(results):
    for result in results:
        print(heading(result))
        print()
        print("| " + " | ".join(HEADINGS) + " |")
        print("|" + "---|" * len(HEADINGS))
        for cells in table_rows(result):
            print("| " + " | ".join(cells) + " |")
        if result["notes"]:
            print("\nNotes:\n")
        for note in result["notes"]:
            print(f"- {note}.")
        print()


def print_text(results):
    for result in results:
        print(heading(result))
        rows = [HEADINGS] + table_rows(result)
        widths = [max(len(r[i]) for r in rows) for i in range(len(HEADINGS))]
        for r in rows:
            print("  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        for note in result["notes"]:
            print(f"  note: {note}")
        print()


def main(argv):
    parser = argparse.ArgumentParser(
        description="Floors of a GPT-2 training step per kind of op and phase (FLOPs over the GEMM rate, "
                    "bytes over the memory bandwidth), next to the measured device time.")
    parser.add_argument("train", nargs="+", help="`octet bench train --json` results")
    parser.add_argument("--gemm", action="append", default=[],
                        help="`octet bench gemm` result: its JSON or its Markdown table (repeatable)")
    parser.add_argument("--fp8-tflops", type=float, help="rate of every FP8 GEMM, TFLOP/s")
    parser.add_argument("--bf16-tflops", type=float, help="rate of every BF16/FP16 GEMM and of attention")
    parser.add_argument("--tf32-tflops", type=float, help="rate of every float32 GEMM (TF32)")
    parser.add_argument("--bandwidth-gbs", type=float, help="device memory bandwidth, GB/s")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--markdown", action="store_true", help="Markdown tables")
    output.add_argument("--json", action="store_true", help="one JSON object, with every op's floor")
    args = parser.parse_args(argv)
    for name in ("fp8_tflops", "bf16_tflops", "tf32_tflops", "bandwidth_gbs"):
        v = getattr(args, name)
        if v is not None and not (v > 0 and math.isfinite(v)):
            parser.error(f"--{name.replace('_', '-')} must be a positive number, got {v}")
    try:
        rates = Rates(args.gemm, args)
        results = []
        for path in args.train:
            with open(path) as f:
                results.append(floors(json.load(f), path, rates))
    except (Refusal, OSError, ValueError, KeyError) as e:
        message = f"missing key {e}" if isinstance(e, KeyError) else str(e)
        print(f"floors.py: error: {message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"results": results}, indent=2))
    elif args.markdown:
        print_markdown(results)
    else:
        print_text(results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
