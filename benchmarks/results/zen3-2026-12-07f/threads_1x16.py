import sys, time, statistics, random
sys.path.insert(0, "/work/main/benchmarks")
import numpy as np, torch
IM = torch.inference_mode(); IM.__enter__()
from infer_vs_hf import minilm_dir, make_inputs
from bertkit.infer import Predictor
from bertkit.infer.engines import torch_threads
p = Predictor.from_dir(minilm_dir(), device="cpu")
b = make_inputs(p.tokenizer, [16])
eng = p.small; sess = eng.runner.session
feeds = {k: b["numpy"][k] for k in ("input_ids", "attention_mask", "token_type_ids")}
def f_sess(): sess.run(None, feeds)
def f_sess_t1():
    with torch_threads(1): sess.run(None, feeds)
fs = dict(sess=f_sess, sess_t1=f_sess_t1)
T = {k: [] for k in fs}; F = {k: [] for k in fs}
rng = random.Random(2)
for r in range(80):
    for k in rng.sample(list(fs), len(fs)):
        time.sleep(0.05)
        t0 = time.perf_counter(); fs[k](); t1 = time.perf_counter()
        for _ in range(20): fs[k]()
        T[k].append((time.perf_counter() - t1) / 20 * 1e3); F[k].append((t1 - t0) * 1e3)
for k in fs:
    print(f"{k:10s} first {statistics.median(F[k]):.3f}  in a row {statistics.median(T[k]):.3f} ms")
w = sum(a < b for a, b in zip(T["sess"], T["sess_t1"]))
print("sess faster in a row in", w, "of", len(T["sess"]))
