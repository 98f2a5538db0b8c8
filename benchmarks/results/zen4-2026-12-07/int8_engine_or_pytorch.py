"""int8 Predictor (all-MiniLM-L6-v2, 2 threads): 32 ragged texts of 8-128 tokens and 32 x 128, the larger
batches on OpenVINO's int8 engine (padded in runs, as the Predictor chose at load) or on PyTorch int8
(the engine's max_padding set to 0). One call after a 0.3 s pause; medians of 9 rounds, order random.
usage (from the repository root): python benchmarks/results/zen4-2026-12-07/int8_engine_or_pytorch.py"""
import random, statistics, sys, time, torch
IM = torch.inference_mode(); IM.__enter__()
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import make_inputs, minilm_dir, bertkit_runner
from bertkit.infer import Predictor
p = Predictor.from_dir(minilm_dir(), int8=True)
print(p.describe()["small_batches"]["reason"])
lengths = [int(x) for x in torch.linspace(128, 8, 32).round().tolist()]
b = make_inputs(p.tokenizer, lengths)
fixed = make_inputs(p.tokenizer, [128] * 32)
run = bertkit_runner(p)
pad = p.small.max_padding
def with_pad(x, inp):
    def f():
        p.small.max_padding = x
        try:
            return run(inp)
        finally:
            p.small.max_padding = pad
    return f
fns = {"ragged engine": with_pad(pad, b), "ragged pytorch": with_pad(0.0, b),
       "fixed engine": with_pad(pad, fixed), "fixed pytorch": with_pad(0.0, fixed)}
times = {k: [] for k in fns}
for k in fns: fns[k]()
for r in range(9):
    order = list(fns); random.Random(r).shuffle(order)
    for k in order:
        time.sleep(0.3); t = time.perf_counter(); fns[k](); times[k].append((time.perf_counter() - t) * 1e3)
for k, v in times.items():
    print(f"{k:16s} median {statistics.median(v):.1f} ms  min {min(v):.1f}")
