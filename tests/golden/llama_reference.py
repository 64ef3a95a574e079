"""PyTorch reference for octet's Llama golden test (tests/golden/test_llama_golden.cpp).

The model is written out plainly in float32 torch ops, independent of octet and of Hugging Face's code but
following its LlamaForCausalLM: a token embedding without positions, pre-RMSNorm blocks (causal self-attention
with the rotary embedding in Hugging Face's rotate-half convention and grouped-query attention, a SwiGLU MLP),
no biases, a final RMSNorm and an LM head, untied or tied to the embedding, cross-entropy over the first V of
the Vp logits. The mixture-of-experts variant (Mixtral's block) replaces the MLP with a softmax router whose
k most probable experts' SwiGLU MLPs are summed, weighted by their probabilities renormalized over the k, plus
an optional shared expert that every token runs; each layer adds coef x E x sum_e f_e P_e to the training loss
(f_e the share of assignments expert e took, a constant; P_e its mean probability). Every expert runs on
every token here and the unchosen ones are weighted by zero: plain, and independent of octet's grouping.
torch 1.13 has neither F.rms_norm nor grouped-query attention in its fused attention, so both
are written out. Gradients come from autograd, the optimizer is torch.optim.AdamW with weight decay on 2-D
parameters only (golden_exchange.py, which also documents the two files).

  llama_reference.py INPUT OUTPUT

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

RMSNORM_EPS = 1e-5


def expected_shapes(cfg):
    """Every parameter octet must have, with its shape; names follow LlamaForCausalLM without "model."."""
    Vp, L, C, F_, NH, KV = cfg["Vp"], cfg["L"], cfg["C"], cfg["F"], cfg["NH"], cfg["KV"]
    if NH % KV != 0:
        raise ValueError(f"{KV} key and value heads do not divide {NH} heads")
    kv_C = KV * (C // NH)
    shapes = {"embed_tokens.weight": [Vp, C]}
    for l in range(L):
        h = f"layers.{l}."
        shapes.update({
            h + "input_layernorm.weight": [C],
            h + "self_attn.q_proj.weight": [C, C],
            h + "self_attn.k_proj.weight": [kv_C, C],
            h + "self_attn.v_proj.weight": [kv_C, C],
            h + "self_attn.o_proj.weight": [C, C],
            h + "post_attention_layernorm.weight": [C],
        })
        mlps = [h + "mlp."]
        if cfg["E"] > 0:
            shapes[h + "mlp.gate.weight"] = [cfg["E"], C]
            mlps = [f"{h}mlp.experts.{e}." for e in range(cfg["E"])]
            if cfg["shared"]:
                mlps.append(h + "mlp.shared_expert.")
        for m in mlps:
            shapes.update({m + "gate_proj.weight": [F_, C], m + "up_proj.weight": [F_, C],
                           m + "down_proj.weight": [C, F_]})
    shapes["norm.weight"] = [C]
    if not cfg["tied"]:
        shapes["lm_head.weight"] = [Vp, C]
    return shapes


def head_name(cfg):
    return "embed_tokens.weight" if cfg["tied"] else "lm_head.weight"


def rms_norm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMSNORM_EPS) * weight


def rotary_cos_sin(T, hs, theta):
    """As Hugging Face's LlamaRotaryEmbedding computes them in float32: [T, hs] each, the angles repeated
    over both halves."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    angles = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]  # [T, hs/2]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def causal_self_attention(x, p, prefix, cfg, cos, sin):
    B, T, C = x.shape
    NH, KV = cfg["NH"], cfg["KV"]
    hs = C // NH
    q = F.linear(x, p[prefix + "q_proj.weight"]).view(B, T, NH, hs).transpose(1, 2)  # [B, NH, T, hs]
    k = F.linear(x, p[prefix + "k_proj.weight"]).view(B, T, KV, hs).transpose(1, 2)  # [B, KV, T, hs]
    v = F.linear(x, p[prefix + "v_proj.weight"]).view(B, T, KV, hs).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    # Grouped-query attention: query head h reads key and value head h // (NH / KV).
    k = k.repeat_interleave(NH // KV, dim=1)
    v = v.repeat_interleave(NH // KV, dim=1)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    y = F.softmax(scores, dim=-1) @ v  # [B, NH, T, hs]
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    return F.linear(y, p[prefix + "o_proj.weight"])


def swiglu_mlp(x, p, prefix):
    gate = F.linear(x, p[prefix + "gate_proj.weight"])
    up = F.linear(x, p[prefix + "up_proj.weight"])
    return F.linear(F.silu(gate) * up, p[prefix + "down_proj.weight"])


def mixture_of_experts(x, p, prefix, cfg):
    """The MLP's output [B, T, C] and this layer's balance loss."""
    E, k = cfg["E"], cfg["k"]
    probs = F.softmax(F.linear(x, p[prefix + "gate.weight"]), dim=-1)  # [B, T, E]
    top, chosen = probs.topk(k, dim=-1)  # the k largest, largest first
    weights = top / top.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(E):
        weight = (weights * (chosen == e)).sum(dim=-1, keepdim=True)  # zero where e was not chosen
        out = out + weight * swiglu_mlp(x, p, f"{prefix}experts.{e}.")
    if cfg["shared"]:
        out = out + swiglu_mlp(x, p, prefix + "shared_expert.")
    share = torch.stack([(chosen == e).sum() for e in range(E)]).float() / chosen.numel()
    balance = E * (share * probs.reshape(-1, E).mean(dim=0)).sum()
    return out, balance


def forward(cfg, p, tokens, targets):
    """Returns the logits [B*T, Vp], the final RMSNorm's output [B*T, C], the mean loss and the balance
    loss training adds (zero without experts)."""
    B, T = tokens.shape
    C, V = cfg["C"], cfg["V"]
    cos, sin = rotary_cos_sin(T, C // cfg["NH"], cfg["rope_theta"])
    x = p["embed_tokens.weight"][tokens]
    balance = torch.zeros(())
    for l in range(cfg["L"]):
        h = f"layers.{l}."
        x = x + causal_self_attention(rms_norm(x, p[h + "input_layernorm.weight"]), p, h + "self_attn.", cfg,
                                      cos, sin)
        normed = rms_norm(x, p[h + "post_attention_layernorm.weight"])
        if cfg["E"] > 0:
            out, layer_balance = mixture_of_experts(normed, p, h + "mlp.", cfg)
            x = x + out
            balance = balance + layer_balance
        else:
            x = x + swiglu_mlp(normed, p, h + "mlp.")
    final = rms_norm(x, p["norm.weight"]).view(B * T, C)
    logits = final @ p[head_name(cfg)].t()  # [B*T, Vp]
    loss = F.cross_entropy(logits[:, :V], targets.reshape(B * T))  # padded columns take no part
    return logits, final, loss, cfg["aux_coef"] * balance


if __name__ == "__main__":
    sys.exit(golden_exchange.main("llama", expected_shapes, forward, head_name))
