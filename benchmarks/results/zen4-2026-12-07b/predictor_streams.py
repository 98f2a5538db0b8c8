import random, statistics, sys, time, tempfile, random as R
from pathlib import Path
import numpy as np, torch
torch.set_num_threads(2); torch.set_grad_enabled(False)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir, make_inputs, bertkit_runner, openvino_runner, export_transformers_graph
from bertkit.infer import Predictor, engines, graph
from bertkit.infer.engines import encoder_of
from bertkit.checkpoint import load_model
import openvino as ov
int8 = len(sys.argv) > 1 and sys.argv[1] == "int8"
p = Predictor.from_dir(minilm_dir(), int8=int8) if int8 else Predictor.from_dir(minilm_dir())
print(p.small_reason)
print("runner threads", p.small.runner.threads, "wide", p.small.wide and p.small.wide.threads, "max_padding", p.small.max_padding)
enc = encoder_of(load_model(minilm_dir(), random_init=False).eval())
g = graph.encoder_graph(enc, int8)
two = engines.load_runner("openvino", g, 2, None, 128 if int8 else 0, streams=2)
one = p.small.wide or p.small.runner
tmp = Path(tempfile.mkdtemp()); export_transformers_graph(minilm_dir(), tmp / "t.onnx")
core = ov.Core()
ovc = openvino_runner(core.compile_model(core.read_model(str(tmp / "t.onnx")), "CPU", {"INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY"}))
fixed = make_inputs(p.tokenizer, [128] * 32)
rng = R.Random(0); ragged = make_inputs(p.tokenizer, sorted([rng.randint(8, 128) for _ in range(32)], reverse=True))
bk = bertkit_runner(p)
def with_wide(r):
    def f(b):
        p.small.wide = r
        return bk(b)
    return f
cases = {}
for wl, b in [("fixed", fixed), ("ragged", ragged)]:
    cases[f"{wl} bertkit"] = (with_wide(one), b)
    cases[f"{wl} bertkit streams"] = (with_wide(two), b)
    cases[f"{wl} OpenVINO"] = (ovc, b)
ref = {}
for k, (f, b) in cases.items():
    e = f(b)(); wl = k.split()[0]
    if wl in ref:
        c = (e * ref[wl]).sum(1) / np.linalg.norm(e, axis=1) / np.linalg.norm(ref[wl], axis=1)
        print(k, "min cos to first", c.min())
    else: ref[wl] = e
times = {k: [] for k in cases}
for rd in range(int(sys.argv[2]) if len(sys.argv) > 2 else 9):
    order = list(cases); R.Random(rd).shuffle(order)
    for k in order:
        f, b = cases[k]; f(b)
        t = time.perf_counter()
        for _ in range(3): f(b)
        times[k].append((time.perf_counter() - t) / 3 * 1e3)
for k, v in times.items():
    print(f"{k:24s} median {statistics.median(v):8.2f} ms  min {min(v):8.2f}")
