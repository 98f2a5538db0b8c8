"""Where the default Predictor's 1 x 16 time goes against OpenVINO's own contender (bf16, 2 threads):
`pred` (what infer_vs_hf.py times for bertkit: batches, the packed encoder, pooling after), `runner`
(the Predictor's short-batch engine, bertkit's graph on OpenVINO, bare: ids in, states out),
`hf_dict` (the benchmark's OpenVINO contender: transformers' graph, the compiled model called with a
dict) and `hf_idx` (the same graph called as the Predictor calls its engine: inputs by index, shared).
One timing: a pause, then CALLS calls in a row (mean); medians over ROUNDS, the order random each round.
usage (from the repository root): python benchmarks/results/zen4-2026-12-07/ov_1x16.py [ROUNDS] [CALLS] [PAUSE_S]"""
import random, statistics, sys, tempfile, time
from pathlib import Path
import numpy as np, torch
IM = torch.inference_mode(); IM.__enter__()
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import export_transformers_graph, make_inputs, minilm_dir
from bertkit.infer import Predictor
import openvino as ov

rounds, calls, pause = (int(sys.argv[1]) if len(sys.argv) > 1 else 30, int(sys.argv[2]) if len(sys.argv) > 2 else 10,
                        float(sys.argv[3]) if len(sys.argv) > 3 else 0.2)
p = Predictor.from_dir(minilm_dir(), device="cpu")
print("short batches:", p.describe()["small_batches"]["reason"])
b = make_inputs(p.tokenizer, [16])
runner = p.small.runner
feeds = [b["numpy"][k] for k in ("input_ids", "attention_mask", "token_type_ids")]
tmp = Path(tempfile.mkdtemp())
export_transformers_graph(minilm_dir(), tmp / "t.onnx")
core = ov.Core()
compiled = core.compile_model(core.read_model(str(tmp / "t.onnx")), "CPU", {"INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY"})
request = compiled.create_infer_request()
dict_feeds = {k: b["numpy"][k] for k in ("input_ids", "attention_mask", "token_type_ids")}
names = {i.get_any_name(): n for n, i in enumerate(compiled.inputs)}
idx_feeds = {names[k]: v for k, v in dict_feeds.items()}
fns = {"pred": lambda: [p.hidden(x, torch.float32) for x in p.batches(b["rows"])],
       "runner": lambda: runner.run(*feeds),
       "hf_dict": lambda: compiled(dict_feeds)[0],
       "hf_idx": lambda: np.array(request.infer(idx_feeds, share_inputs=True, share_outputs=True)[0])}
times = {k: [] for k in fns}
for k in fns:
    fns[k]()
for r in range(rounds):
    order = list(fns); random.Random(r).shuffle(order)
    for k in order:
        time.sleep(pause)
        t = time.perf_counter()
        for _ in range(calls):
            fns[k]()
        times[k].append((time.perf_counter() - t) / calls * 1e3)
for k, v in times.items():
    print(f"{k:8s} median {statistics.median(v):.3f} ms  min {min(v):.3f}  (rounds {len(v)}, calls {calls})")
