"""What the default Predictor adds around its short-batch engine's call on one 16-token text: the Python
of `Predictor.hidden` (its runner made to return at once), torch's thread switch (`torch_threads`), and
four calls timed interleaved: `hidden` (the Predictor), `sess` (the engine's own onnxruntime session,
bare) and `sess_t1` (the same inside `torch_threads(1)`). One timing: a pause, the first call, then CALLS
calls in a row; medians over ROUNDS, contenders in a random order each round.
usage (from the repository root): python benchmarks/results/zen3-2026-12-07f/wrapper_1x16.py
    [ROUNDS] [CALLS] [PAUSE_S] [SEED] [NAMES]      (defaults 40 10 0.1 1 hidden,sess,sess_t1)"""
import random, statistics, sys, time
import torch
IM = torch.inference_mode(); IM.__enter__()
sys.path.insert(0, "benchmarks")
from infer_vs_hf import make_inputs, minilm_dir
from bertkit.infer import Predictor
from bertkit.infer.engines import torch_threads

rounds, calls, pause, seed = (int(sys.argv[1]) if len(sys.argv) > 1 else 40, int(sys.argv[2]) if len(sys.argv) > 2 else 10,
                              float(sys.argv[3]) if len(sys.argv) > 3 else 0.1, int(sys.argv[4]) if len(sys.argv) > 4 else 1)
names = sys.argv[5].split(",") if len(sys.argv) > 5 else ["hidden", "sess", "sess_t1"]
p = Predictor.from_dir(minilm_dir(), device="cpu")
b = make_inputs(p.tokenizer, [16])
batch = p.batches(b["rows"])[0]
runner = p.small.runner
feeds = {k: b["numpy"][k] for k in ("input_ids", "attention_mask", "token_type_ids")}

if "hidden" in names:
    t0 = time.perf_counter()
    for _ in range(2000):
        with torch_threads(1):
            pass
    print("torch_threads(1) enter/exit us", (time.perf_counter() - t0) / 2000 * 1e6)
    real, out = runner.run, runner.run(*feeds.values())
    runner.run = lambda *a: out
    t0 = time.perf_counter()
    for _ in range(2000):
        p.hidden(batch, torch.float32)
    print("hidden with instant runner us", (time.perf_counter() - t0) / 2000 * 1e6)
    runner.run = real


def sess_t1():
    with torch_threads(1):
        runner.session.run(None, feeds)


fs = {"hidden": lambda: p.hidden(batch, torch.float32), "sess": lambda: runner.session.run(None, feeds), "sess_t1": sess_t1}
fs = {k: fs[k] for k in names}
row, first, rng = {k: [] for k in fs}, {k: [] for k in fs}, random.Random(seed)
for _ in range(rounds):
    for k in rng.sample(list(fs), len(fs)):
        time.sleep(pause)
        t0 = time.perf_counter(); fs[k](); t1 = time.perf_counter()
        for _ in range(calls):
            fs[k]()
        row[k].append((time.perf_counter() - t1) / calls * 1e3); first[k].append((t1 - t0) * 1e3)
for k in fs:
    print(f"{k:10s} first {statistics.median(first[k]):.3f}  in a row {statistics.median(row[k]):.3f} ms")
if {"sess", "sess_t1"} <= set(fs):
    print("sess faster in a row in", sum(a < c for a, c in zip(row["sess"], row["sess_t1"])), "of", rounds)
