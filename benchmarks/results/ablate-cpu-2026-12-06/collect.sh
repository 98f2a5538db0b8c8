#!/usr/bin/env bash
# Copy the files worth keeping of finished arms from an ablate output folder into this one (run from the
# repository root): bash benchmarks/results/ablate-cpu-2026-12-06/collect.sh OUT ARM [ARM ...]
set -euo pipefail
OUT=${1:?usage: collect.sh OUT ARM [ARM ...]}; shift
D=benchmarks/results/ablate-cpu-2026-12-06
for arm in "$@"; do
  A=$OUT/arms/$arm
  mkdir -p "$D/$arm"
  for f in arm.json blimp.json blimp_correct.txt mlm_outcomes.json nsp_shortcut.json log.txt; do
    if [ -f "$A/$f" ]; then cp "$A/$f" "$D/$arm/"; fi
  done
  for f in config.yaml metrics.jsonl eval.jsonl run_card.json run_card.md curves.png; do
    if [ -f "$A/pretrain/$f" ]; then cp "$A/pretrain/$f" "$D/$arm/"; fi
  done
  if [ -f "$A/results.jsonl" ]; then mkdir -p "$D/finetune"; cp "$A/results.jsonl" "$D/finetune/$arm-results.jsonl"; fi
done
