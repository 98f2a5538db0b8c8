#!/usr/bin/env bash
# One prepared run of every GPU check (issues 4 and 6) on a lent GPU machine that has no package
# registry: bertkit runs from src/, missing wheels (fastapi, uvicorn, ...) come from .whl/, and the
# all-MiniLM-L6-v2 folder from .gpu/site (its weights carried in fp16, loaded as fp32: speed figures
# are unaffected; parity figures then compare against those same rounded weights).
# Summaries and logs are copied to $OUT (at most 8 files come back).
set -uo pipefail
FINAL="${OUT:?set OUT}"
mkdir -p /tmp/shim && ln -sf "$(command -v python3)" /tmp/shim/python && export PATH=/tmp/shim:$PATH
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD/src:$PWD/.gpu/site:/tmp/site" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$FINAL/nvidia_smi.txt" 2>&1
W=/tmp/gpu_work; rm -rf $W; mkdir -p $W/pre $W/inf
( OUT=$W/inf timeout 260 bash benchmarks/gpu_infer.sh ) > $W/infer.log 2>&1; echo "gpu_infer.sh exit $?" >> $W/infer.log
( OUT=$W/pre timeout 280 bash benchmarks/gpu_pretrain.sh ) > $W/pretrain.log 2>&1; echo "gpu_pretrain.sh exit $?" >> $W/pretrain.log
cp $W/inf/gpu_infer.json "$FINAL/" 2>/dev/null; cp $W/pre/gpu_pretrain.json "$FINAL/" 2>/dev/null
cp $W/infer.log $W/pretrain.log "$FINAL/"
find $W -name '*.pt' -o -name '*.safetensors' -o -name '*.bin' | xargs -r rm -f
tar czf "$FINAL/gpu_details.tgz" -C $W . 2>/dev/null
ls -la "$FINAL"
