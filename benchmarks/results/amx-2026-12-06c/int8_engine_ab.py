"""int8=True's PyTorch path with its weights packed by torch's x86 engine (fbgemm) against oneDNN's, in one
process, beside the bf16 default (every Predictor's short-input engine off: PyTorch alone) and the int8
Predictor as it loads (OpenVINO int8 for short batches). Texts: words of the README, 32 ragged (6-100
words), 32 of 90 words, one of 12; best of 9 interleaved rounds, ms.

    PYTHONPATH=src python benchmarks/results/amx-2026-12-06c/int8_engine_ab.py
"""
import random
import sys

import torch

torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir  # noqa: E402

from bertkit import hardware  # noqa: E402
from bertkit.hardware import best_times  # noqa: E402
from bertkit.infer import Predictor  # noqa: E402

ps = {}
for eng in ("x86", "onednn"):
    hardware.int8_engine = lambda h, i, e=eng: e
    ps[f"int8 {eng}, PyTorch only"] = Predictor.from_dir(minilm_dir(), device="cpu", int8=True)
    ps[f"int8 {eng}, PyTorch only"].small = None
ps["bf16 default, PyTorch only"] = Predictor.from_dir(minilm_dir(), device="cpu")
ps["bf16 default, PyTorch only"].small = None
ps["int8 onednn as loaded"] = Predictor.from_dir(minilm_dir(), device="cpu", int8=True)
words = open("README.md").read().split()
rng = random.Random(0)
ragged = [" ".join(rng.sample(words, rng.randint(6, 100))) for _ in range(32)]
fixed = [" ".join(rng.sample(words, 90)) for _ in range(32)]
one = [" ".join(rng.sample(words, 12))]
for name, texts in (("ragged", ragged), ("fixed", fixed), ("one", one)):
    t = best_times([lambda p=p: p.embed(texts) for p in ps.values()], 9)
    print(name, {k: round(v * 1e3, 2) for k, v in zip(ps, t)}, flush=True)
