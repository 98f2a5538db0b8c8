"""Summary of benchmarks/gpu_pretrain.sh: speed and MFU against transformers, and bf16 against fp32.

    python benchmarks/gpu_curves.py OUT [T0]      (prints one JSON object)

bf16 "matches fp32 within noise" is read as: the mean absolute gap between the bf16 and fp32 training
loss curves (same seed, same batches, smoothed over windows of 5 logged points) is at most 1.5x the gap
between two fp32 runs that differ only in the seed, and the final held-out MLM loss of bf16 is within
the larger of 2x the seed gap and 0.05 nats of fp32's.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def jsonl(p: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def smooth(xs: list[float], w: int = 5) -> list[float]:
    return [sum(xs[i:i + w]) / len(xs[i:i + w]) for i in range(0, len(xs), w)]


def run_summary(d: Path) -> dict:
    metrics, evals = jsonl(d / "metrics.jsonl"), jsonl(d / "eval.jsonl")
    if not metrics:
        return {"error": f"no metrics.jsonl in {d.name} (see {d.name}.log)"}
    card = {}
    try:
        card = json.loads((d / "run_card.json").read_text())
    except (OSError, ValueError):
        pass
    last = metrics[-1]
    out = {"updates": last.get("step"), "final_train_loss": last.get("loss"),
           "tokens_per_s_last": last.get("tokens_per_s"), "skipped_updates": last.get("skipped"),
           "final_eval": {k: v for k, v in (evals[-1] if evals else {}).items() if k.startswith("eval_")}}
    for k in ("precision", "precision_reason", "packed", "wall_time_s", "tokens_per_s", "mfu", "world_size",
              "stop_reason", "compile"):
        if k in card:
            out[k] = card[k]
    return out


def curve_gap(a: Path, b: Path) -> float | None:
    la = {m["step"]: m["loss"] for m in jsonl(a / "metrics.jsonl")}
    lb = {m["step"]: m["loss"] for m in jsonl(b / "metrics.jsonl")}
    steps = sorted(set(la) & set(lb))
    if len(steps) < 5:
        return None
    sa, sb = smooth([la[s] for s in steps]), smooth([lb[s] for s in steps])
    return sum(abs(x - y) for x, y in zip(sa, sb)) / len(sa)


def main() -> int:
    out = Path(sys.argv[1])
    t0 = int(sys.argv[2]) if len(sys.argv) > 2 else int(time.time())
    s: dict = {"seconds": round(time.time() - t0)}
    try:
        s["env"] = (out / "env.txt").read_text().strip()
    except OSError:
        pass
    for name, f in (("benchmark", "gpu_pretrain_bench_dropout0.1.json"),
                    ("benchmark_no_dropout", "gpu_pretrain_bench_dropout0.0.json")):
        try:
            b = json.loads((out / f).read_text())
            s[name] = {k: b.get(k) for k in ("speedup_vs_hf", "dropout", "gemm_peak_gflops", "batch", "seq",
                                             "real_token_fraction", "precision", "hardware")}
            s[name]["per_path"] = {p: {k: v for k, v in r.items() if k in ("tokens_per_s", "mfu", "times")}
                                   if isinstance(r, dict) else r for p, r in b["results"]["base"].items()}
        except (OSError, ValueError, KeyError) as e:
            s[name] = {"error": f"{type(e).__name__}: {e} (see bench.err)"}
    runs = ["curve_bf16", "curve_fp32", "curve_fp32_seed1", "curve_fp16", "compile", "torchrun"]
    s["runs"] = {r: run_summary(out / r) for r in runs if (out / r).exists()}
    bf16_gap = curve_gap(out / "curve_bf16", out / "curve_fp32")
    seed_gap = curve_gap(out / "curve_fp32_seed1", out / "curve_fp32")
    if bf16_gap is not None and seed_gap is not None:
        ev = {r: s["runs"][r]["final_eval"].get("eval_mlm_loss") for r in ("curve_bf16", "curve_fp32", "curve_fp32_seed1")}
        eval_gap = abs(ev["curve_bf16"] - ev["curve_fp32"]) if None not in ev.values() else None
        eval_seed = abs(ev["curve_fp32_seed1"] - ev["curve_fp32"]) if None not in ev.values() else None
        s["bf16_vs_fp32"] = {
            "train_loss_gap_bf16_fp32": round(bf16_gap, 4), "train_loss_gap_seed": round(seed_gap, 4),
            "eval_mlm_loss": ev, "eval_gap_bf16_fp32": eval_gap, "eval_gap_seed": eval_seed,
            "within_noise": bool(bf16_gap <= 1.5 * seed_gap and eval_gap is not None
                                 and eval_gap <= max(2 * eval_seed, 0.05)),
            "rule": "curve gap <= 1.5x the seed gap, held-out loss gap <= max(2x seed gap, 0.05)"}
    print(json.dumps(s, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
