"""In one process: the Predictor with the FFN padded once (PrepackedFeedForward) against each GEMM padding its own rows.
Usage: python ffn_pad_once_ab.py 20"""
import sys, time, statistics, torch, random, copy
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))   # benchmarks/
import infer_vs_hf as B
from torch import nn
from bertkit.infer import Predictor
from bertkit.infer.prepack import PrepackedFeedForward
torch.set_num_threads(2)
path = B.minilm_dir()
new = Predictor.from_dir(path, device="cpu", small_batches=False)
old = Predictor.from_dir(path, device="cpu", small_batches=False)
class OldFF(nn.Module):
    def __init__(self, f): super().__init__(); self.up, self.down, self.act = f.up, f.down, f.act
    def forward(self, x): return self.down(self.act(self.up(x)))
n_sw = 0
for m in old.model.modules():
    for name, c in list(m.named_children()):
        if isinstance(c, PrepackedFeedForward):
            setattr(m, name, OldFF(c)); n_sw += 1
print("swapped", n_sw)
rng = random.Random(0)
rag = B.make_inputs(new.tokenizer, [rng.randint(8, 128) for _ in range(32)]); fix = B.make_inputs(new.tokenizer, [128]*32)
small = B.make_inputs(new.tokenizer, [rng.randint(8, 40) for _ in range(8)])
runs = {"new": B.bertkit_runner(new), "old": B.bertkit_runner(old)}
W = {"rag": rag, "fix": fix, "small8": small}
t = {(n, k): [] for n in runs for k in W}
with torch.inference_mode():
    for n, r in runs.items():
        for b in W.values(): r(b)
    a, b_ = runs["new"](rag)(), runs["old"](rag)()
    print("max diff", abs(a - b_).max())
    for rep in range(int(sys.argv[1])):
        for k, b in W.items():
            for n in (["new", "old"] if rep % 2 else ["old", "new"]):
                time.sleep(0.1); t0 = time.perf_counter(); runs[n](b); t[(n, k)].append((time.perf_counter() - t0) * 1e3)
for k in W:
    rat = [o / n for n, o in zip(t[("new", k)], t[("old", k)])]
    print(k, "new %.1f old %.1f ms; old/new per round median %.3f" % (statistics.median(t[("new", k)]), statistics.median(t[("old", k)]), statistics.median(rat)))
