"""PyTorch reference for octet's GPT-2 golden test (tests/golden/test_gpt2_golden.cpp).

The model is written out plainly in float32 torch ops, independent of octet: token and position embeddings,
pre-LayerNorm blocks (causal self-attention, tanh-GELU MLP), a final LayerNorm and an LM head tied to the
token embedding, cross-entropy over the first V of the Vp logits. Gradients come from autograd, the
optimizer is torch.optim.AdamW with weight decay on 2-D parameters only (golden_exchange.py, which also
documents the two files).

  gpt2_reference.py INPUT OUTPUT

Exit status 0 on success, 77 when torch is not importable, 1 on any other error.
"""
import math
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch is not importable: skipped")
    sys.exit(77)

import golden_exchange  # noqa: E402 (needs torch)

LAYERNORM_EPS = 1e-5


def expected_shapes(cfg):
    """Every parameter octet must have, with its shape; names and shapes follow nanoGPT's GPT-2."""
    Vp, maxT, L, C = cfg["Vp"], cfg["maxT"], cfg["L"], cfg["C"]
    if cfg["KV"] != cfg["NH"] or cfg["F"] != 4 * C or not cfg["tied"]:
        raise ValueError(f"GPT-2 has KV = NH, F = 4C and a tied head, got {cfg}")
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


if __name__ == "__main__":
    sys.exit(golden_exchange.main("gpt2", expected_shapes, forward, lambda cfg: "wte"))
