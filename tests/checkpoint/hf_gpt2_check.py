"""Checks an octet model.safetensors against Hugging Face GPT-2's names, shapes and Conv1D layout.

Usage: hf_gpt2_check.py MODEL_SAFETENSORS TOKENS_CSV OCTET_LOGITS_F32 
Reads the file with a small parser (json + struct, no safetensors package), checks every name and shape a
GPT2LMHeadModel state dict has (lm_head tied, not stored), runs GPT-2's forward written out in torch with
Conv1D semantics (y = x @ W + b), and compares the logits with octet's. Exit code 0 when all agree.
"""
import json
import math
import struct
import sys

import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    metadata = header.pop("__metadata__", {})
    data = raw[8 + n :]
    tensors = {}
    for name, entry in header.items():
        assert entry["dtype"] == "F32", (name, entry["dtype"])
        begin, end = entry["data_offsets"]
        values = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        tensors[name] = values.reshape(entry["shape"])
    return tensors, metadata


def expected_shapes(n_layer, n_embd, vocab_size, n_positions):
    C = n_embd
    shapes = {"transformer.wte.weight": [vocab_size, C], "transformer.wpe.weight": [n_positions, C]}
    for i in range(n_layer):
        h = f"transformer.h.{i}."
        shapes.update({
            h + "ln_1.weight": [C], h + "ln_1.bias": [C],
            h + "attn.c_attn.weight": [C, 3 * C], h + "attn.c_attn.bias": [3 * C],
            h + "attn.c_proj.weight": [C, C], h + "attn.c_proj.bias": [C],
            h + "ln_2.weight": [C], h + "ln_2.bias": [C],
            h + "mlp.c_fc.weight": [C, 4 * C], h + "mlp.c_fc.bias": [4 * C],
            h + "mlp.c_proj.weight": [4 * C, C], h + "mlp.c_proj.bias": [C],
        })
    shapes.update({"transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]})
    return shapes


def forward(w, tokens, n_layer, n_head):
    def conv1d(x, name):
        return x @ w[name + ".weight"] + w[name + ".bias"]

    def layer_norm(x, name):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], w[name + ".weight"], w[name + ".bias"], 1e-5)

    T = len(tokens)
    x = w["transformer.wte.weight"][tokens] + w["transformer.wpe.weight"][:T]
    C = x.shape[-1]
    hs = C // n_head
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(n_layer):
        h = f"transformer.h.{i}."
        q, k, v = conv1d(layer_norm(x, h + "ln_1"), h + "attn.c_attn").split(C, dim=-1)
        q, k, v = (t.reshape(T, n_head, hs).transpose(0, 1) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + conv1d(y, h + "attn.c_proj")
        m = torch.nn.functional.gelu(conv1d(layer_norm(x, h + "ln_2"), h + "mlp.c_fc"), approximate="tanh")
        x = x + conv1d(m, h + "mlp.c_proj")
    x = layer_norm(x, "transformer.ln_f")
    return x @ w["transformer.wte.weight"].T  # lm_head tied to wte


def main():
    path, tokens_csv, logits_path = sys.argv[1:4]
    tensors, metadata = read_safetensors(path)
    config = json.loads(metadata["config"])
    shapes = expected_shapes(config["n_layer"], config["n_embd"], config["vocab_size"], config["n_positions"])
    names_ok = set(tensors) == set(shapes)
    if not names_ok:
        print("names differ: missing", sorted(set(shapes) - set(tensors)), "extra", sorted(set(tensors) - set(shapes)))
        return 1
    for name, shape in shapes.items():
        if list(tensors[name].shape) != shape:
            print(f"{name}: shape {list(tensors[name].shape)}, GPT-2 has {shape}")
            return 1
    tokens = [int(t) for t in tokens_csv.split(",")]
    with torch.no_grad():
        logits = forward(tensors, tokens, config["n_layer"], config["n_head"])
    with open(logits_path, "rb") as f:
        octet = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(logits.shape)
    # float32 both sides, differing only in summation order over reductions of at most 4C terms.
    scale = float(octet.abs().max())
    error = float((logits - octet).abs().max())
    print(f"max |logit| {scale:.4g}, max difference {error:.3g}")
    if not scale > 0 or not error <= 1e-5 * max(scale, 1.0) * 4 * config["n_embd"] ** 0.5:
        print("logits differ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
