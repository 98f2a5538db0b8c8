import sys, torch
if sys.argv[1] == "ftz":
    torch.set_flush_denormal(True)          # before any worker thread exists
import tempfile, time, hashlib
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import pretrain_vs_hf as P
from bertkit import preset
from bertkit.checkpoint import build
from bertkit.model import init_weights, set_attention_kernel
torch.set_num_threads(2)
tmp = Path(tempfile.mkdtemp())
batches = P.make_batches(6, 32, 128, tmp)
alibi = sys.argv[2] == "alibi"
cfg = preset(sys.argv[3], vocab_size=30522, position_embedding_type="alibi" if alibi else "absolute", norm_position="pre" if alibi else "post",
             hidden_dropout=0.0 if alibi else 0.1, attention_dropout=0.0 if alibi else 0.1, num_layers=4)
torch.manual_seed(0)
m = init_weights(build("pretraining", cfg), cfg).train()
set_attention_kernel(m, sys.argv[4])
opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
dtype = torch.bfloat16 if sys.argv[5] == "bf16" else torch.float32
step = P.step_fn("padded", m, opt, dtype)
losses = []
t0 = time.perf_counter()
for rep in range(5):
    for b in batches: losses.append(step(b).item())
dt = (time.perf_counter() - t0) / len(losses) * 1e3
h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in m.parameters())).hexdigest()[:16]
print(sys.argv[1:], f"{dt:.1f} ms/step", "losses", hashlib.sha256(str(losses).encode()).hexdigest()[:12], "weights", h, flush=True)
