"""Where the default's 1 x 16 loses to OpenVINO's contender in infer_vs_hf's rounds: the same measure()
(settle 0.3, interleaved, 10 calls), contenders: transformers fp32, bertkit default, the default's engine
runtime called directly on numpy ids (no Predictor path), the same runtime's compiled model called as
the contender calls its own, OpenVINO's contender (transformers' graph), and OpenVINO on bertkit's graph
compiled here (a fresh model, not the Predictor's)."""
import random, sys, tempfile
from pathlib import Path
import numpy as np, torch
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
import infer_vs_hf as iv
from bertkit.infer import Predictor, graph
from bertkit.infer.engines import encoder_of
from bertkit.checkpoint import load_model
import transformers, openvino as ov
path = iv.minilm_dir()
hf = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
p = Predictor.from_dir(path, device="cpu")
print(p.small_reason)
tok = p.tokenizer
rng = random.Random(0)
spread = sorted((rng.randint(8, 128) for _ in range(32)), reverse=True)
workloads = {"ragged": iv.make_inputs(tok, spread), "1x16": iv.make_inputs(tok, [16])}
if "noragged" in sys.argv: workloads.pop("ragged")
tmp = Path(tempfile.mkdtemp())
iv.export_transformers_graph(path, tmp / "t.onnx")
core = ov.Core()
cfg = {"INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY"}
(tmp / "b.onnx").write_bytes(graph.encoder_graph(encoder_of(load_model(path, random_init=False).eval())))
r = p.small.runner
def raw(runner):
    def run(b):
        n = b["numpy"]
        h = runner.run(n["input_ids"], n["attention_mask"], n["token_type_ids"])
        return lambda: iv.mean_pool(h, n["attention_mask"])
    return run
from bertkit.infer.engines import torch_threads
def in_tt(runner):
    def run(b):
        n = b["numpy"]
        with torch_threads(1):
            h = runner.run(n["input_ids"], n["attention_mask"], n["token_type_ids"])
        return lambda: iv.mean_pool(h, n["attention_mask"])
    return run
pre = {}
def engine_run(b):
    bb = pre.setdefault(id(b), p.batches(b["rows"]))
    out = [(x, p.small.run(x)["last_hidden_state"]) for x in bb]
    return lambda: None
def pred_hidden(b):
    bb = pre.setdefault(id(b), p.batches(b["rows"]))
    out = [(x, p.hidden(x, torch.float32)) for x in bb]
    return lambda: None
def batches_then_raw(b):
    bb = p.batches(b["rows"]); n = b["numpy"]
    h = r.run(n["input_ids"], n["attention_mask"], n["token_type_ids"])
    return lambda: None
c = {"transformers fp32": iv.torch_padded_runner(hf),
     "runner.run in torch_threads(1)": in_tt(r),
     "engine.run(prebuilt batch)": engine_run,
     "pred.hidden(prebuilt batch)": pred_hidden,
     "pred.batches + runner.run": batches_then_raw,
     "bertkit default": iv.bertkit_runner(p),
     "bertkit engine runner.run": raw(r),
     "OpenVINO contender": iv.openvino_runner(core.compile_model(core.read_model(str(tmp / "t.onnx")), "CPU", cfg))}
med, _ = iv.measure(c, workloads, int(sys.argv[1]) if len(sys.argv) > 1 else 11, 10, settle=0.3)
for n in c:
    print(f"{n:32s} ragged {med.get((n, 'ragged'), 0)*1e3:7.1f} ms  1x16 {med[(n, '1x16')]*1e3:6.2f} ms  in a row {med[(n, iv.STEADY)]*1e3:6.2f} ms")
