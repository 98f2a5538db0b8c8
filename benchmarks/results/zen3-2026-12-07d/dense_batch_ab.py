"""_dense's ratio (PyTorch time / engine time, best of 7 interleaved) at DENSE_BATCH 8 and 32, repeated."""
import time, torch, sys, numpy as np
from dataclasses import replace
IM = torch.inference_mode(); IM.__enter__()
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
from bertkit.infer import Predictor, choose
torch.set_num_threads(2)
int8 = sys.argv[1] == "int8"
p = Predictor.from_dir(minilm_dir(), int8=int8)
print(p.small_reason)
c = p.small
n = torch.get_num_threads()
wide = c.wide or c.runner.reload(n) if c.runner.threads < n else None
eng = replace(c, runner=wide) if wide else c
lines = choose.sample_lines()
stream = [i for l in lines for i in p.tokenizer.encode(l).input_ids[1:-1]]
tok, T = p.tokenizer, 128
def batch(B):
    rows = [[tok.cls_id, *(stream[(i * (T - 2) + j) % len(stream)] for j in range(T - 2)), tok.sep_id] for i in range(B)]
    return p.batches([(r, [0] * T) for r in rows], batch_size=B)[0]
bs = {8: batch(8), 32: batch(32)}
for rep in range(4):
    for B in (8, 32):
        t0 = time.perf_counter()
        tt, te = choose._timed([(p.engine, bs[B]), (eng, bs[B])])
        print(f"rep {rep} B={B}: torch {tt:.1f} ms engine {te:.1f} ms ratio {tt/te:.3f} took {time.perf_counter()-t0:.1f} s", flush=True)
