import sys, time, statistics, random
sys.path.insert(0, "/work/main/benchmarks")
import numpy as np, torch
IM = torch.inference_mode(); IM.__enter__()
from infer_vs_hf import minilm_dir, make_inputs
from bertkit.infer import Predictor
from bertkit.infer.engines import torch_threads
p = Predictor.from_dir(minilm_dir(), device="cpu")
b = make_inputs(p.tokenizer, [16])
batch = p.batches(b["rows"])[0]
eng = p.small; sess = eng.runner.session
feeds = {k: b["numpy"][k] for k in ("input_ids", "attention_mask", "token_type_ids")}
t0 = time.perf_counter()
for _ in range(2000):
    with torch_threads(1): pass
print("torch_threads(1) enter/exit us", (time.perf_counter() - t0) / 2000 * 1e6)
real = eng.runner.run
out = real(*feeds.values())
eng.runner.run = lambda *a: out
t0 = time.perf_counter()
for _ in range(2000): p.hidden(batch, torch.float32)
print("hidden with instant runner us", (time.perf_counter() - t0) / 2000 * 1e6)
eng.runner.run = real
def f_hidden(): p.hidden(batch, torch.float32)
def f_sess(): sess.run(None, feeds)
def f_sess_t1():
    with torch_threads(1): sess.run(None, feeds)
fs = dict(hidden=f_hidden, sess=f_sess, sess_t1=f_sess_t1)
T = {k: [] for k in fs}; F = {k: [] for k in fs}
rng = random.Random(1)
for r in range(40):
    for k in rng.sample(list(fs), len(fs)):
        time.sleep(0.1)
        t0 = time.perf_counter(); fs[k](); t1 = time.perf_counter()
        for _ in range(10): fs[k]()
        T[k].append((time.perf_counter() - t1) / 10 * 1e3); F[k].append((t1 - t0) * 1e3)
for k in fs:
    print(f"{k:10s} first {statistics.median(F[k]):.3f}  in a row {statistics.median(T[k]):.3f} ms")
