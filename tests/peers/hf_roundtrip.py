"""Hugging Face round trip through octet, checked with transformers (run on a machine with transformers 5.x,
torch and safetensors; a GPU is needed for the FP8 part, which is skipped without one).

Usage: python3 tests/peers/hf_roundtrip.py OCTET_BINARY [--keep DIR]

For a random small LlamaForCausalLM (grouped-query attention, rope_theta 500000) and a random small
GPT2LMHeadModel, each saved with save_pretrained (float32, safetensors):
  1. `octet import hf` into a checkpoint, then `octet export --format hf`;
  2. from_pretrained on the export: its state dict must equal the original's bit for bit, and so must its
     logits on a few prompts (same weights, same code);
  3. Llama only: `octet export --format hf-fp8`, from_pretrained on it (transformers' fine-grained FP8) on
     the GPU, and its logits compared with the original model's: relative error of the logits within FP8
     tolerance and greedy continuations agreeing on most prompts.
Prints one JSON line with every result and exits 1 when a check fails, 2 when the setup is missing.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
except ImportError as e:  # pragma: no cover - setup problem
    print(json.dumps({"ok": False, "error": f"missing package: {e}"}))
    sys.exit(2)

# Every dimension of a converted linear layer is a multiple of 128 (transformers' FP8 blocks) and the
# vocabulary is at least 256 (octet's byte tokenizer).
LLAMA = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=500000.0,
             tie_word_embeddings=False, hidden_act="silu", attention_bias=False, mlp_bias=False)
GPT2 = dict(vocab_size=512, n_positions=128, n_embd=128, n_layer=2, n_head=4, activation_function="gelu_new",
            layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
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
    return not problems and same_logits


def check_fp8(binary, model, work, result):
    if not torch.cuda.is_available():
        result["llama_fp8"] = {"skipped": "no CUDA GPU"}
        return True
    checkpoint = os.path.join(work, "llama-octet")
    exported = os.path.join(work, "llama-fp8")
    run_octet(binary, "export", checkpoint, "--format", "hf-fp8", "--out", exported)
    fp8 = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.bfloat16, device_map="cuda").eval()
    reference = model.to("cuda", torch.bfloat16).eval()
    fp8_weights = sum(1 for p in fp8.state_dict().values() if p.dtype == torch.float8_e4m3fn)
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
            from safetensors.torch import load_file
            from transformers import FineGrainedFP8Config
            path = f"dequantized on load ({str(e).split(':')[0]})"
            fp8 = AutoModelForCausalLM.from_pretrained(
                exported, dtype=torch.bfloat16, device_map="cuda",
                quantization_config=FineGrainedFP8Config(dequantize=True)).eval()
            stored = load_file(os.path.join(exported, "model.safetensors"))
            loaded = fp8.state_dict()
            worst = 0.0
            for name, codes in stored.items():
                if codes.dtype != torch.float8_e4m3fn:
                    continue
                fp8_weights += 1
                scale = stored[name + "_scale_inv"].float()
                expanded = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
                expected = codes.float() * expanded
                got = loaded[name].float().cpu()
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
    ok = fp8_weights == 7 * model.config.num_hidden_layers and relative < 0.0625 and agree >= PROMPTS // 2
    result["llama_fp8"] = {"path": path, "fp8_weights": fp8_weights, "logits_relative_error": relative,
                           "top1_agreement": top1,
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
        ok &= check_float32(binary, "llama", llama, work, result)
        ok &= check_float32(binary, "gpt2", gpt2, work, result)
        ok &= check_fp8(binary, llama, work, result)
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
