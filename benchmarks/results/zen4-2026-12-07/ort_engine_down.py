"""usage (from the repository root): python benchmarks/results/zen4-2026-12-07/ort_engine_down.py
The Predictor's onnxruntime int8 engine (graph.py, fused inputs, the FFN input smoothed, 8-bit weights here)
with the FFN's down projection fp32 (now) or int8: agreement on the sample (the int8 class needs 0.99) and
speed at 1 x 16, 1 x 64, 8 x 128, beside PyTorch int8 (the Predictor's model), medians of 15 rounds."""
import random, statistics, sys, time
import numpy as np, torch
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
from bertkit.checkpoint import load_model
from bertkit.infer import Predictor, choose, engines, graph
from bertkit.infer.engines import encoder_of, GraphEngine, TorchEngine
p = Predictor.from_dir(minilm_dir(), int8=True, small_batches=False)
fp32 = encoder_of(load_model(minilm_dir(), random_init=False).eval())
rows = choose.sample_rows(p.tokenizer, p.max_length)
ranges = graph.ffn_input_ranges(fp32, p.batches(rows, 8))
lv = choose.int8_weight_levels()
runners = {d: engines.load_runner("onnxruntime", graph.encoder_graph(fp32, True, fused=True, levels=lv, ranges=ranges, down_int8=d), 2, None, 384)
           for d in (False, True)}
names = {False: "ort down fp32", True: "ort down int8"}
with torch.inference_mode():
    for d, run in runners.items():
        a = choose._agreement(p, GraphEngine(run, "onnxruntime"), rows, fp32)
        print(f"{names[d]:14s} pooled {a['cosine_min']:.5f} token {a['token_cosine_min']:.5f} ok {a['ok']}", flush=True)
    print("pytorch int8 model's own", p.precision_check["cosine_min"])
    tok = p.tokenizer
    def batch(B, T):
        return p.batches([([101] + [2000 + i for i in range(T - 2)] + [102], [0] * T)] * B, batch_size=B)[0]
    shapes = {"1x16": (batch(1, 16), 10), "1x64": (batch(1, 64), 5), "8x128": (batch(8, 128), 1)}
    torch_engine = TorchEngine(p.model)
    fns = {names[d]: GraphEngine(r, "onnxruntime", max_tokens=1 << 20) for d, r in runners.items()}
    times = {(k, s): [] for k in [*fns, "pytorch int8"] for s in shapes}
    for rd in range(15):
        order = list(times); random.Random(rd).shuffle(order)
        for k, s in order:
            b, n = shapes[s]; time.sleep(0.2); t = time.perf_counter()
            for _ in range(n):
                (torch_engine if k == "pytorch int8" else fns[k]).run(b)
            times[(k, s)].append((time.perf_counter() - t) / n * 1e3)
for k in [*fns, "pytorch int8"]:
    print(f"{k:14s} " + "  ".join(f"{s} {statistics.median(times[(k, s)]):.2f} ms" for s in shapes))
