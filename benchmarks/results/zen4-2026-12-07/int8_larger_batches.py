"""int8 Predictor (all-MiniLM-L6-v2, 2 threads): where its larger batches go. One call after a 0.3 s
pause; medians of 9 rounds, order random each round.
  pad   32 ragged texts of 8-128 tokens and 32 x 128 on OpenVINO's int8 engine (padded in runs, as the
        Predictor chose at load) or on PyTorch int8 (the engine's max_padding set to 0)
  runs  the ragged texts on PyTorch int8, or on the engine with its padded runs (engines.padded_runs)
        cut where a text would be padded by more than 4, 8, 16, 32 (the default) or 64 positions
usage (from the repository root): python benchmarks/results/zen4-2026-12-07/int8_larger_batches.py pad|runs"""
import random, statistics, sys, time, torch
IM = torch.inference_mode(); IM.__enter__()
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import make_inputs, minilm_dir, bertkit_runner
from bertkit.infer import Predictor, engines
p = Predictor.from_dir(minilm_dir(), int8=True)
print(p.describe()["small_batches"]["reason"])
lengths = [int(x) for x in torch.linspace(128, 8, 32).round().tolist()]
b, fixed = make_inputs(p.tokenizer, lengths), make_inputs(p.tokenizer, [128] * 32)
run, pad, cut = bertkit_runner(p), p.small.max_padding, engines.RUN_OVERHEAD_TOKENS


def on(inp, max_padding=pad, run_tokens=cut):
    def f():
        p.small.max_padding, engines.RUN_OVERHEAD_TOKENS = max_padding, run_tokens
        try:
            return run(inp)          # new batches each call: their padded runs are cut afresh
        finally:
            p.small.max_padding, engines.RUN_OVERHEAD_TOKENS = pad, cut
    return f


if sys.argv[1] == "pad":
    fns = {"ragged engine": on(b), "ragged pytorch": on(b, 0.0), "fixed engine": on(fixed), "fixed pytorch": on(fixed, 0.0)}
else:
    fns = {"ragged pytorch": on(b, 0.0), **{f"ragged runs {k}": on(b, run_tokens=k) for k in (4, 8, 16, 32, 64)}}
times = {k: [] for k in fns}
for k in fns:
    fns[k]()
for r in range(9):
    order = list(fns); random.Random(r).shuffle(order)
    for k in order:
        time.sleep(0.3); t = time.perf_counter(); fns[k](); times[k].append((time.perf_counter() - t) * 1e3)
for k, v in times.items():
    print(f"{k:16s} median {statistics.median(v):.1f} ms  min {min(v):.1f}")
