#!/usr/bin/env bash
# Issue 32's GPU grid (configs/ablate/gpu-10min.yaml) in one prepared run on a lent GPU machine (no
# package registry there: bertkit runs from src/; torch, tokenizers, safetensors, numpy, tqdm, pyyaml and
# matplotlib are in its image). What comes back: at most 8 files in $OUT.
#   run: command "GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/gpu_ablate.sh", carry [".gpu"], timeout_s 590
# .gpu is git-ignored (add "/.gpu/" to .git/info/exclude); make it here first (about 10 MB):
#   mkdir -p .gpu/data/pretrain .gpu/data/glue .gpu/data/blimp
#   cp ../shared/data/pretrain/{wiki_vital_leads,brown,gutenberg_books}.txt.gz .gpu/data/pretrain/
#   cp -r ../shared/data/glue/SST-2 ../shared/data/glue/MRPC .gpu/data/glue/
#   cp -r ../shared/data/conll2003 .gpu/data/; cp ../shared/data/blimp/* .gpu/data/blimp/
# Stages inside one deadline (LIMIT seconds from the start, default 520), so the report and the results
# come back even when time runs out (the arms then stopped are rows saying 'interrupted'; a pre-training
# cut by the signal is never scored as finished). Pre-training gets no deadline of its own: a first run
# (benchmarks/results/ablate-gpu-2026-12-04) that reserved 200 s for fine-tuning cut every arm short.
# Measured there: stage 1 needs ~7-8 minutes of an H200, stage 2 ~3, so the whole grid takes about 11.
#   1. every arm's pre-training and zero-shot scores (held-out MLM at [MASK], BLiMP, NSP's topic
#      shortcut): --pretrain-only, 13 processes sharing the GPU (a BERT-mini step leaves most of it idle)
#   2. fine-tuning (lr chosen on dev, 5 seeds) of every arm, 16 processes
#   3. the report (REPORT.md, plots), then the grid folder without weights as one archive
# STAGES (default "1 2"): which of stages 1 and 2 this call runs. One call is at most 10 minutes, so the
# whole grid takes two on one warm machine: STAGES=1 LIMIT=560 (timeout_s 595), then at once (the machine
# goes back after 30 s idle) STAGES=2 with the same GRID_OUT. Keep GRID_OUT outside the repository
# (default /root/ablate-gpu-10min): a carried .gpu is replaced on every call, a folder outside is kept
# while the machine is. The shared inputs made here (.gpu/ablate-gpu-10min/shared) are copied in once.
# ARMS (default: all): a comma-separated subset for both stages (bertkit ablate --arms). Runs do not
# survive a session and run 3 (benchmarks/results/ablate-gpu-2026-12-04) measured stage 1 at ~520 s for
# all arms and a fine-tuning run at ~15 s among 16 processes (~330 runs for the whole grid), so a
# 15-minute session fine-tunes a subset: pre-train and fine-tune e.g.
# ARMS=base,no_pretraining,mlm_only,mask_100_0_0,mask_0_0_100,ltr,paper_arch,steps_half.
set -uo pipefail
FINAL="${OUT:?set OUT}"
[ -d /opt/torch/.venv/bin ] && export PATH=/opt/torch/.venv/bin:$PATH
command -v python >/dev/null || { mkdir -p /tmp/shim && printf '#!/bin/sh\nexec python3 "$@"\n' > /tmp/shim/python \
  && chmod +x /tmp/shim/python && export PATH=$PATH:/tmp/shim; }
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s); LIMIT=${LIMIT:-520}
G=${GRID:-configs/ablate/gpu-10min.yaml}; O=${GRID_OUT:-/root/ablate-gpu-10min}; D=${DATA:-.gpu/data}
PRE_JOBS=${PRE_JOBS:-13}; FT_JOBS=${FT_JOBS:-16}; STAGES=${STAGES:-1 2}
SEL=(); [ -n "${ARMS:-}" ] && SEL=(--arms "$ARMS")
if [ ! -d "$O/shared" ] && [ -d .gpu/ablate-gpu-10min/shared ]; then mkdir -p "$O" && cp -r .gpu/ablate-gpu-10min/shared "$O/"; fi
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
t() { echo "[$(date -u +%T) +$(( $(date +%s) - START ))s] $*" | tee -a "$FINAL/timeline.txt"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "commit ${GIT_COMMIT:-unknown}"; date -u; echo "cpus $(nproc)"; } > "$FINAL/machine.txt"
t start
# MPS (default 1): CUDA's Multi-Process Service, so the jobs' kernels share the GPU at once instead of
# taking turns (without it 13 pre-trainings ran at 1.84M tokens/s together, two at 1.22M: 0.61M each;
# a fine-tuning run took 15 s among 16 against 7 s among 3: time-slicing). Checked with a one-line CUDA
# probe and dropped when anything fails, so the grid runs either way; machine.txt says which. MPS=0: off.
mps_off() { echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; }
if [ "${MPS:-1}" = 1 ] && command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p /tmp/mps-pipe /tmp/mps-log
  if (pgrep -x nvidia-cuda-mps >/dev/null || nvidia-cuda-mps-control -d) \
     && timeout 60 python -c "import torch; assert (torch.ones(2, device='cuda') + 1).sum().item() == 4" 2>>"$FINAL/machine.txt"; then
    echo "MPS on" >> "$FINAL/machine.txt"
  else
    mps_off; echo "MPS failed its probe: off" >> "$FINAL/machine.txt"
  fi
else
  echo "MPS off" >> "$FINAL/machine.txt"
fi
# SIGINT to every job (timeout signals its process group); -k: the parent waits for its children
if [[ " $STAGES " == *" 1 "* ]]; then
  timeout -k 20 -s INT $(( $(left) - 45 )) python -m bertkit ablate "$G" --out "$O" --data-dir "$D" --pretrain-only "${SEL[@]}" \
    --jobs "$PRE_JOBS" --threads 1 --no-report >> "$FINAL/grid.log" 2>&1; t "pre-training stage exit $?"
fi
if [[ " $STAGES " != *" 2 "* ]]; then
  t "fine-tuning stage not asked for (STAGES=$STAGES)"
elif [ "$(left)" -gt 75 ]; then
  timeout -k 20 -s INT $(( $(left) - 45 )) python -m bertkit ablate "$G" --out "$O" --data-dir "$D" "${SEL[@]}" \
    --jobs "$FT_JOBS" --threads 1 --no-report >> "$FINAL/grid.log" 2>&1; t "fine-tuning stage exit $?"
else
  t "fine-tuning stage skipped: $(left) s left"
fi
timeout 25 python -m bertkit ablate "$G" --out "$O" --data-dir "$D" --report-only >> "$FINAL/grid.log" 2>&1
t "report exit $?"
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> "$FINAL/machine.txt" 2>&1
tar czf "$FINAL/grid.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' --exclude='tokenizer.json' \
  --exclude='vocab.txt' --exclude='shared/corpus' --exclude='shared/data' -C "$(dirname "$O")" "$(basename "$O")" 2>>"$FINAL/timeline.txt"
t "archived $(du -h "$FINAL/grid.tgz" | cut -f1)"
cp "$O/REPORT.md" "$FINAL/" 2>/dev/null; tail -c 3000 "$FINAL/grid.log"
