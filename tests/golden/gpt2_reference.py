#!/usr/bin/env python3
"""PyTorch reference for octet's GPT-2 golden test (tests/golden/test_gpt2_golden.cpp).

The model is written out plainly in float32 torch ops, independent of octet: token and position embeddings,
pre-LayerNorm blocks (causal self-attention, tanh-GELU MLP), a final LayerNorm and an LM head tied to the
token embedding, cross-entropy over the first V of the Vp logits. Gradients come from autograd, the
optimizer is torch.optim.AdamW with weight decay on 2-D parameters only.

  gpt2_reference.py INPUT OUTPUT

Exit status 0 on success, 77 when torch is not importable, 1 on any other error.

Both files are little-endian. INPUT (written by the C++ test):
  char[8]  "OCTGPT2I"
  int32    version (1)
  int32    V, Vp, maxT, L, NH, C, B, T, steps, parameter_count
  float32  learning_rate, beta1, beta2, eps, weight_decay
  int32    tokens[B*T], targets[B*T]
  then parameter_count tensors in octet's Gpt2::parameters() order, each:
    int32 name_length, char name[name_length] (ASCII), int32 ndim, int32 shape[ndim],
    float32 values[prod(shape)] (row-major; linear weights [out_features, in_features])

OUTPUT (read by the C++ test):
  char[8]  "OCTGPT2O"
  int32    version (1)
  int32    N (= B*T), Vp, parameter_count, steps
  float32  logits[N*Vp]            before the first update, padded columns included
  float32  logit_magnitude[N*Vp]   sum_c |ln_f(x)[n,c]| * |wte[v,c]| (float64, then rounded): the scale of
                                   each logit's rounding error, for the comparator
  float32  loss                    before the first update
  then parameter_count gradient tensors, same record layout and order as the input's parameters
  float32  step_losses[steps]      the loss of each AdamW step, taken before its update
"""
import math
import struct
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch is not importable: skipped")
    sys.exit(77)

INPUT_MAGIC = b"OCTGPT2I"
OUTPUT_MAGIC = b"OCTGPT2O"
VERSION = 1
LAYERNORM_EPS = 1e-5


class Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, n):
        if self.pos + n > len(self.data):
            raise ValueError(f"input ends at byte {len(self.data)}, need {self.pos + n}")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def ints(self, n):
        return list(struct.unpack(f"<{n}i", self.take(4 * n)))

    def floats(self, n):
        return list(struct.unpack(f"<{n}f", self.take(4 * n)))

    def int_tensor(self, n):
        return torch.frombuffer(bytearray(self.take(4 * n)), dtype=torch.int32).clone()

    def float_tensor(self, shape):
        n = math.prod(shape)
        return torch.frombuffer(bytearray(self.take(4 * n)), dtype=torch.float32).clone().view(shape)


def read_input(path):
    with open(path, "rb") as f:
        r = Reader(f.read())
    if r.take(8) != INPUT_MAGIC:
        raise ValueError(f"{path}: not an octet golden input (bad magic)")
    (version,) = r.ints(1)
    if version != VERSION:
        raise ValueError(f"{path}: version {version}, expected {VERSION}")
    V, Vp, maxT, L, NH, C, B, T, steps, count = r.ints(10)
    cfg = dict(V=V, Vp=Vp, maxT=maxT, L=L, NH=NH, C=C, B=B, T=T, steps=steps)
    lr, beta1, beta2, eps, weight_decay = r.floats(5)
    hyper = dict(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    tokens = r.int_tensor(B * T).view(B, T).long()
    targets = r.int_tensor(B * T).view(B, T).long()
    params = {}  # insertion order is octet's parameter order
    for _ in range(count):
        (name_length,) = r.ints(1)
        name = r.take(name_length).decode("ascii")
        (ndim,) = r.ints(1)
        shape = r.ints(ndim)
        params[name] = r.float_tensor(shape)
    if r.pos != len(r.data):
        raise ValueError(f"{path}: {len(r.data) - r.pos} bytes after the last parameter")
    return cfg, hyper, tokens, targets, params


def expected_shapes(cfg):
    """Every parameter octet must have, with its shape; names and shapes follow nanoGPT's GPT-2."""
    Vp, maxT, L, C = cfg["Vp"], cfg["maxT"], cfg["L"], cfg["C"]
    shapes = {"wte": [Vp, C], "wpe": [maxT, C]}
    for l in range(L):
        h = f"h.{l}."
        shapes.update({
            h + "ln_1.weight": [C], h + "ln_1.bias": [C],
            h + "attn.c_attn.weight": [3 * C, C], h + "attn.c_attn.bias": [3 * C],
            h + "attn.c_proj.weight": [C, C], h + "attn.c_proj.bias": [C],
            h + "ln_2.weight": [C], h + "ln_2.bias": [C],
            h + "mlp.c_fc.weight": [4 * C, C], h + "mlp.c_fc.bias": [4 * C],
            h + "mlp.c_proj.weight": [C, 4 * C], h + "mlp.c_proj.bias": [C],
        })
    shapes.update({"ln_f.weight": [C], "ln_f.bias": [C]})
    return shapes


def check_parameters(cfg, params):
    expected = expected_shapes(cfg)
    missing = [n for n in expected if n not in params]
    unknown = [n for n in params if n not in expected]
    if missing or unknown:
        raise ValueError(f"parameter names differ from GPT-2's: missing {missing}, unexpected {unknown}")
    for name, shape in expected.items():
        if list(params[name].shape) != shape:
            raise ValueError(f"{name}: shape {list(params[name].shape)}, expected {shape}")


def causal_self_attention(x, p, prefix, NH):
    B, T, C = x.shape
    hs = C // NH
    qkv = F.linear(x, p[prefix + "c_attn.weight"], p[prefix + "c_attn.bias"])
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, NH, hs).transpose(1, 2)  # [B, NH, T, hs]
    k = k.view(B, T, NH, hs).transpose(1, 2)
    v = v.view(B, T, NH, hs).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    y = F.softmax(scores, dim=-1) @ v  # [B, NH, T, hs]
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    return F.linear(y, p[prefix + "c_proj.weight"], p[prefix + "c_proj.bias"])


def forward(cfg, p, tokens, targets):
    """Returns the logits [B*T, Vp], the final LayerNorm's output [B*T, C] and the mean loss."""
    B, T = tokens.shape
    C, V = cfg["C"], cfg["V"]
    x = p["wte"][tokens] + p["wpe"][:T]
    for l in range(cfg["L"]):
        h = f"h.{l}."
        ln = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], LAYERNORM_EPS)
        x = x + causal_self_attention(ln, p, h + "attn.", cfg["NH"])
        ln = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], LAYERNORM_EPS)
        hidden = F.gelu(F.linear(ln, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + F.linear(hidden, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])
    final = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], LAYERNORM_EPS).view(B * T, C)
    logits = final @ p["wte"].t()  # [B*T, Vp], tied LM head
    loss = F.cross_entropy(logits[:, :V], targets.reshape(B * T))  # padded columns take no part
    return logits, final, loss


def write_tensor_record(f, name, values):
    encoded = name.encode("ascii")
    f.write(struct.pack("<i", len(encoded)))
    f.write(encoded)
    f.write(struct.pack(f"<i{values.dim()}i", values.dim(), *values.shape))
    f.write(values.detach().contiguous().to(torch.float32).numpy().astype("<f4").tobytes())


def main():
    if len(sys.argv) != 3:
        print("usage: gpt2_reference.py INPUT OUTPUT", file=sys.stderr)
        return 1
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    cfg, hyper, tokens, targets, params = read_input(sys.argv[1])
    check_parameters(cfg, params)
    if cfg["steps"] < 1:
        raise ValueError(f"steps is {cfg['steps']}, need at least 1 (step 0 gives logits and gradients)")
    for t in params.values():
        t.requires_grad_(True)

    decay = [t for t in params.values() if t.dim() == 2]
    no_decay = [t for t in params.values() if t.dim() != 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": hyper["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=hyper["lr"], betas=hyper["betas"], eps=hyper["eps"], foreach=False)

    step_losses = []
    for step in range(cfg["steps"]):
        optimizer.zero_grad(set_to_none=False)
        logits, final, loss = forward(cfg, params, tokens, targets)
        loss.backward()
        if step == 0:  # the state octet compares before any update
            first_logits = logits.detach().clone()
            with torch.no_grad():
                magnitude = final.double().abs() @ params["wte"].double().abs().t()
            first_loss = loss.item()
            first_grads = {name: t.grad.detach().clone() for name, t in params.items()}
        step_losses.append(loss.item())
        optimizer.step()

    N, Vp = first_logits.shape
    with open(sys.argv[2], "wb") as f:
        f.write(OUTPUT_MAGIC)
        f.write(struct.pack("<5i", VERSION, N, Vp, len(params), cfg["steps"]))
        f.write(first_logits.numpy().astype("<f4").tobytes())
        f.write(magnitude.numpy().astype("<f4").tobytes())
        f.write(struct.pack("<f", first_loss))
        for name, grad in first_grads.items():
            write_tensor_record(f, name, grad)
        f.write(struct.pack(f"<{len(step_losses)}f", *step_losses))
    print(f"torch {torch.__version__}: loss {first_loss:.7f} -> {step_losses[-1]:.7f} over {cfg['steps']} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
