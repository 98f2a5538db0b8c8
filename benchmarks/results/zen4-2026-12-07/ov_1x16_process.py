"""1 x 16 of the default Predictor (`pred`) and OpenVINO's contender (`hf`: transformers' graph), each timed
(10 calls in a row) after a 0.3 s pause that follows (a) whatever ran before in the round ("alone") or
(b) a 32 x 128 batch on the same contender ("after big", as in infer_vs_hf.py, where each round runs the
large workloads first); transformers fp32 on PyTorch (`torch`) runs in the rounds too, as the
benchmark's reference does. Medians of ROUNDS, order random each round. Arguments: ROUNDS, hf-first
(compile the contender before loading the Predictor) or hf-last, and how many more Predictors with
backend="openvino" to load (more OpenVINO models in the process).
usage (from the repository root): python benchmarks/results/zen4-2026-12-07/ov_1x16_process.py [ROUNDS] [hf-first|hf-last] [N]"""
import random, statistics, sys, tempfile, time
from pathlib import Path
import numpy as np, torch
IM = torch.inference_mode(); IM.__enter__()
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import export_transformers_graph, make_inputs, minilm_dir
from bertkit.infer import Predictor
import openvino as ov
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
hf_first = len(sys.argv) > 2 and sys.argv[2] == "hf-first"
tmp = Path(tempfile.mkdtemp()); export_transformers_graph(minilm_dir(), tmp / "t.onnx")
compile_hf = lambda: ov.Core().compile_model(ov.Core().read_model(str(tmp / "t.onnx")), "CPU", {"INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY"})
if hf_first:
    compiled = compile_hf()
p = Predictor.from_dir(minilm_dir(), device="cpu")
extra = [Predictor.from_dir(minilm_dir(), device="cpu", backend="openvino", threads=2) for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 0)]
if not hf_first:
    compiled = compile_hf()
print("hf first" if hf_first else "hf last", "extra OpenVINO predictors", len(extra))
import transformers
tm = transformers.AutoModel.from_pretrained(str(minilm_dir())).eval()
b16, big = make_inputs(p.tokenizer, [16]), make_inputs(p.tokenizer, [128] * 32)
feed = lambda b: {k: b["numpy"][k] for k in ("input_ids", "attention_mask", "token_type_ids")}
fns = {"pred": lambda b: [p.hidden(x, torch.float32) for x in p.batches(b["rows"])], "hf": lambda b: compiled(feed(b))[0],
       "torch": lambda b: tm(input_ids=b["input_ids"], attention_mask=b["attention_mask"], token_type_ids=b["token_type_ids"])}
times = {(k, a): [] for k in fns for a in ("alone", "after big") if not (k == "torch" and a == "after big")}
for r in range(rounds):
    order = list(times); random.Random(r).shuffle(order)
    for k, a in order:
        if a == "after big":
            time.sleep(0.3); fns[k](big)
        time.sleep(0.3); t = time.perf_counter()
        for _ in range(10): fns[k](b16)
        times[(k, a)].append((time.perf_counter() - t) / 10 * 1e3)
for key, v in times.items():
    print(f"{key[0]:5s} {key[1]:10s} median {statistics.median(v):.3f} ms  min {min(v):.3f}")
