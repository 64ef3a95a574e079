#!/usr/bin/env python3
# Copied from the shared peers/torch_gpt2.py that measured the PyTorch anchor figures (docs/benchmarks.md), so
# that bench/compare.sh and the GPU bundle carry it; only these two lines differ. Keep the two in step.
"""Peer for side-by-side throughput: a GPT-2 trained with PyTorch the way a user would (bf16 autocast,
float32 master weights, torch.compile, SDPA flash attention, fused AdamW). Run it on a GPU machine with
PyTorch, in the same run as octet's own benchmark, so that both see the same GPU.

  python3 ../shared/peers/torch_gpt2.py --preset gpt2-124M
  python3 ../shared/peers/torch_gpt2.py --layers 12 --width 768 --heads 12 --batch 32 --seq 1024

Prints one JSON line: tokens/s, ms/step, peak memory. If torchao is importable, --fp8 converts the Linear
layers with torchao's float8 tensorwise recipe (the lm_head is excluded)."""
import argparse, json, time
import torch, torch.nn as nn, torch.nn.functional as F

PRESETS = {"gpt2-124M": (12, 768, 12, 32), "gpt2-350M": (24, 1024, 16, 16), "gpt2-1.5B": (48, 1600, 25, 8)}


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, H, V, T):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / (2 * L) ** 0.5 if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.lnf(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=PRESETS)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--fp8", action="store_true")
    a = ap.parse_args()
    if a.preset:
        a.layers, a.width, a.heads, a.batch = PRESETS[a.preset]
    torch.manual_seed(0)
    model = GPT(a.layers, a.width, a.heads, a.vocab, a.seq).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    if a.fp8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"),
                                   module_filter_fn=lambda m, fqn: fqn != "lm_head")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    compiled = torch.compile(model)
    x = torch.randint(0, 50257, (a.batch, a.seq), device="cuda")
    y = torch.randint(0, 50257, (a.batch, a.seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / a.steps
    print(json.dumps({"peer": "pytorch", "mode": "fp8-torchao" if a.fp8 else "bf16", "layers": a.layers,
                      "width": a.width, "params_M": round(n_params / 1e6, 1), "batch": a.batch, "seq": a.seq,
                      "ms_per_step": round(dt * 1e3, 2), "tokens_per_s": round(a.batch * a.seq / dt),
                      "peak_mem_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                      "loss": round(loss.item(), 4)}), flush=True)


if __name__ == "__main__":
    main()
