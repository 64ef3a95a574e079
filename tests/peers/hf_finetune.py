"""A short fine-tune through octet, exported and checked with transformers (run on a GPU machine with
transformers 5.x, torch and octet's CUDA build; without a GPU the FP8 part is skipped).

Usage: python3 tests/peers/hf_finetune.py OCTET_BINARY --data DIR [--keep DIR] [--octet-only] [options]

DIR holds token shards made with `octet data prepare --tokenizer llama3` (the Brown corpus, say) and the
llama3.tiktoken that command copies beside them. For a small LlamaForCausalLM and a small MixtralForCausalLM,
both with Llama 3's vocabulary (128256 tokens):
  1. the random model made with transformers, save_pretrained, `octet import hf`;
  2. `octet train --init-from` the imported checkpoint on DIR for a short while (FP8 on the GPU by default);
  3. `octet export --format hf` and from_pretrained on it (float32);
  (a) transformers' loss on the first validation windows against `octet eval`: of the fine-tuned checkpoint
      (which evaluates in the precision it was trained in: FP8) and of the export imported again (a float32
      checkpoint with the same weights, evaluated on the CPU backend in float32);
  (b) greedy continuations of a few prompts, transformers' generate(do_sample=False) against
      `octet generate --temperature 0` of the float32 checkpoint (and, for information, of the FP8 one);
  (c) AutoTokenizer.from_pretrained on the export encodes a few texts to <|begin_of_text|> followed by the
      ids `octet data prepare` writes for them, and decodes them back;
  (d) `octet export --format hf-fp8`, from_pretrained on it on the GPU (transformers' fine-grained FP8, or
      dequantized to BF16 where its FP8 matmul is missing), and its greedy continuations against
      `octet generate --temperature 0` of the fine-tuned checkpoint, which runs in FP8 as it was trained.
--octet-only runs the octet half without transformers (the random model written by hand, the CPU backend by
default): every command and what is read from its output, as a dry run of the check.
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
import time
import traceback

try:
    import numpy as np
except ImportError as e:  # pragma: no cover - setup problem
    print(json.dumps({"ok": False, "error": f"missing package: {e}"}))
    sys.exit(2)

VOCAB = 128256  # Llama 3's: 128000 ranked tokens and 256 special ones
BEGIN_OF_TEXT = 128000  # what octet writes before every document, and where its generation stops
# Every dimension of an FP8-converted layer is a multiple of 128 (transformers' FP8 blocks); two query heads
# per key/value head.
LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=VOCAB, hidden_size=256,
             intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
             hidden_act="silu", attention_bias=False, mlp_bias=False, bos_token_id=128000, eos_token_id=128001)
MIXTRAL = dict(architectures=["MixtralForCausalLM"], model_type="mixtral", vocab_size=VOCAB, hidden_size=256,
               intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256, rms_norm_eps=1e-5,
               rope_theta=500000.0, sliding_window=None, tie_word_embeddings=False, hidden_act="silu",
               router_aux_loss_coef=0.02, router_jitter_noise=0.0, output_router_logits=False,
               bos_token_id=128000, eos_token_id=128001)
# octet eval prints the loss with 4 decimals (a rounding of at most 5e-5); two float32 forwards of the same
# weights differ by far less (float32's relative step is 6e-8).
FLOAT32_LOSS_TOLERANCE = 2e-4
# octet eval of the fine-tuned checkpoint runs in the precision it was trained in. An FP8 forward rounds every
# GEMM operand to E4M3 (3 mantissa bits: up to 2^-4 relative per value); the errors partly cancel in the sums,
# so the mean loss moves by well under 2^-4 of itself (BF16, with 8 bits, by far less), while a wrong or
# misplaced tensor moves it by whole nats.
MIXED_PRECISION_LOSS_RELATIVE_TOLERANCE = 2.0 ** -4
GREEDY_TOKENS = 12
PROMPTS = ["The jury said it did find that", "It was the first time", "He told the committee that",
           "In the morning she went to", "The President of the United States", "There is no reason to believe",
           "The church was built in", "When the war ended, the"]
TEXTS = PROMPTS + [
    "Hello, world! It's 2026; don't panic.\n",
    "  leading spaces,\ttabs and\r\nCRLF line ends\n\n\n",
    "Numbers: 1234567 3.14159 -42 1e-5 0x1F, and 'quotes' \"too\"",
    "Accents and scripts: caf\u00e9, na\u00efve, Z\u00fcrich; \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac; "
    "\u0440\u0443\u0441\u0441\u043a\u0438\u0439; \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8; "
    "\ud55c\uad6d\uc5b4; emoji \U0001F642\U0001F44D\U0001F3FD",
    "def square(x):\n    return x ** 2  # a comment\n",
]
VALIDATION_EVERY = 20  # octet data prepare puts every 20th document in the validation split


class SetupError(Exception):
    """Something the check needs is missing (exit code 2)."""


def run_octet(binary, *args, env=None):
    r = subprocess.run([binary, *args], capture_output=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"octet {' '.join(args)} exited {r.returncode}: "
                           f"{r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def octet_environment():
    """octet's attention on the GPU loads cuDNN at run time; PyTorch's wheel ships a copy."""
    env = dict(os.environ)
    try:
        import nvidia.cudnn as cudnn
        lib = os.path.join(list(cudnn.__path__)[0], "lib")
        if os.path.isdir(lib):
            env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    except ImportError:
        pass
    return env


# Files: safetensors and token shards, read and written without a library so that the dry run needs only numpy.

def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    return {name: (t["dtype"], t["shape"], data[t["data_offsets"][0]:t["data_offsets"][1]])
            for name, t in header.items() if name != "__metadata__"}


def write_safetensors(path, tensors):
    """float32 arrays under their names, as save_pretrained writes them."""
    header, offset = {}, 0
    for name, array in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for array in tensors.values():
            f.write(np.ascontiguousarray(array, dtype="<f4").tobytes())


def read_shard(path):
    """The tokens of a shard in llm.c's format: 256 int32 of header (magic, version, count), then the tokens."""
    with open(path, "rb") as f:
        magic, version, count = struct.unpack("<3i", f.read(12))
        f.seek(1024)
        width = {(20240520, 1): "<u2", (20240801, 7): "<u4"}.get((magic, version))
        if width is None:
            raise ValueError(f"{path}: magic {magic}, version {version} is no token shard")
        tokens = np.frombuffer(f.read(), dtype=width)
    if len(tokens) != count:
        raise ValueError(f"{path}: header says {count} tokens, the file holds {len(tokens)}")
    return tokens.astype(np.int64)


def handmade_model(directory, spec, seed):
    """What save_pretrained writes for a random model of this spec (config.json, model.safetensors), made
    without transformers: normal weights of standard deviation 0.02 (transformers' initializer_range), norms 1."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(spec, f, indent=2)
    rng = np.random.default_rng(seed)
    C, V, F = spec["hidden_size"], spec["vocab_size"], spec["intermediate_size"]
    D = C // spec["num_attention_heads"]
    H, KV = spec["num_attention_heads"] * D, spec["num_key_value_heads"] * D

    def normal(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal(V, C)}
    for n in range(spec["num_hidden_layers"]):
        p = f"model.layers.{n}."
        tensors[p + "input_layernorm.weight"] = np.ones(C, np.float32)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(C, np.float32)
        for name, shape in (("q_proj", (H, C)), ("k_proj", (KV, C)), ("v_proj", (KV, C)), ("o_proj", (C, H))):
            tensors[p + f"self_attn.{name}.weight"] = normal(*shape)
        if spec["model_type"] == "mixtral":
            tensors[p + "block_sparse_moe.gate.weight"] = normal(spec["num_local_experts"], C)
            for e in range(spec["num_local_experts"]):
                for name, shape in (("w1", (F, C)), ("w2", (C, F)), ("w3", (F, C))):
                    tensors[p + f"block_sparse_moe.experts.{e}.{name}.weight"] = normal(*shape)
        else:
            for name, shape in (("gate_proj", (F, C)), ("up_proj", (F, C)), ("down_proj", (C, F))):
                tensors[p + f"mlp.{name}.weight"] = normal(*shape)
    tensors["model.norm.weight"] = np.ones(C, np.float32)
    tensors["lm_head.weight"] = normal(V, C)
    write_safetensors(os.path.join(directory, "model.safetensors"), tensors)


def latest_checkpoint(run_dir):
    steps = sorted(d for d in os.listdir(os.path.join(run_dir, "checkpoints")) if d.startswith("step_"))
    return os.path.join(run_dir, "checkpoints", steps[-1])


def train_shape(checkpoint):
    """The batch size and sequence length of a checkpoint's configuration (state.json's "config", the run's
    TOML, [train]): octet eval's windows."""
    with open(os.path.join(checkpoint, "state.json")) as f:
        train = json.load(f)["config"].split("[train]", 1)[1].split("\n[", 1)[0]
    return (int(re.search(r"^batch_size\s*=\s*(\d+)", train, re.M).group(1)),
            int(re.search(r"^seq_len\s*=\s*(\d+)", train, re.M).group(1)))


def octet_ids(binary, texts, vocabulary, work):
    """The ids octet's Llama 3 tokenizer gives each text: `octet data prepare` writes every file as one document
    that starts with <|begin_of_text|>; the texts come first and fill the training split (the 20th document
    goes to validation), so splitting that shard at <|begin_of_text|> gives them back in order."""
    if len(texts) >= VALIDATION_EVERY:
        raise ValueError(f"at most {VALIDATION_EVERY - 1} texts fit the training split")
    text_dir, out = os.path.join(work, "texts"), os.path.join(work, "texts-llama3")
    os.makedirs(text_dir, exist_ok=True)
    files = []
    for i in range(max(len(texts) + 1, VALIDATION_EVERY)):
        files.append(os.path.join(text_dir, f"{i:03d}.txt"))
        with open(files[-1], "w", encoding="utf-8", newline="") as f:
            f.write(texts[i] if i < len(texts) else f"filler document {i}")
    run_octet(binary, "data", "prepare", "--tokenizer", "llama3", "--vocab", vocabulary, "--out", out, *files)
    tokens = read_shard(os.path.join(out, "train_000000.bin"))
    starts = np.flatnonzero(tokens == BEGIN_OF_TEXT).tolist() + [len(tokens)]
    documents = [tokens[a + 1:b].tolist() for a, b in zip(starts, starts[1:])]
    if starts[0] != 0 or len(documents) != len(files) - 1:
        raise ValueError(f"{out}: {len(documents)} documents in the training shard, expected {len(files) - 1}")
    return documents[:len(texts)]


def octet_greedy(binary, checkpoint, device, env):
    """`octet generate --temperature 0` of each prompt: the continuation (the text after the prompt)."""
    out = []
    for prompt in PROMPTS:
        text = run_octet(binary, "generate", checkpoint, "--prompt", prompt, "--max-tokens", str(GREEDY_TOKENS),
                         "--temperature", "0", "--device", device, env=env)
        if not text.startswith(prompt.encode()) or not text.endswith(b"\n"):
            raise ValueError(f"octet generate printed {text[:200]!r}, not the prompt, its continuation and a newline")
        out.append(text[len(prompt.encode()):-1].decode("utf-8", errors="replace"))
    return out


def octet_loss(binary, checkpoint, data, batches, device, env):
    out = run_octet(binary, "eval", checkpoint, "--data", data, "--batches", str(batches), "--device", device,
                    env=env).decode()
    return float(re.search(r"validation loss (\S+),", out).group(1))


def eval_batches(tokens, B, T, wanted):
    """As many of the wanted batches as the validation split holds without wrapping around."""
    batches = min(wanted, (len(tokens) - 1) // T // B)
    if batches < 1:
        raise ValueError(f"the validation split ({len(tokens)} tokens) holds no batch of {B} x {T + 1} tokens")
    return batches


class Octet:
    """The octet half for one model: import, fine-tune, export, import the export again, and octet's own
    losses, continuations and files."""

    def __init__(self, args, env, name, spec, work):
        self.args, self.env, self.name, self.spec = args, env, name, spec
        self.original = os.path.join(work, f"{name}-original")
        self.imported = os.path.join(work, f"{name}-imported")
        self.run_dir = os.path.join(work, f"{name}-run")
        self.exported = os.path.join(work, f"{name}-export")
        self.exported_fp8 = os.path.join(work, f"{name}-export-fp8")
        self.reimported = os.path.join(work, f"{name}-reimported")

    def octet(self, *args):
        return run_octet(self.args.octet, *args, env=self.env).decode(errors="replace")

    def run(self, result):
        a = self.args
        self.octet("import", "hf", self.original, "--out", self.imported, "--force")
        steps = a.steps
        began = time.monotonic()
        log = self.octet("train", os.path.join(self.imported, "config.toml"), "--init-from", self.imported,
                         "--set", f"data.dir={a.data}", "--set", f"train.device={a.device}",
                         "--set", f"train.mixed_precision={a.mode}", "--set", f"train.steps={steps}",
                         "--set", f"train.batch_size={a.batch_size}", "--set", f"train.seq_len={a.seq_len}",
                         "--set", f"optimizer.learning_rate={a.learning_rate}",
                         "--set", f"scheduler.warmup_steps={min(20, steps)}", "--set", "data.eval_every=0",
                         "--set", "data.eval_batches=4", "--set", "checkpoint.every=0",
                         "--set", "telemetry.enabled=false", "--set", f"logging.log_every={max(1, steps // 4)}",
                         "--set", f"logging.run_dir={self.run_dir}", "--overwrite")
        seconds = time.monotonic() - began
        losses = [float(x) for x in re.findall(r"^step \d+/\d+ \| loss (\S+) ", log, re.M)]
        self.checkpoint = latest_checkpoint(self.run_dir)
        result.update(train_seconds=round(seconds, 1), train_losses=losses,
                      checkpoint=os.path.basename(self.checkpoint))
        if not losses:
            raise ValueError(f"octet train printed no step line: {log[-500:]!r}")

        self.octet("export", self.run_dir, "--format", "hf", "--out", self.exported, "--force")
        self.octet("export", self.run_dir, "--format", "hf-fp8", "--out", self.exported_fp8, "--force")
        for file in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            if not os.path.isfile(os.path.join(self.exported, file)):
                raise ValueError(f"the export {self.exported} has no {file}")
        stored = read_safetensors(os.path.join(self.exported_fp8, "model.safetensors"))
        result["fp8_stored_weights"] = sum(1 for t in stored.values() if t[0] == "F8_E4M3")
        L = self.spec["num_hidden_layers"]
        # Llama: q, k, v, o, gate, up, down per layer; Mixtral: q, k, v, o and each expert's w1, w3, w2.
        expected = 7 * L if "num_local_experts" not in self.spec else (4 + 3 * self.spec["num_local_experts"]) * L
        result["fp8_expected_weights"] = expected

        # The export imported again: a float32 checkpoint with the fine-tuned weights, for octet's float32
        # forward. It carries its own copy of the tokenizer's vocabulary, which generation reads.
        self.octet("import", "hf", self.exported, "--out", self.reimported, "--force")
        if not os.path.isfile(os.path.join(self.reimported, "llama3.tiktoken")):
            shutil.copy(os.path.join(a.data, "llama3.tiktoken"), self.reimported)
        a_weights = read_safetensors(os.path.join(self.checkpoint, "model.safetensors"))
        b_weights = read_safetensors(os.path.join(self.reimported, "model.safetensors"))
        differ = sorted(k for k in set(a_weights) | set(b_weights) if a_weights.get(k) != b_weights.get(k))
        result["reimport_same_weights"] = not differ
        if differ:
            result["reimport_differ"] = differ[:10]

        tokens = read_shard(os.path.join(a.data, "val_000000.bin"))
        self.windows = {}
        for key, checkpoint, device in (("finetuned", self.checkpoint, a.device), ("float32", self.reimported, "cpu")):
            B, T = train_shape(checkpoint)
            batches = eval_batches(tokens, B, T, a.eval_batches)
            self.windows[key] = (B, T, batches)
            result[f"octet_eval_{key}"] = octet_loss(a.octet, checkpoint, a.data, batches, device, self.env)
        result["eval_windows"] = {k: f"{b} x {B} x {T + 1} tokens" for k, (B, T, b) in self.windows.items()}
        self.greedy_float32 = octet_greedy(a.octet, self.reimported, "cpu", self.env)
        self.greedy_finetuned = octet_greedy(a.octet, self.checkpoint, a.device, self.env)
        result["octet_greedy_float32"] = self.greedy_float32[:3]
        result["octet_greedy_finetuned"] = self.greedy_finetuned[:3]
        return (not differ and result["fp8_stored_weights"] == expected and
                all(np.isfinite(result[f"octet_eval_{k}"]) for k in self.windows))


# The transformers half.

def same_continuations(a, b):
    return sum(int(x == y) for x, y in zip(a, b))


def differing_continuations(transformers_side, octet_side):
    """[prompt index, transformers' continuation, octet's] where they differ, to read in the results."""
    return [[i, x, y] for i, (x, y) in enumerate(zip(transformers_side, octet_side)) if x != y]


def hf_loss(torch, model, tokens, B, T, batches, device):
    """Mean cross-entropy over the batches octet eval reads: row b of batch i is the window of T + 1 tokens
    starting at (i B + b) T."""
    total = 0.0
    with torch.no_grad():
        for i in range(batches):
            rows = [tokens[(i * B + b) * T:(i * B + b) * T + T + 1] for b in range(B)]
            windows = torch.tensor(np.stack(rows), device=device)
            logits = model(windows[:, :-1]).logits.float()
            total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                       windows[:, 1:].reshape(-1)).item()
    return total / batches


def hf_greedy(torch, model, tokenizer, prompt_ids, device):
    """transformers' greedy continuation of each prompt (octet's ids), stopping where octet's generation
    stops (<|begin_of_text|>), as text."""
    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            x = torch.tensor([ids], device=device)
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=GREEDY_TOKENS, do_sample=False,
                               eos_token_id=BEGIN_OF_TEXT, pad_token_id=BEGIN_OF_TEXT)
            out.append(tokenizer.decode(y[0, len(ids):].tolist(), skip_special_tokens=False))
    return out


def check_tokenizer(transformers, directory, ids, result):
    """(c) The export's tokenizer.json through AutoTokenizer: <|begin_of_text|> and octet's ids, and back."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    encode_differs, decode_differs = [], []
    for i, (text, expected) in enumerate(zip(TEXTS, ids)):
        got = tokenizer(text)["input_ids"]
        if got != [BEGIN_OF_TEXT] + expected:
            encode_differs.append(i)
        if tokenizer.decode(got[1:]) != text or tokenizer.decode(got, skip_special_tokens=True) != text:
            decode_differs.append(i)
    result["tokenizer"] = {"class": type(tokenizer).__name__, "texts": len(TEXTS),
                           "encode_differs": encode_differs, "decode_differs": decode_differs}
    return tokenizer, not encode_differs and not decode_differs


def check_with_transformers(torch, transformers, o, ids, result):
    """(a), (b) and (c) on the float32 export, then (d)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokens = read_shard(os.path.join(o.args.data, "val_000000.bin"))
    model = transformers.AutoModelForCausalLM.from_pretrained(o.exported, dtype=torch.float32).to(device).eval()
    # (a) The windows of each octet eval: the float32 checkpoint (CPU backend) must give transformers' float32
    # loss to the printed precision; the fine-tuned one, evaluated in its training precision, within FP8's
    # rounding.
    losses = {key: hf_loss(torch, model, tokens, B, T, batches, device) for key, (B, T, batches) in o.windows.items()}
    relative = abs(result["octet_eval_finetuned"] - losses["finetuned"]) / losses["finetuned"]
    result.update(transformers_loss=losses, finetuned_eval_relative_difference=relative,
                  float32_loss_agrees=abs(result["octet_eval_float32"] - losses["float32"]) <= FLOAT32_LOSS_TOLERANCE,
                  finetuned_loss_agrees=relative <= MIXED_PRECISION_LOSS_RELATIVE_TOLERANCE)
    tokenizer, tokenizer_ok = check_tokenizer(transformers, o.exported, ids, result)
    # (b) Greedy continuations of the same prompt ids. Float32 against float32: only a near-tie between the two
    # likeliest tokens may go either way.
    prompt_ids = ids[:len(PROMPTS)]
    greedy = hf_greedy(torch, model, tokenizer, prompt_ids, device)
    agree = same_continuations(greedy, o.greedy_float32)
    result.update(transformers_greedy=greedy[:3], greedy_agree_float32=f"{agree}/{len(PROMPTS)}",
                  greedy_differ_float32=differing_continuations(greedy, o.greedy_float32),
                  greedy_agree_finetuned=f"{same_continuations(greedy, o.greedy_finetuned)}/{len(PROMPTS)}")
    ok = (result["float32_loss_agrees"] and result["finetuned_loss_agrees"] and tokenizer_ok and
          4 * agree >= 3 * len(PROMPTS))
    del model
    return check_fp8(torch, transformers, o, prompt_ids, result) and ok


def check_fp8(torch, transformers, o, prompt_ids, result):
    """(d) The hf-fp8 export in transformers against octet's FP8 inference: the fine-tuned checkpoint, which
    generates in FP8 as it was trained."""
    if not torch.cuda.is_available() or o.args.mode != "fp8":
        result["fp8"] = {"skipped": "no CUDA GPU" if o.args.mode == "fp8" else f"the fine-tune ran in {o.args.mode}"}
        return True
    tokenizer = transformers.AutoTokenizer.from_pretrained(o.exported_fp8)
    model = transformers.AutoModelForCausalLM.from_pretrained(o.exported_fp8, dtype=torch.bfloat16,
                                                              device_map="cuda").eval()
    path = "fp8 kernel"
    try:
        with torch.no_grad():
            model(torch.tensor([prompt_ids[0]], device="cuda"))
    except Exception as e:  # transformers' FP8 matmul needs the `kernels` package: load dequantized to BF16
        path = f"dequantized on load ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})"
        model = transformers.AutoModelForCausalLM.from_pretrained(
            o.exported_fp8, dtype=torch.bfloat16, device_map="cuda",
            quantization_config=transformers.FineGrainedFP8Config(dequantize=True)).eval()
    loaded_fp8 = sum(1 for p in model.state_dict().values() if p.dtype == torch.float8_e4m3fn)
    B, T, batches = o.windows["finetuned"]
    loss = hf_loss(torch, model, read_shard(os.path.join(o.args.data, "val_000000.bin")), B, T, batches, "cuda")
    relative = abs(loss - result["octet_eval_finetuned"]) / result["octet_eval_finetuned"]
    greedy = hf_greedy(torch, model, tokenizer, prompt_ids, "cuda")
    agree = same_continuations(greedy, o.greedy_finetuned)
    # Two FP8 forwards with different scaling (octet's per-tensor scales; transformers' 128 x 128 weight blocks
    # and 1 x 128 activation groups): near-ties go either way, so most continuations agree, not all.
    ok = (result["fp8_stored_weights"] == result["fp8_expected_weights"] and 2 * agree > len(PROMPTS) and
          relative <= MIXED_PRECISION_LOSS_RELATIVE_TOLERANCE)
    result["fp8"] = {"path": path, "loaded_fp8_weights": loaded_fp8, "transformers_loss": loss,
                     "relative_difference_to_octet_eval": relative, "greedy": greedy[:3],
                     "greedy_agree_with_octet_fp8": f"{agree}/{len(PROMPTS)}",
                     "greedy_differ_from_octet_fp8": differing_continuations(greedy, o.greedy_finetuned),
                     "greedy_agree_with_octet_float32":
                         f"{same_continuations(greedy, o.greedy_float32)}/{len(PROMPTS)}",
                     "ok": ok}
    del model
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("octet", help="path of the octet binary")
    parser.add_argument("--data", required=True, help="token shards of `octet data prepare --tokenizer llama3`")
    parser.add_argument("--keep", help="keep the directories here instead of a temporary directory")
    parser.add_argument("--octet-only", action="store_true",
                        help="only the octet half, without transformers (default device cpu, 2 steps of 2 x 32)")
    parser.add_argument("--device", help="where octet trains and runs the FP8 model (default cuda; cpu with "
                                         "--octet-only)")
    parser.add_argument("--mode", default="fp8", help="train.mixed_precision of the fine-tune (default fp8)")
    parser.add_argument("--steps", type=int, help="fine-tuning steps (default 400; 2 with --octet-only)")
    parser.add_argument("--batch-size", type=int, help="default 16; 2 with --octet-only")
    parser.add_argument("--seq-len", type=int, help="default 256; 32 with --octet-only")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--eval-batches", type=int, default=4, help="validation batches per loss (default 4)")
    parser.add_argument("--models", default="llama,mixtral", help="which models (default llama,mixtral)")
    args = parser.parse_args()
    dry = args.octet_only
    args.device = args.device or ("cpu" if dry else "cuda")
    args.steps = args.steps or (2 if dry else 400)
    args.batch_size = args.batch_size or (2 if dry else 16)
    args.seq_len = args.seq_len or (32 if dry else 256)
    args.octet = os.path.abspath(args.octet)
    args.data = os.path.abspath(args.data)
    result = {"octet_only": dry, "device": args.device, "mode": args.mode, "steps": args.steps,
              "batch": f"{args.batch_size} x {args.seq_len}"}

    torch = transformers = None
    try:
        if not (os.path.isfile(args.octet) and os.access(args.octet, os.X_OK)):
            raise SetupError(f"{args.octet} is not an executable")
        for file in ("train_000000.bin", "val_000000.bin", "llama3.tiktoken"):
            if not os.path.isfile(os.path.join(args.data, file)):
                raise SetupError(f"{args.data} has no {file}: make it with `octet data prepare --tokenizer llama3`")
        if not dry:
            try:
                import torch
                import transformers
            except ImportError as e:
                raise SetupError(f"missing package: {e}")
            result.update(transformers=transformers.__version__, torch=torch.__version__,
                          gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)
            torch.backends.cuda.matmul.allow_tf32 = False  # the float32 side in true float32
    except SetupError as e:
        result.update(ok=False, error=str(e))
        print(json.dumps(result))
        return 2

    work = args.keep or tempfile.mkdtemp(prefix="octet-hf-finetune-")
    os.makedirs(work, exist_ok=True)
    env = octet_environment()
    ok = True
    try:
        ids = octet_ids(args.octet, TEXTS, args.data, work)
        result["octet_ids"] = {"texts": len(ids), "tokens": sum(map(len, ids)), "first": ids[0]}
        specs = {"llama": LLAMA, "mixtral": MIXTRAL}
        for seed, name in enumerate(args.models.split(",")):
            spec = specs[name]
            o = Octet(args, env, name, spec, work)
            r = result[name] = {}
            if dry:
                handmade_model(o.original, spec, seed)
            else:
                torch.manual_seed(seed)
                config_class = transformers.LlamaConfig if name == "llama" else transformers.MixtralConfig
                model_class = transformers.LlamaForCausalLM if name == "llama" else transformers.MixtralForCausalLM
                fields = {k: v for k, v in spec.items() if k not in ("architectures", "model_type")}
                model_class(config_class(**fields)).to(torch.float32).save_pretrained(o.original)
            ok &= o.run(r)
            if not dry:
                ok &= check_with_transformers(torch, transformers, o, ids, r)
            if not args.keep:
                for d in (o.original, o.imported, o.run_dir, o.reimported):
                    shutil.rmtree(d, ignore_errors=True)
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
