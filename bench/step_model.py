#!/usr/bin/env python3
"""A model of a data-parallel step's time against the number of GPUs and nodes (docs/distributed.md).

The model takes one GPU's measured step time as the compute, and adds the communication the step cannot hide:

  step(n) = T1 + tail(n) + s * min(C(n) - tail(n), W) + max(0, C(n) - tail(n) - W)

  C(n)     the gradients' sum over n GPUs: a ring all-reduce moves 2 (n - 1) / n of the gradient bytes through
           each GPU's slowest link, NVLink (bus bandwidth B_nv) within a node, the network (B_net a GPU)
           across nodes;
  tail(n)  the sum of the last bucket, the embedding table's gradient, which the backward finishes last and
           so nothing hides;
  W        the window the other sums overlap with: the backward, 2/3 of T1 (its GEMMs do twice the forward's
           work);
  s        the share of an overlapped sum's time that the step still pays (the sum's kernels take SMs and
           memory bandwidth from the compute).

B_nv and s are fitted on two GPUs: B_nv from a run whose sums all start after the backward
(distributed.bucket_mb = 0: step = T1 + C(2)), s from the same run with the sums overlapped. The model is then
checked against a measurement on more GPUs (--check). B_net is the network's bandwidth a GPU (default
45 GB/s: one 400 Gb/s InfiniBand port a GPU at 90%), stated, not measured here.

For fully sharded training (FSDP with the weights gathered in FP8; not built yet), the model gives the bytes
each step moves: the all-gathers of the weights (FP8 codes for the linear layers' weights, BF16 for the
rest, twice a step: forward and backward) against BF16 gathers, and the gradients' reduce-scatter, within
a node, with the shards' sums across nodes (dp_shard = GPUs a node, dp_replicate = nodes).

  step_model.py --config configs/bench/llama3-1B.toml --one G1.jsonl --two G2.jsonl --two-serial G2S.jsonl
                [--check N:GN1.jsonl:GN.jsonl ...] [--gpus 16 128] [--gpus-per-node 8] [--net-gbps 45]
                [--gradient-bytes 4] [--json]

Each .jsonl is a run's metrics.jsonl (octet train); the first --skip (5) steps are not timed.
"""
import argparse
import json
import statistics
import sys
import tomllib


def parameters(model):
    """(all parameters, the embedding table's, the linear layers' weights') of a [model] table."""
    arch = model.get("arch", "gpt2")
    L, C, V = model["layers"], model["channels"], model["vocab_size"]
    if arch == "llama":
        heads, kv = model["heads"], model.get("kv_heads", model["heads"])
        F = model["ffn_hidden"]
        kv_width = C * kv // heads
        linear = L * (2 * C * C + 2 * C * kv_width + 3 * C * F)
        embedding = V * C
        head = 0 if model.get("tie_embeddings", False) else V * C
        norms = L * 2 * C + C
        return linear + embedding + head + norms, embedding, linear
    Vp = model.get("padded_vocab_size", V)
    T = model["max_seq_len"]
    linear = L * 12 * C * C
    biases_norms = L * (3 * C + C + 4 * C + C + 4 * C) + 2 * C
    embedding = Vp * C + T * C  # tied with the head: its gradient is finished by the embedding's backward
    return linear + biases_norms + embedding, embedding, linear


def mean_step_ms(path, skip):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in rows if "ms" in r and "tokens_per_second" in r][skip:]
    if not rows:
        sys.exit(f"{path}: no timed steps after the first {skip}")
    bad = [r for r in rows if not (isinstance(r["ms"], (int, float)) and 0 < r["ms"] < float("inf"))]
    if bad:
        sys.exit(f"{path}: step {bad[0].get('step')} has no usable time ({bad[0]['ms']!r} ms)")
    return statistics.mean(r["ms"] for r in rows)


def all_reduce_ms(gigabytes, n, gpus_per_node, nv_gbps, net_gbps):
    """A ring all-reduce of `gigabytes` over n GPUs: 2 (n - 1) / n of it through each GPU's slowest link."""
    if n <= 1:
        return 0.0
    bandwidth = nv_gbps if n <= gpus_per_node else net_gbps
    return 2.0 * (n - 1) / n * gigabytes / bandwidth * 1e3


class StepModel:
    def __init__(self, T1, total_gb, tail_gb, nv_gbps, share, net_gbps, gpus_per_node):
        self.T1, self.total_gb, self.tail_gb = T1, total_gb, tail_gb
        self.nv_gbps, self.share, self.net_gbps, self.gpus_per_node = nv_gbps, share, net_gbps, gpus_per_node

    @staticmethod
    def fit(T1, T2, T2_serial, total_gb, tail_gb, net_gbps, gpus_per_node):
        """B_nv from two GPUs summing after the backward, s from two GPUs overlapping."""
        if T2_serial <= T1:
            sys.exit(f"two GPUs without overlap ({T2_serial:.2f} ms) are not slower than one ({T1:.2f} ms)")
        nv_gbps = total_gb / ((T2_serial - T1) * 1e-3)  # 2 (n - 1) / n = 1 at n = 2
        model = StepModel(T1, total_gb, tail_gb, nv_gbps, 0.0, net_gbps, gpus_per_node)
        sums, tail = model.sums_ms(2), model.tail_ms(2)
        model.share = min(max((T2 - T1 - tail) / (sums - tail), 0.0), 1.0)
        return model

    def sums_ms(self, n):
        return all_reduce_ms(self.total_gb, n, self.gpus_per_node, self.nv_gbps, self.net_gbps)

    def tail_ms(self, n):
        return all_reduce_ms(self.tail_gb, n, self.gpus_per_node, self.nv_gbps, self.net_gbps)

    def fsdp_step_ms(self, n, total, linear, embedding, gradient_bytes):
        """Fully sharded within a node (weights gathered in FP8), replicated across nodes: the gathers and the
        reduce-scatter over NVLink and each GPU's shard summed across the nodes, all overlapped with the whole
        step (a layer's gather prefetched during the previous layer's compute) at the same share s, but for the
        embedding shard's sum across nodes, which the backward finishes last."""
        shard = min(n, self.gpus_per_node)
        nodes = max(1, -(-n // self.gpus_per_node))
        fp8, _, rs = fsdp_bytes(total, linear, shard, gradient_bytes)
        within = (fp8 + rs) / 1e9 / self.nv_gbps * 1e3
        across = all_reduce_ms(total * gradient_bytes / shard / 1e9, nodes, 1, self.net_gbps, self.net_gbps)
        tail = across * embedding / total
        rest = within + across - tail
        return self.T1 + tail + self.share * min(rest, self.T1) + max(0.0, rest - self.T1)

    def step_ms(self, n, T1=None):
        T1 = self.T1 if T1 is None else T1
        window = 2.0 / 3.0 * T1
        tail = self.tail_ms(n)
        rest = self.sums_ms(n) - tail
        return T1 + tail + self.share * min(rest, window) + max(0.0, rest - window)


def fsdp_bytes(total, linear, n_shard, gradient_bytes):
    """Bytes a GPU sends a step in fully sharded training over n_shard GPUs: the weights gathered twice
    (forward, backward), FP8 codes for the linear layers' weights and BF16 for the rest, against BF16
    for all; the gradients reduce-scattered."""
    part = (n_shard - 1) / n_shard
    fp8 = 2 * part * (linear * 1 + (total - linear) * 2)
    bf16 = 2 * part * total * 2
    reduce_scatter = part * total * gradient_bytes
    return fp8, bf16, reduce_scatter


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--one", required=True, help="metrics of one GPU")
    p.add_argument("--two", required=True, help="metrics of two GPUs, sums overlapped")
    p.add_argument("--two-serial", required=True, help="metrics of two GPUs, distributed.bucket_mb = 0")
    p.add_argument("--check", action="append", default=[], help="N:ONE.jsonl:N.jsonl, a measurement to check")
    p.add_argument("--gpus", type=int, nargs="*", default=[16, 128])
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--net-gbps", type=float, default=45.0)
    p.add_argument("--gradient-bytes", type=int, default=4, help="4: float32 sums, 2: BF16")
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()

    with open(a.config, "rb") as f:
        model_table = tomllib.load(f)["model"]
    total, embedding, linear = parameters(model_table)
    T1 = mean_step_ms(a.one, a.skip)
    T2, T2s = mean_step_ms(a.two, a.skip), mean_step_ms(a.two_serial, a.skip)
    model = StepModel.fit(T1, T2, T2s, total * a.gradient_bytes / 1e9, embedding * a.gradient_bytes / 1e9,
                          a.net_gbps, a.gpus_per_node)
    result = {
        "parameters": total, "embedding": embedding, "linear_weights": linear,
        "one_gpu_ms": T1, "two_gpus_ms": T2, "two_gpus_serial_ms": T2s,
        "nvlink_bus_gbps": model.nv_gbps, "overlapped_share": model.share,
        "checks": [], "predictions": [],
    }
    for check in a.check:
        n, one, many = check.split(":")
        n = int(n)
        t1, measured = mean_step_ms(one, a.skip), mean_step_ms(many, a.skip)
        predicted = model.step_ms(n, t1)
        result["checks"].append({"gpus": n, "one_gpu_ms": t1, "measured_ms": measured, "predicted_ms": predicted,
                                 "error": predicted / measured - 1.0})
    for n in a.gpus:
        nodes = max(1, -(-n // a.gpus_per_node))
        step = model.step_ms(n)
        shard = min(n, a.gpus_per_node)
        fp8, bf16, rs = fsdp_bytes(total, linear, shard, a.gradient_bytes)
        # Fully sharded within a node, replicated across nodes: each GPU's shard summed over the nodes.
        across = all_reduce_ms(total * a.gradient_bytes / shard / 1e9, nodes, 1, a.net_gbps, a.net_gbps)
        result["predictions"].append({
            "gpus": n, "nodes": nodes, "data_parallel_ms": step, "data_parallel_scaling": T1 / step,
            "fsdp_gather_bytes_fp8": fp8, "fsdp_gather_bytes_bf16": bf16, "fsdp_reduce_scatter_bytes": rs,
            "fsdp_across_nodes_ms": across,
            "fsdp_ms": model.fsdp_step_ms(n, total, linear, embedding, a.gradient_bytes),
        })
    if a.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{a.config}: {total:,} parameters ({embedding:,} in the embedding table, {linear:,} in linear weights)")
    print(f"fitted on 2 GPUs: NVLink bus bandwidth {model.nv_gbps:.0f} GB/s, overlapped sums cost "
          f"{model.share * 100:.0f}% of their time; one GPU {T1:.1f} ms, two {T2:.1f} ms (serial sums {T2s:.1f})")
    for c in result["checks"]:
        print(f"check, {c['gpus']} GPUs: measured {c['measured_ms']:.1f} ms, predicted {c['predicted_ms']:.1f} ms "
              f"({c['error'] * 100:+.1f}%) from one GPU's {c['one_gpu_ms']:.1f} ms")
    print("| GPUs | nodes | data parallel ms/step | scaling | FSDP (FP8 gathers) ms/step | scaling "
          "| FSDP gathers a GPU, FP8 / BF16 (GB) | FSDP sums across nodes (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in result["predictions"]:
        print(f"| {r['gpus']} | {r['nodes']} | {r['data_parallel_ms']:.1f} | {r['data_parallel_scaling'] * 100:.0f}% "
              f"| {r['fsdp_ms']:.1f} | {T1 / r['fsdp_ms'] * 100:.0f}% "
              f"| {r['fsdp_gather_bytes_fp8'] / 1e9:.2f} / {r['fsdp_gather_bytes_bf16'] / 1e9:.2f} "
              f"| {r['fsdp_across_nodes_ms']:.1f} |")


if __name__ == "__main__":
    main()
