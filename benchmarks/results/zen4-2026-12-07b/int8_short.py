"""1 x 16 latency and sample agreement of int8 engine graphs: onnxruntime with its fused attention
(the Predictor's engine) and with standard attention (as `export --int8` writes it), OpenVINO int8
(groups of 128) and OpenVINO bf16; 2 threads, 10 calls a timing, order random, medians of rounds."""
import random, statistics, sys, time
import numpy as np, torch
torch.set_num_threads(2); torch.set_grad_enabled(False)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
from bertkit.checkpoint import load_model
from bertkit.infer import graph, engines, choose, Predictor
from bertkit.infer.engines import encoder_of, GraphEngine
from bertkit.infer.int8 import int8_weight_levels
d = minilm_dir()
p = Predictor.from_dir(d, device="cpu", int8=True, small_batches=False)
fp32 = encoder_of(load_model(d, random_init=False).eval())
rows = choose.sample_rows(p.tokenizer, p.max_length)
ranges = graph.ffn_input_ranges(fp32, p.batches(rows, 8))
lv = int8_weight_levels()
R = {"ort fused attention": engines.OnnxRuntimeGraph(graph.encoder_graph(fp32, True, fused=True, levels=lv, ranges=ranges, down_int8=True), 2, "int8"),
     "ort standard attention": engines.OnnxRuntimeGraph(graph.encoder_graph(fp32, True, fused=True, levels=lv, ranges=ranges, down_int8=True, fused_inputs=False), 2, "int8"),
     "openvino int8": engines.OpenVINOGraph(graph.encoder_graph(fp32, True), 2, None, 128),
     "openvino bf16": engines.OpenVINOGraph(graph.encoder_graph(fp32), 2)}
for k, r in R.items():
    a = choose._agreement(p, GraphEngine(r, k), rows, fp32)
    print(f"{k:24s} sample cosine {a['cosine_min']:.4f} (bar {min(0.99, p.precision_check['cosine_min']):.4f})")
ids = np.array([rows[0][0][:16]], np.int64); m = np.ones_like(ids); t = np.zeros_like(ids)
times = {k: [] for k in R}
for rd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 30):
    for k in random.Random(rd).sample(list(R), len(R)):
        time.sleep(0.1); s = time.perf_counter()
        for _ in range(10): R[k].run(ids, m, t)
        times[k].append((time.perf_counter() - s) / 10 * 1e3)
for k, v in times.items():
    print(f"{k:24s} 1 x 16 median {statistics.median(v):.3f} ms  min {min(v):.3f}")
