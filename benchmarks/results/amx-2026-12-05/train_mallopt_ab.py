"""In one process: a BERT-mini bf16 pre-training step (packed) with glibc forced to map large blocks afresh
(mmap and trim thresholds 128 kB) against freed blocks kept (1 GiB), alternating rounds. Usage: python train_mallopt_ab.py 10"""
import sys, time, statistics, torch, ctypes, resource, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # benchmarks/
import pretrain_vs_hf as P
from bertkit.model import set_attention_kernel
libc = ctypes.CDLL("libc.so.6")
def setm(big):
    if big: libc.mallopt(-3, 1 << 30); libc.mallopt(-1, 1 << 30)
    else: libc.mallopt(-3, 128 * 1024); libc.mallopt(-1, 128 * 1024); libc.malloc_trim(0)
torch.set_num_threads(2)
tmp = Path(tempfile.mkdtemp())
batches = P.make_batches(2, 32, 128, tmp)
ours, hf, cfg = P.build_pair("mini", tmp)
set_attention_kernel(ours, "math")
step = P.step_fn("packed", ours, torch.optim.AdamW(ours.parameters(), lr=1e-4, fused=True), torch.bfloat16)
for b in batches: step(b)
t = {0: [], 1: []}; f = {0: 0, 1: 0}
N = int(sys.argv[1])
for rep in range(N):
    for m in ((0, 1) if rep % 2 else (1, 0)):
        setm(m); step(batches[0])
        time.sleep(0.05); f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        for b in batches: step(b)
        t[m].append((time.perf_counter() - t0) * 1e3 / len(batches)); f[m] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
print("step: mmap %.0f ms (%d faults/step), heap %.0f ms (%d faults/step); heap/mmap per round %.3f" % (
    statistics.median(t[0]), f[0] / N / 2, statistics.median(t[1]), f[1] / N / 2, statistics.median([b / a for a, b in zip(t[0], t[1])])))
