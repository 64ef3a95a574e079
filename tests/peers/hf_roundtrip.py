"""Hugging Face round trip through octet, checked with transformers (run on a machine with transformers 5.x,
torch and safetensors; a GPU is needed for the FP8 part, which is skipped without one).

Usage: python3 tests/peers/hf_roundtrip.py OCTET_BINARY [--keep DIR]

For a random small LlamaForCausalLM (grouped-query attention, rope_theta 500000), a random small
MixtralForCausalLM (4 experts, 2 per token) and a random small GPT2LMHeadModel, each saved with
save_pretrained (float32, safetensors):
  1. `octet import hf` into a checkpoint, then `octet export --format hf`;
  2. from_pretrained on the export: its state dict must equal the original's bit for bit, and so must its
     logits on a few prompts (same weights, same code);
  3. octet's own forward on the imported checkpoint: `octet eval` on the CPU backend (float32) over a shard
     of random tokens must give transformers' float32 loss on the same windows;
  4. Mixtral, with transformers 5: the model saved with save_original_format=False (its experts fused as
     mlp.experts.gate_up_proj and down_proj) must import to the same checkpoint as the default save;
  5. Llama and Mixtral: `octet export --format hf-fp8`, from_pretrained on it (transformers' fine-grained
     FP8) on the GPU, and its logits compared with the original model's: relative error of the logits
     within FP8 tolerance and greedy continuations agreeing on most prompts.
Prints one JSON line with every result and exits 1 when a check fails, 2 when the setup is missing.
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback

try:
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                              MixtralConfig, MixtralForCausalLM)
except ImportError as e:  # pragma: no cover - setup problem
    print(json.dumps({"ok": False, "error": f"missing package: {e}"}))
    sys.exit(2)

# Every dimension of a converted linear layer is a multiple of 128 (transformers' FP8 blocks) and the
# vocabulary is at least 256 (octet's byte tokenizer).
LLAMA = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=500000.0,
             tie_word_embeddings=False, hidden_act="silu", attention_bias=False, mlp_bias=False)
MIXTRAL = dict(vocab_size=512, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128,
               rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None, tie_word_embeddings=False,
               hidden_act="silu", router_aux_loss_coef=0.02, output_router_logits=False)
GPT2 = dict(vocab_size=512, n_positions=128, n_embd=128, n_layer=2, n_head=4, activation_function="gelu_new",
            layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
# octet eval prints the loss with 4 decimals (a rounding of at most 5e-5); the float32 forwards of octet's
# CPU backend and of torch differ by far less (a random model's loss is about ln 512 = 6.2, float32's
# relative step 6e-8).
LOSS_TOLERANCE = 2e-4
PROMPTS = 8
PROMPT_LENGTH = 12
GREEDY_TOKENS = 8


def run_octet(binary, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"octet {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout.strip()


def randomize(model, seed):
    # save_pretrained of a fresh model holds ones and zeros in norms and biases: give every tensor random values
    # so that a swapped or dropped tensor shows.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.05 if p.dim() > 1 else 0.2) + (1.0 if "norm" in name or "ln_" in name else 0.0))
    return model


def prompts(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (PROMPTS, PROMPT_LENGTH), generator=g)


def same_state_dict(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    problems = []
    for name in sorted(set(sa) | set(sb)):
        if name not in sa or name not in sb:
            problems.append(f"{name} only in {'original' if name in sa else 'export'}")
            continue
        x, y = sa[name], sb[name]
        if x.shape != y.shape or x.dtype != y.dtype:
            problems.append(f"{name}: {tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype}")
        elif not torch.equal(x.view(torch.int32) if x.dtype == torch.float32 else x,
                             y.view(torch.int32) if y.dtype == torch.float32 else y):
            problems.append(f"{name}: values differ")
    return problems


def greedy(model, ids, device):
    out = model.generate(ids.to(device), max_new_tokens=GREEDY_TOKENS, do_sample=False, pad_token_id=0)
    return out[:, ids.shape[1]:].cpu()


def saved_keys(directory):
    """The tensor names save_pretrained wrote (one file or shards)."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return sorted(json.load(f)["weight_map"])
    return sorted(load_file(os.path.join(directory, "model.safetensors")))


def train_shape(checkpoint):
    """The batch size and sequence length of the imported checkpoint's config.toml ([train]), which octet eval
    reads its windows with."""
    with open(os.path.join(checkpoint, "config.toml")) as f:
        text = f.read()
    train = text.split("[train]", 1)[1].split("\n[", 1)[0]
    return (int(re.search(r"^batch_size\s*=\s*(\d+)", train, re.M).group(1)),
            int(re.search(r"^seq_len\s*=\s*(\d+)", train, re.M).group(1)))


def write_shard(path, tokens):
    """A token shard in llm.c's format with uint16 tokens: 256 int32 of header (magic, version, count)."""
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def check_octet_loss(binary, name, model, checkpoint, work):
    """octet's own forward of the imported checkpoint (octet eval, CPU backend, float32) against transformers':
    the mean cross-entropy over the first batch of a validation shard, whose row b is the window of T + 1
    tokens starting at b T (the inputs and, shifted by one, the targets)."""
    B, T = train_shape(checkpoint)
    data = os.path.join(work, f"{name}-tokens")
    os.makedirs(data, exist_ok=True)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, model.config.vocab_size, (B * T + 1,), generator=g)
    write_shard(os.path.join(data, "val_000000.bin"), tokens.tolist())
    out = run_octet(binary, "eval", checkpoint, "--data", data, "--batches", "1", "--device", "cpu")
    octet_loss = float(re.search(r"validation loss (\S+),", out).group(1))
    windows = torch.stack([tokens[b * T:b * T + T + 1] for b in range(B)])
    with torch.no_grad():
        logits = model(windows[:, :-1]).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1)).item()
    return {"octet_eval_loss": octet_loss, "transformers_loss": loss, "loss_agrees": abs(octet_loss - loss) <= LOSS_TOLERANCE}


def check_float32(binary, name, model, work, result):
    original_dir = os.path.join(work, f"{name}-original")
    model.save_pretrained(original_dir, safe_serialization=True)
    checkpoint = os.path.join(work, f"{name}-octet")
    exported = os.path.join(work, f"{name}-export")
    run_octet(binary, "import", "hf", original_dir, "--out", checkpoint)
    run_octet(binary, "export", checkpoint, "--format", "hf", "--out", exported)
    back = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    problems = same_state_dict(model, back)
    ids = prompts(model.config.vocab_size, 1)
    with torch.no_grad():
        same_logits = torch.equal(model(ids).logits, back(ids).logits)
    result[name] = {"state_dict_identical": not problems, "logits_identical": same_logits, "problems": problems[:10]}
    result[name].update(check_octet_loss(binary, name, model, checkpoint, work))
    # The names save_pretrained wrote for layer 0's MLP (a Mixtral's experts: which layout is on disk).
    result[name]["saved_layer0_mlp"] = [k for k in saved_keys(original_dir)
                                        if k.startswith("model.layers.0.") and "attn" not in k and "norm" not in k][:8]
    return not problems and same_logits and result[name]["loss_agrees"]


def check_mixtral_fused(binary, model, work, result):
    """Transformers 5 holds a Mixtral's experts fused; save_pretrained(save_original_format=False) writes them
    so (mlp.gate.weight, mlp.experts.gate_up_proj [E, 2F, C], mlp.experts.down_proj [E, C, F]). octet must
    import that directory to the same checkpoint as the default save's."""
    fused_dir = os.path.join(work, "mixtral-fused")
    try:
        model.save_pretrained(fused_dir, safe_serialization=True, save_original_format=False)
    except TypeError as e:  # transformers 4 has neither the argument nor the fused layout
        result["mixtral_fused"] = {"skipped": f"save_pretrained has no save_original_format ({e})"}
        return True
    layer0 = {}
    for file in sorted(f for f in os.listdir(fused_dir) if f.endswith(".safetensors")):
        for k, t in load_file(os.path.join(fused_dir, file)).items():
            if k.startswith("model.layers.0.mlp."):
                layer0[k] = list(t.shape)
    checkpoint = os.path.join(work, "mixtral-fused-octet")
    run_octet(binary, "import", "hf", fused_dir, "--out", checkpoint)
    a = load_file(os.path.join(work, "mixtral-octet", "model.safetensors"))
    b = load_file(os.path.join(checkpoint, "model.safetensors"))
    differ = sorted(k for k in set(a) | set(b) if k not in a or k not in b or not torch.equal(a[k], b[k]))
    result["mixtral_fused"] = {"saved_layer0_mlp": layer0, "same_checkpoint": not differ, "differ": differ[:10]}
    return not differ


def dequantized_weight(loaded, name, config):
    """The loaded weight that the export's tensor `name` became: the same name, or for a Mixtral expert's
    w1/w3/w2 under transformers 5, its slice of the layer's fused gate_up_proj (w1 rows, then w3 rows) or
    down_proj."""
    if name in loaded:
        return loaded[name]
    m = re.fullmatch(r"(model\.layers\.\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight", name)
    if m is None:
        raise KeyError(name)
    layer, expert, w = m.group(1), int(m.group(2)), m.group(3)
    if w == "w2":
        return loaded[f"{layer}.mlp.experts.down_proj"][expert]
    F = config.intermediate_size
    gate_up = loaded[f"{layer}.mlp.experts.gate_up_proj"][expert]
    return gate_up[:F] if w == "w1" else gate_up[F:]


def check_fp8(binary, name, model, expected_fp8, work, result):
    key = f"{name}_fp8"
    if not torch.cuda.is_available():
        result[key] = {"skipped": "no CUDA GPU"}
        return True
    checkpoint = os.path.join(work, f"{name}-octet")
    exported = os.path.join(work, f"{name}-fp8")
    run_octet(binary, "export", checkpoint, "--format", "hf-fp8", "--out", exported)
    stored = load_file(os.path.join(exported, "model.safetensors"))
    stored_fp8 = sum(1 for t in stored.values() if t.dtype == torch.float8_e4m3fn)
    fp8 = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.bfloat16, device_map="cuda").eval()
    reference = model.to("cuda", torch.bfloat16).eval()
    # Transformers 5 holds a Mixtral's experts fused: fewer, larger FP8 tensors than the file's.
    loaded_fp8 = sum(1 for p in fp8.state_dict().values() if p.dtype == torch.float8_e4m3fn)
    ids = prompts(model.config.vocab_size, 2).to("cuda")
    path = "fp8 kernel"
    with torch.no_grad():
        a = reference(ids).logits.float()
        try:
            b = fp8(ids).logits.float()
        except ImportError as e:
            # transformers' FP8 matmul needs the `kernels` package; without it, load the same files with
            # dequantize=True (each block's codes times its weight_scale_inv, in bf16) and check that the
            # weights it made are exactly the export's codes times their scales.
            from transformers import FineGrainedFP8Config
            path = f"dequantized on load ({str(e).split(':')[0]})"
            fp8 = AutoModelForCausalLM.from_pretrained(
                exported, dtype=torch.bfloat16, device_map="cuda",
                quantization_config=FineGrainedFP8Config(dequantize=True)).eval()
            loaded = fp8.state_dict()
            worst = 0.0
            for tensor, codes in stored.items():
                if codes.dtype != torch.float8_e4m3fn:
                    continue
                scale = stored[tensor + "_scale_inv"].float()
                expanded = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
                expected = codes.float() * expanded
                got = dequantized_weight(loaded, tensor, model.config).float().cpu()
                worst = max(worst, ((got - expected).abs() / expected.abs().clamp_min(1e-30)).max().item())
            # Within bf16's rounding (2^-8 relative; 2^-7 where the scale is rounded too).
            path += f", dequantized weights within {worst:.3g} of codes x weight_scale_inv"
            if worst > 2.0 ** -7:
                raise AssertionError(f"dequantized weights {worst:.3g} away from codes x weight_scale_inv")
            b = fp8(ids).logits.float()
    relative = ((a - b).norm() / a.norm()).item()
    top1 = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    ga, gb = greedy(reference, ids, "cuda"), greedy(fp8, ids, "cuda")
    agree = sum(int(torch.equal(x, y)) for x, y in zip(ga, gb))
    # E4M3 has 3 mantissa bits (relative step 2^-3, rounding error up to 2^-4 per weight); over sums of many
    # terms the errors average out, so the logits' relative error stays well below that.
    ok = stored_fp8 == expected_fp8 and relative < 0.0625 and agree >= PROMPTS // 2
    result[key] = {"path": path, "stored_fp8_weights": stored_fp8, "expected_fp8_weights": expected_fp8,
                   "loaded_fp8_weights": loaded_fp8, "logits_relative_error": relative, "top1_agreement": top1,
                   "greedy_agree": f"{agree}/{PROMPTS}", "ok": ok}
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("octet", help="path of the octet binary")
    parser.add_argument("--keep", help="keep the directories here instead of a temporary directory")
    args = parser.parse_args()
    binary = os.path.abspath(args.octet)
    result = {"transformers": transformers.__version__, "torch": torch.__version__}
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        result.update(ok=False, error=f"{binary} is not an executable")
        print(json.dumps(result))
        return 2
    work = args.keep or tempfile.mkdtemp(prefix="octet-hf-")
    os.makedirs(work, exist_ok=True)
    ok = True
    try:
        torch.manual_seed(0)
        llama = randomize(LlamaForCausalLM(LlamaConfig(**LLAMA)), 1).eval()
        gpt2 = randomize(GPT2LMHeadModel(GPT2Config(**GPT2)), 2).eval()
        mixtral = randomize(MixtralForCausalLM(MixtralConfig(**MIXTRAL)), 3).eval()
        ok &= check_float32(binary, "llama", llama, work, result)
        ok &= check_float32(binary, "gpt2", gpt2, work, result)
        ok &= check_float32(binary, "mixtral", mixtral, work, result)
        ok &= check_mixtral_fused(binary, mixtral, work, result)
        # Llama: q, k, v, o, gate, up, down per layer; Mixtral: q, k, v, o and each expert's w1, w3, w2.
        ok &= check_fp8(binary, "llama", llama, 7 * LLAMA["num_hidden_layers"], work, result)
        layers, experts = MIXTRAL["num_hidden_layers"], MIXTRAL["num_local_experts"]
        ok &= check_fp8(binary, "mixtral", mixtral, (4 + 3 * experts) * layers, work, result)
    except Exception as e:  # one line saying what failed, the traceback on stderr
        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {e}"
        ok = False
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result["ok"] = bool(ok)
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
