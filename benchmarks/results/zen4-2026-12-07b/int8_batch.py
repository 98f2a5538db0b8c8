"""onnxruntime's int8 engine graph (per-tensor activation scales): a text's mean-pooled state alone against
in a padded batch with others; OpenVINO's int8 engine (groups of 128 per token) the same."""
import sys, numpy as np, torch
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
from bertkit.checkpoint import load_model
from bertkit.infer import graph, engines, choose
from bertkit.infer.engines import encoder_of
from bertkit.infer.int8 import int8_weight_levels
from bertkit.tokenizer import Tokenizer
path = minilm_dir()
enc = encoder_of(load_model(path, random_init=False).eval())
tok = Tokenizer.from_dir(path)
lines = choose.sample_lines()
rows = [r for r, _ in choose.sample_rows(tok, 128)]
rows = sorted(rows, key=len, reverse=True)[:16]
T = max(map(len, rows))
ids = np.zeros((len(rows), T), np.int64); mask = np.zeros_like(ids)
for i, r in enumerate(rows): ids[i, :len(r)] = r; mask[i, :len(r)] = 1
types = np.zeros_like(ids)
def pooled(h, m): return (h * m[..., None]).sum(1) / m.sum(1, keepdims=True)
def cos(a, b): return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
calib = None
runners = {"onnxruntime int8 (all-int8)": engines.OnnxRuntimeGraph(graph.encoder_graph(enc, True, fused=True, levels=int8_weight_levels(), down_int8=True), 2, "int8"),
           "openvino int8 (groups 128)": engines.OpenVINOGraph(graph.encoder_graph(enc, True), 2, None, 128),
           "openvino bf16": engines.OpenVINOGraph(graph.encoder_graph(enc), 2)}
for name, r in runners.items():
    together = pooled(r.run(ids, mask, types), mask)
    alone = np.stack([pooled(r.run(ids[i:i+1, :mask[i].sum()], mask[i:i+1, :mask[i].sum()], types[i:i+1, :mask[i].sum()]), mask[i:i+1, :mask[i].sum()])[0] for i in range(len(rows))])
    c = cos(together, alone)
    print(f"{name:30s} alone vs in a batch of {len(rows)}: cosine min {c.min():.5f} mean {c.mean():.5f}, max abs {np.abs(together-alone).max():.4f}")
