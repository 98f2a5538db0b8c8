import sys, torch; sys.path.insert(0,'benchmarks'); torch.set_grad_enabled(False)
from infer_vs_hf import minilm_dir, make_inputs
from bertkit.infer import Predictor
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
p = Predictor.from_dir(minilm_dir())
print("wide", p.small.wide and p.small.wide.streams, "rss after load", round(rss()))
if sys.argv[1] == "off": p.small.wide = None
b = make_inputs(p.tokenizer, [128] * 32)
for _ in range(3): [p.hidden(x, torch.float32) for x in p.batches(b["rows"])]
import random; r = random.Random(0); rg = make_inputs(p.tokenizer, sorted([r.randint(8, 128) for _ in range(32)], reverse=True))
for _ in range(3): [p.hidden(x, torch.float32) for x in p.batches(rg["rows"])]
print(sys.argv[1], "rss after 32x128 + ragged", round(rss()))
