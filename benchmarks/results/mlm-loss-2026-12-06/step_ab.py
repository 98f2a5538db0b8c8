"""BERT-mini's training step (pretrain_vs_hf.py's padded bertkit path, 32 x 128, dropout 0.1, fused AdamW,
the attention kernel training picks, denormals flushed, freed blocks kept) with one piece as it was at
d2c042c and as it is now, swapped in one process: `loss`, the MLM loss (`ce_micro.Before` against
`packing.cross_entropy`); `dropout`, dropout's random bits (`dropout_micro.before` against
`packing.dropout`); `qkv`, the attention's Q, K and V as three Linear calls against `packing.linears`
(one GEMM under CPU autocast). Each round times 4 steps with each, the order alternating; the median step time
and the ratio per round.

    PYTHONPATH=src python benchmarks/results/mlm-loss-2026-12-06/step_ab.py loss|dropout|qkv bf16|fp32 ROUNDS
"""
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]
import pretrain_vs_hf as B                                   # noqa: E402
from ce_micro import Before                                  # noqa: E402
from dropout_micro import before as before_dropout           # noqa: E402

import bertkit.model as M                                    # noqa: E402
import bertkit.packing as P                                  # noqa: E402
from bertkit.hardware import attention_kernel, denormals_flushed   # noqa: E402
from bertkit.heap import Heap                                # noqa: E402


def before_dropout_p(x, p, training=True):
    return before_dropout(x, p) if training else x


torch.set_num_threads(2)
Heap().keep_freed()
piece, precision, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
module, attr, fns = {"loss": (M, "cross_entropy", {"before": lambda l, t: Before.apply(l, t), "now": M.cross_entropy}),
                     "dropout": (P, "dropout", {"before": before_dropout_p, "now": P.dropout}),
                     "qkv": (M, "linears", {"before": lambda x, *layers: tuple(f(x) for f in layers),
                                            "now": M.linears})}[piece]
dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
tmp = Path(tempfile.mkdtemp())
batches = B.make_batches(2, 32, 128, tmp)
ours, hf, cfg = B.build_pair("mini", tmp)
M.set_attention_kernel(ours, attention_kernel(torch.device("cpu"), dt, cfg, 128)[0])
step = B.step_fn("padded", ours, torch.optim.AdamW(ours.parameters(), lr=1e-4, fused=True), dt)
times = {k: [] for k in fns}
with denormals_flushed():
    for i in range(4):
        step(batches[i % 2])
    for r in range(rounds):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            setattr(module, attr, fns[name])
            t = time.perf_counter()
            for i in range(4):
                step(batches[i % 2])
            times[name].append((time.perf_counter() - t) / 4)
b, n = statistics.median(times["before"]), statistics.median(times["now"])
print(precision, f"before {b * 1e3:.1f} ms, now {n * 1e3:.1f} ms a step: {b / n:.3f}x; per round:",
      [round(x / y, 3) for x, y in zip(times["before"], times["now"])])
