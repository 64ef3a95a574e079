"""The exchange between octet's golden tests (tests/golden, golden_io.cpp) and their PyTorch references
(gpt2_reference.py, llama_reference.py): the two binary files, and the training run every reference makes
(autograd gradients, torch.optim.AdamW with weight decay on 2-D parameters only). A reference supplies the
parameter shapes it expects and its forward; this module does the rest.

  REFERENCE.py INPUT OUTPUT

Exit status 0 on success, 77 when torch is not importable (checked by the reference before importing this
module), 1 on any other error.

Both files are little-endian. INPUT (written by the C++ test):
  char[8]  "OCTGOLDI"
  int32    version (3)
  int32    arch (0 GPT-2, 1 Llama)
  int32    V, Vp, maxT, L, NH, KV, C, F, tied, B, T, steps, parameter_count
           (KV key and value heads, F the MLP's hidden width, tied 1 when the head is the token embedding;
           GPT-2 has KV = NH, F = 4C and tied = 1)
  float32  learning_rate, beta1, beta2, eps, weight_decay, rope_theta (unused by GPT-2)
  int32    E, k, shared   (Llama's mixture of experts: E experts, 0 for a dense MLP; k per token; shared 1
                           with a shared expert)
  float32  router_aux_loss_coef (the weight of each layer's load-balancing loss in the training loss)
  int32    tokens[B*T], targets[B*T]
  then parameter_count tensors in octet's Decoder::parameters() order, each:
    int32 name_length, char name[name_length] (ASCII), int32 ndim, int32 shape[ndim],
    float32 values[prod(shape)] (row-major; linear weights [out_features, in_features])

OUTPUT (read by the C++ test):
  char[8]  "OCTGOLDO"
  int32    version (3)
  int32    N (= B*T), Vp, parameter_count, steps
  float32  logits[N*Vp]            before the first update, padded columns included
  float32  logit_magnitude[N*Vp]   sum_c |final_norm(x)[n,c]| * |head[v,c]| (float64, then rounded): the
                                   scale of each logit's rounding error, for the comparator
  float32  loss                    before the first update
  then parameter_count gradient tensors, same record layout and order as the input's parameters
  float32  step_losses[steps]      the loss of each AdamW step, taken before its update
"""
import math
import struct
import sys

import torch

INPUT_MAGIC = b"OCTGOLDI"
OUTPUT_MAGIC = b"OCTGOLDO"
VERSION = 3
ARCHITECTURES = {0: "gpt2", 1: "llama"}


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
    (arch,) = r.ints(1)
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: unknown architecture {arch}")
    V, Vp, maxT, L, NH, KV, C, F, tied, B, T, steps, count = r.ints(13)
    lr, beta1, beta2, eps, weight_decay, rope_theta = r.floats(6)
    E, k, shared = r.ints(3)
    (aux_coef,) = r.floats(1)
    cfg = dict(arch=ARCHITECTURES[arch], V=V, Vp=Vp, maxT=maxT, L=L, NH=NH, KV=KV, C=C, F=F, tied=bool(tied),
               B=B, T=T, steps=steps, rope_theta=rope_theta, E=E, k=k, shared=bool(shared), aux_coef=aux_coef)
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


def check_parameters(expected, params, what):
    missing = [n for n in expected if n not in params]
    unknown = [n for n in params if n not in expected]
    if missing or unknown:
        raise ValueError(f"parameter names differ from {what}'s: missing {missing}, unexpected {unknown}")
    for name, shape in expected.items():
        if list(params[name].shape) != shape:
            raise ValueError(f"{name}: shape {list(params[name].shape)}, expected {shape}")


def write_tensor_record(f, name, values):
    encoded = name.encode("ascii")
    f.write(struct.pack("<i", len(encoded)))
    f.write(encoded)
    f.write(struct.pack(f"<i{values.dim()}i", values.dim(), *values.shape))
    f.write(values.detach().contiguous().to(torch.float32).numpy().astype("<f4").tobytes())


def train(cfg, hyper, tokens, targets, params, forward, head_name):
    """Runs cfg["steps"] AdamW steps on the one batch. forward(cfg, params, tokens, targets) returns the
    logits [B*T, Vp], the final norm's output [B*T, C] and the mean loss, and optionally a fourth term that
    training adds to the loss it differentiates (a mixture of experts' balance loss); head_name names the
    head's weight [Vp, C]. Returns the logits, their magnitudes, the loss and the gradients of step 0, and every step's
    loss."""
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
        logits, final, loss, *extra = forward(cfg, params, tokens, targets)
        (loss + sum(extra)).backward()
        if step == 0:  # the state octet compares before any update
            first = dict(logits=logits.detach().clone(), loss=loss.item(),
                         grads={name: t.grad.detach().clone() for name, t in params.items()})
            with torch.no_grad():
                first["magnitude"] = final.double().abs() @ params[head_name].double().abs().t()
        step_losses.append(loss.item())
        optimizer.step()
    first["step_losses"] = step_losses
    return first


def write_output(path, cfg, result):
    N, Vp = result["logits"].shape
    with open(path, "wb") as f:
        f.write(OUTPUT_MAGIC)
        f.write(struct.pack("<5i", VERSION, N, Vp, len(result["grads"]), cfg["steps"]))
        f.write(result["logits"].numpy().astype("<f4").tobytes())
        f.write(result["magnitude"].numpy().astype("<f4").tobytes())
        f.write(struct.pack("<f", result["loss"]))
        for name, grad in result["grads"].items():
            write_tensor_record(f, name, grad)
        f.write(struct.pack(f"<{len(result['step_losses'])}f", *result["step_losses"]))


def main(arch, expected_shapes, forward, head_name):
    """The whole reference: read INPUT, check it is this architecture with the expected parameters, train,
    write OUTPUT. head_name(cfg) names the head's weight."""
    if len(sys.argv) != 3:
        print(f"usage: {sys.argv[0]} INPUT OUTPUT", file=sys.stderr)
        return 1
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    cfg, hyper, tokens, targets, params = read_input(sys.argv[1])
    if cfg["arch"] != arch:
        raise ValueError(f"{sys.argv[1]} holds a {cfg['arch']} model, this reference is for {arch}")
    check_parameters(expected_shapes(cfg), params, arch)
    result = train(cfg, hyper, tokens, targets, params, forward, head_name(cfg))
    write_output(sys.argv[2], cfg, result)
    losses = result["step_losses"]
    print(f"torch {torch.__version__}: loss {result['loss']:.7f} -> {losses[-1]:.7f} over {cfg['steps']} steps")
    return 0
