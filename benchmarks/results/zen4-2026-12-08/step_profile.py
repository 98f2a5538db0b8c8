"""Where bertkit's BERT-mini pre-training step goes (padded path, bf16 autocast, attention kernel as
training picks it): torch's profiler over 4 steps after 2 warm-up steps, ops by self CPU time."""
import sys, tempfile
from pathlib import Path
import torch
sys.path.insert(0, "benchmarks")
import pretrain_vs_hf as pv
from bertkit.heap import Heap
Heap().keep_freed()
torch.set_num_threads(2)
tmp = Path(tempfile.mkdtemp())
batches = pv.make_batches(2, 32, 128, tmp)
ours, hf, cfg = pv.build_pair("mini", tmp)
from bertkit.hardware import attention_kernel
from bertkit.model import set_attention_kernel
k, why = attention_kernel(torch.device("cpu"), torch.bfloat16, cfg, 128)
set_attention_kernel(ours, k); print(k, why)
opt = torch.optim.AdamW(ours.parameters(), lr=1e-4, fused=True)
step = pv.step_fn("padded", ours, opt, torch.bfloat16)
for b in batches: step(b)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(2):
        for b in batches: step(b)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=int(sys.argv[1]) if len(sys.argv) > 1 else 40))
