#!/usr/bin/env bash
# Put the CPU grid's arms committed on 2026-12-03 (scored on the Xeon) into an output folder beside
# arms run since, so that `bertkit ablate configs/ablate/cpu.yaml --out OUT --report-only` compares them
# all. Their BLiMP per-pair outcomes were not kept (only sop's), so BLiMP Δ against the base is the
# unpaired interval there (marked "unpaired"); held-out MLM Δ stays paired (mlm_outcomes.json kept).
# Usage, from the repository root: bash benchmarks/results/ablate-cpu-2026-12-05/assemble_committed_arms.sh OUT
set -euo pipefail
OUT=${1:?usage: assemble_committed_arms.sh OUT}
R=benchmarks/results/ablate-cpu-2026-12-03
A=$OUT/arms
for n in base mlm_only no_pretraining sop; do
  mkdir -p "$A/$n"
  cp "$R/${n}_arm.json" "$A/$n/arm.json"
  if [ -f "$R/mlm_outcomes/$n.json" ]; then cp "$R/mlm_outcomes/$n.json" "$A/$n/mlm_outcomes.json"; fi
done
cp "$R/sop_blimp_correct.txt" "$A/sop/blimp_correct.txt"
mkdir -p "$A/mask_0_0_100"
cp "$R/mask_0_0_100_final/arm.json" "$R/mask_0_0_100_final/mlm_outcomes.json" "$A/mask_0_0_100/"
