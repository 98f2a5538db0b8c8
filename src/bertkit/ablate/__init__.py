"""`bertkit ablate CONFIG.yaml`: which ingredients carry BERT's result, measured on your machine.

A grid of arms, each differing from a base recipe in one setting, under a matched budget, with the
same tokenizer and the same text. Each arm pre-trains (or not), is scored on held-out documents with
one fixed MLM protocol, and is fine-tuned on every task with several seeds. Then a table.

    OUT/shared/corpus/      train.txt + heldout.txt: a document-level split made once (same for all arms)
    OUT/shared/tokenizer/   one WordPiece vocabulary, trained once on train.txt
    OUT/shared/data/KEY/    prepared data, once per distinct prepare setting (train/ + heldout/)
    OUT/arms/NAME/          arm.json (status, one-line error, budget, lr chosen), log.txt, pretrain/ (its
                            run card), finetune/TASK/seedS/ (run cards, metrics; TASK/lrR/seedS/ with
                            an lr search), probe/TASK/ (a probe arm's results.json, with each dev
                            example's outcome), results.jsonl
    OUT/results.jsonl       one row per arm x task x seed, collected from the arms
    OUT/REPORT.md, OUT/plots/*.png

Honest by construction:
  * resumable: a finished arm (arm.json status 'done' with the same settings, on the same model) is
    skipped; inside an arm, a finished pre-training or fine-tuning run given the same keys is reused,
    and an interrupted pre-training resumes from its checkpoint, so a stopped grid loses little.
    Settings that changed under a finished pre-training run are refused (delete the folder to redo
    it), never silently mixed.
  * a failing arm is a row saying so (the error on one line; the traceback in arms/NAME/error.txt)
    and the grid goes on; `bertkit ablate` then exits 1 naming the failed arms. A mistake that would
    fail every arm (a grid key, the base settings, a missing corpus or task folder) stops the grid
    before anything is written.
  * split across machines: `--arms a,b` or `--shard I/N` (arms reusing another arm's model go with
    it), all writing into one shared OUT; shared files are written to a temporary name and renamed,
    so two machines at worst do the same work twice. Any machine can write the report
    (`--report-only`): it collects whatever is finished.
  * `--jobs N` runs N arms at once on one machine (each process claims the next arm atomically).
  * `--launcher torchrun --nproc N` pre-trains each arm as `torchrun -m bertkit pretrain` (GPUs), with
    train.batch_size split over the processes so the global batch (and the budget) stays the same.

The rooms of this package, in the order a grid runs:

    config.py    the grid's YAML as AblateConfig and Arm (every key checked), arm selection and shards
    shared.py    the shared inputs: the split, the tokenizer, the prepared data (cached in OUT/shared)
    arm.py       one arm: configs, pre-training (reused by key, resumed), held-out MLM, fine-tuning or
                 probes, and what identifies it as finished (plan_key, finished)
    probes.py    a probe arm's task: linear_probe's L-BFGS probes, kept under a key, resumed at the probe
                 an interrupted run was on
    measure.py   what is measured and how arms are matched: held-out MLM at [MASK], paired differences
                 of ratio metrics on the same examples, FLOP-matched budgets, the learning rate chosen
                 on dev, collapsed seeds
    zeroshot.py  BLiMP (paired differences against the base) and NSP's topic shortcut
    grid.py      checks, the dry run, arms in order or in processes sharing OUT through claims
    report.py    the statistics (Welch's interval against the base arm; the probes' paired Δ against the
                 base model's probes) and REPORT.md; plots.py its plots, cards.py what ran (the as-trained
                 table and the reproduction checklist, from the run cards)
    contract.py  the paper note's minimal implementation test
"""
from __future__ import annotations

from .arm import RunOptions, arm_budget, finetune_config, finetune_dir, finished, plan_key, pretrain_config, run_arm
from .config import AblateConfig, Arm, describe, load_ablate_config, select_arms
from .contract import contract_test
from .grid import check_base, check_inputs, dry_run, resolve, run_grid
from .measure import heldout_mlm, update_flops, weights_id
from .report import welch_t_test, write_report
from .shared import Shared
from .zeroshot import arm_blimp, arm_nsp_shortcut

__all__ = ["AblateConfig", "Arm", "RunOptions", "Shared", "arm_blimp", "arm_budget", "arm_nsp_shortcut", "check_base",
           "check_inputs", "contract_test", "describe", "dry_run", "finetune_config", "finetune_dir", "finished",
           "heldout_mlm", "load_ablate_config", "plan_key", "pretrain_config", "resolve", "run_arm", "run_grid",
           "select_arms", "update_flops", "weights_id", "welch_t_test", "write_report"]
