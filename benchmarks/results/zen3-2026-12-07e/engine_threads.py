"""Does the choice of short-batch engine depend on the threads it is timed on? The Predictor's
engines (graph.py's graph on onnxruntime and on OpenVINO, fp32, as `choose.load_engines` builds them)
on one thread and on torch's two, beside PyTorch, on one sequence of 16 and of 64 tokens, timed as the
choice at load times them (`choose._timed`: interleaved, bursts, quiet before each) and as the table
times a short request (10 calls in a row after a 0.3 s pause, mean; medians over rounds).
usage: python engine_threads.py [ROUNDS]"""
import sys, time
import numpy as np, torch
IM = torch.inference_mode(); IM.__enter__()
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
from bertkit.checkpoint import load_model
from bertkit.infer import Predictor, choose
from bertkit.infer.engines import GraphEngine, encoder_of

p = Predictor.from_dir(minilm_dir(), small_batches=False)
runners, why = choose.load_engines(encoder_of(load_model(minilm_dir()).eval()), 1, "float32")
engines = {}
for name, r in runners.items():
    engines[f"{name} x1"] = GraphEngine(r, name, threads=1, max_tokens=10**6)
    engines[f"{name} x2"] = GraphEngine(r.reload(2), name, threads=1, max_tokens=10**6)
tok = p.tokenizer
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
for n in (16, 64):
    b = p.batches([([tok.cls_id, *range(2000, 2000 + n - 2), tok.sep_id], [0] * n)])[0]
    calls = [(p.engine, b), *((e, b) for e in engines.values())]
    loads = [choose._timed(calls) for _ in range(rounds)]
    names = ["PyTorch", *engines]
    print(f"{n} tokens, as timed at load (best of {choose.TIMING_ROUNDS} interleaved bursts; {rounds} timings):")
    for i, k in enumerate(names):
        print(f"   {k:16} " + " ".join(f"{t[i]:6.2f}" for t in loads) + " ms")
    row = {k: [] for k in names}
    fns = {"PyTorch": lambda: p.engine.run(b), **{k: (lambda e=e: e.run(b)) for k, e in engines.items()}}
    for r in range(15):
        for k in (names if r % 2 == 0 else names[::-1]):
            time.sleep(0.3); t = time.perf_counter()
            for _ in range(10):
                fns[k]()
            row[k].append((time.perf_counter() - t) / 10 * 1e3)
    print(f"{n} tokens, 10 calls after a 0.3 s pause (median of 15 rounds): " +
          ", ".join(f"{k} {np.median(v):.2f}" for k, v in row.items()) + " ms")
