"""What the default Predictor's own path adds around its short-batch engine on one 16-token text: batches
and `hidden` with the engine's runner made to return at once (2,000 calls, three times), and torch's
thread switch alone. usage (from the repository root): python benchmarks/results/zen4-2026-12-07/wrapper_cost.py"""
import sys, time, torch
IM = torch.inference_mode(); IM.__enter__()
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import make_inputs, minilm_dir
from bertkit.infer import Predictor
from bertkit.infer.engines import torch_threads
p = Predictor.from_dir(minilm_dir(), device="cpu")
b = make_inputs(p.tokenizer, [16])
runner = p.small.runner
feeds = [b["numpy"][k] for k in ("input_ids", "attention_mask", "token_type_ids")]
real, out = runner.run, runner.run(*feeds)
runner.run = lambda *a: out
for _ in range(3):
    t0 = time.perf_counter()
    for _ in range(2000):
        [p.hidden(x, torch.float32) for x in p.batches(b["rows"])]
    print("batches+hidden with instant runner us", (time.perf_counter() - t0) / 2000 * 1e6)
    t0 = time.perf_counter()
    for _ in range(2000):
        with torch_threads(1):
            pass
    print("torch_threads(1) us", (time.perf_counter() - t0) / 2000 * 1e6)
