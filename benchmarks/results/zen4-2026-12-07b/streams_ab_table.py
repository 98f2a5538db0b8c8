"""infer_vs_hf.measure on three contenders: the default Predictor as loaded (larger batches on two
streams), a second default Predictor with its larger batches on the short-batch runtime (wide None, as
before 8a0a224), and OpenVINO's own contender; ragged, fixed and 1 x 16."""
import random, sys, tempfile
from pathlib import Path
import numpy as np, torch
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
import infer_vs_hf as iv
from bertkit.infer import Predictor
import transformers, openvino as ov
path = iv.minilm_dir()
hf = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
p = Predictor.from_dir(path, device="cpu")
q = Predictor.from_dir(path, device="cpu")
print(p.small_reason)
print("p wide streams", getattr(p.small.wide, "streams", None), "q wide streams", getattr(q.small.wide, "streams", None))
q.small.wide = None
tok = p.tokenizer
spread = np.random.default_rng(0).permutation(np.linspace(8, 128, 32).round().astype(int)).tolist()
workloads = {"ragged": iv.make_inputs(tok, spread), "fixed": iv.make_inputs(tok, [128] * 32), "1x16": iv.make_inputs(tok, [16])}
tmp = Path(tempfile.mkdtemp()); iv.export_transformers_graph(path, tmp / "t.onnx")
core = ov.Core()
c = {"transformers fp32": iv.torch_padded_runner(hf), "bertkit streams": iv.bertkit_runner(p),
     "bertkit one stream": iv.bertkit_runner(q),
     "OpenVINO": iv.openvino_runner(core.compile_model(core.read_model(str(tmp / "t.onnx")), "CPU", {"INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY"}))}
med, _ = iv.measure(c, workloads, int(sys.argv[1]) if len(sys.argv) > 1 else 11, 10, settle=0.3)
for n in c:
    print(f"{n:20s} ragged {med[(n, 'ragged')]*1e3:7.1f}  fixed {med[(n, 'fixed')]*1e3:7.1f} ms  1x16 {med[(n, '1x16')]*1e3:6.2f} ms  in a row {med[(n, iv.STEADY)]*1e3:6.2f} ms")
