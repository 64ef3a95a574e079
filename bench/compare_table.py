"""What the comparison scripts' tables share (bench/compare.sh, compare_llama.sh, compare_moe.sh): reading
the runs' JSON results, formatting numbers and ratios, and the table's first line. The scripts put their own
directory on PYTHONPATH."""
import json


def load(path, last_line=False):
    """A run's JSON result, or None where the run failed or was not run. last_line: the last line that opens
    a JSON object (the peers print progress before it)."""
    try:
        with open(path) as f:
            text = f.read()
        if last_line:
            lines = [l for l in text.splitlines() if l.startswith("{")]
            return json.loads(lines[-1]) if lines else None
        return json.loads(text)
    except (OSError, ValueError):
        return None


def number(value, digits=0):
    return "-" if value is None else f"{value:,.{digits}f}"


def ratio(a, b):
    # Three decimals: the targets are ratios like 1.40, which a rounded 1.396 must not seem to meet.
    return "-" if a is None or b is None or b == 0 else f"{a / b:.3f}"


def gpu_line(out, steps, warmup):
    gpu = open(f"{out}/gpu.txt").read().strip()
    return f"GPU: {gpu}. Random tokens; each run timed over {steps} steps after {warmup} warm-up steps."
