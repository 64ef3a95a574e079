"""Checks a directory written by `octet export --format hf|hf-fp8` against the state dict transformers builds
from its config.json (GPT-2, Llama or Mixtral): every name, shape and dtype (F32, or F8_E4M3 with F32 weight_scale_inv of the 128x128
block grid under quantization_config), nothing missing, nothing extra, every float finite.

Usage: check_hf_export.py DIR. Uses the safetensors package when it is installed, else reads the header with
json and struct (torch 1.13 has no float8 dtype). Exit code 0 when all agree.
"""
import json
import math
import struct
import sys


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
        data = f.read()
    h.pop("__metadata__", None)
    return h, data


def expected(config):
    shapes = {}
    if config["model_type"] == "gpt2":
        C, V, P = config["n_embd"], config["vocab_size"], config["n_positions"]
        shapes.update({"transformer.wte.weight": [V, C], "transformer.wpe.weight": [P, C],
                       "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]})
        for i in range(config["n_layer"]):
            h = f"transformer.h.{i}."
            for norm in ("ln_1", "ln_2"):
                shapes[h + norm + ".weight"] = [C]
                shapes[h + norm + ".bias"] = [C]
            for name, (i_, o) in {"attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "mlp.c_fc": (C, 4 * C),
                                  "mlp.c_proj": (4 * C, C)}.items():
                shapes[h + name + ".weight"] = [i_, o]  # Conv1D: [in, out]
                shapes[h + name + ".bias"] = [o]
        return shapes, set()
    C, F, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd = config["head_dim"]
    kv = config["num_key_value_heads"] * hd
    shapes.update({"model.embed_tokens.weight": [V, C], "model.norm.weight": [C]})
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = [V, C]
    linear = set()
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = [C]
        shapes[p + "post_attention_layernorm.weight"] = [C]
        layers = {"self_attn.q_proj": [config["num_attention_heads"] * hd, C], "self_attn.k_proj": [kv, C],
                  "self_attn.v_proj": [kv, C], "self_attn.o_proj": [C, config["num_attention_heads"] * hd]}
        if config["model_type"] == "mixtral":
            # MixtralForCausalLM as every transformers version saves it: the router (not converted to FP8)
            # and each expert's w1 (gate), w3 (up) and w2 (down).
            E = config["num_local_experts"]
            shapes[p + "block_sparse_moe.gate.weight"] = [E, C]
            for e in range(E):
                x = f"block_sparse_moe.experts.{e}."
                layers.update({x + "w1": [F, C], x + "w3": [F, C], x + "w2": [C, F]})
        else:
            layers.update({"mlp.gate_proj": [F, C], "mlp.up_proj": [F, C], "mlp.down_proj": [C, F]})
        for name, shape in layers.items():
            shapes[p + name + ".weight"] = shape
            linear.add(p + name + ".weight")
    return shapes, linear


def main(directory):
    with open(f"{directory}/config.json") as f:
        config = json.load(f)
    shapes, linear = expected(config)
    quantization = config.get("quantization_config")
    fp8 = quantization is not None
    if fp8:
        assert quantization["quant_method"] == "fp8", quantization
        block = quantization["weight_block_size"]
        if config["model_type"] == "mixtral":
            assert "block_sparse_moe.gate" in quantization["modules_to_not_convert"], quantization
        for name in linear:
            rows, cols = shapes[name]
            shapes[name[: -len("weight")] + "weight_scale_inv"] = [math.ceil(rows / block[0]), math.ceil(cols / block[1])]
    h, data = header(f"{directory}/model.safetensors")
    problems = []
    for name in sorted(set(shapes) - set(h)):
        problems.append(f"missing {name}")
    for name in sorted(set(h) - set(shapes)):
        problems.append(f"unexpected {name}")
    for name, entry in h.items():
        if name not in shapes:
            continue
        if entry["shape"] != shapes[name]:
            problems.append(f"{name}: shape {entry['shape']}, expected {shapes[name]}")
        want = "F8_E4M3" if fp8 and name in linear else "F32"
        if fp8 and name.endswith(".block_sparse_moe.gate.weight"):
            want = "BF16"  # the router, unconverted, in the dtype transformers' FP8 model computes in
        if entry["dtype"] != want:
            problems.append(f"{name}: dtype {entry['dtype']}, expected {want}")
        if entry["dtype"] == "F32":
            begin, end = entry["data_offsets"]
            values = struct.unpack(f"<{(end - begin) // 4}f", data[begin:end])
            if not all(math.isfinite(v) for v in values):
                problems.append(f"{name}: non-finite values")
    try:
        from safetensors import safe_open  # the reference reader, where installed

        with safe_open(f"{directory}/model.safetensors", framework="numpy") as f:
            assert set(f.keys()) == set(h), "safetensors lists other keys"
    except ImportError:
        pass
    for p in problems:
        print(f"{directory}: {p}", file=sys.stderr)
    print(json.dumps({"directory": directory, "tensors": len(h), "fp8": fp8, "problems": len(problems)}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
