"""`bertkit ablate CONFIG.yaml`: a grid of pre-training + fine-tuning arms (a thin layer over `bertkit.ablate`)."""
from __future__ import annotations

import argparse
import json
import shlex
import sys

from .. import ablate
from ..ablate import AblateConfig, RunOptions, contract_test
from ..cliconfig import add_options, given, suggest_unknown
from ..errors import BertkitError
from .basic import options_of


# AblateConfig fields that are options too (the rest of a grid is structure: corpus, arms, tasks, ...)
GRID_OPTIONS = ("out", "data_dir", "eval_documents", "split_seed", "mlm_eval_instances", "base_arm", "keep_models",
                "jobs", "threads")


def setup_ablate(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = (
        "examples:\n"
        "  bertkit ablate configs/ablate/small.yaml                      # the whole grid, here\n"
        "  bertkit ablate configs/ablate/gpu.yaml --shard 0/4 --out /shared/ablate   # machine 1 of 4\n"
        "  bertkit ablate configs/ablate/gpu.yaml --report-only --out /shared/ablate # table of what finished\n"
        "  bertkit ablate configs/ablate/small.yaml --arms base,mlm_only            # some arms\n"
        "  bertkit ablate configs/ablate/small.yaml --jobs 2 --threads 1            # 2 arms at a time\n"
        "  bertkit ablate configs/ablate/cpu.yaml --pretrain-only      # pre-train, score, probe; fine-tune later\n"
        "  bertkit ablate --contract-test [MODEL]     # right-hand context and the causal mask, checked\n"
        "A finished arm is skipped on a rerun; a failing arm becomes a row saying so, and the command exits 1\n"
        "naming the failed arms (--dry-run: the arms that would fail). See bertkit/ablate/__init__.py.")

    p.add_argument("config", nargs="?", help="grid YAML (configs/ablate/small.yaml, configs/ablate/gpu.yaml)")
    grid = p.add_argument_group("grid keys (override the config file's)")
    add_options(grid, AblateConfig, names=GRID_OPTIONS, show_defaults=False, help={
        "out": "output folder (default: the config's `out`)",
        "data_dir": "folder of the corpus and task data (default: the config's)",
        "jobs": "run arms in N processes at once on this machine (default: the config's `jobs`); each takes "
                "the next unclaimed arm",
        "threads": "torch threads per run (default: the config's; with --jobs N, cores / N)"})
    add_options(p, RunOptions, names=("launcher", "nproc", "pretrain_only"), defaults=True)
    suggest_unknown(p)
    p.add_argument("--arms", help="run only these arms (comma-separated names)")
    p.add_argument("--shard", metavar="I/N", help="run shard I of N (0-based): for N machines sharing --out")
    p.add_argument("--report-only", dest="report_only", action="store_true",
                   help="write REPORT.md, results.jsonl and plots from the finished arms; run nothing")
    p.add_argument("--dry-run", dest="dry_run", action="store_true",
                   help="check the grid and print each arm's resolved settings; run nothing")
    p.add_argument("--no-report", dest="no_report", action="store_true", help="do not write the report at the end")
    p.add_argument("--contract-test", dest="contract_test", nargs="?", const="", metavar="MODEL",
                   help="the paper note's minimal test on MODEL (default: a random encoder) and exit")
    p.set_defaults(run=run_ablate)


def run_ablate(args: argparse.Namespace) -> int:
    if args.contract_test is not None:
        return _contract(args.contract_test or None)
    if not args.config:
        raise BertkitError("give a grid config (e.g. configs/ablate/small.yaml), or --contract-test")

    values = {k: v for k, v in given(args, AblateConfig).items() if k in GRID_OPTIONS}   # --arms selects
    cfg = ablate.load_ablate_config(args.config, values=values)       # every grid key checked here
    command = shlex.join(["bertkit", *sys.argv[1:]])
    # --launcher, --nproc (checked here), --pretrain-only, and bertkit's -v as `verbose`; args.command is 'ablate'
    opts = options_of(args, RunOptions, ("command",), command=command)
    if args.report_only:
        print(ablate.write_report(cfg, command))
        return 0
    names = [n.strip() for n in args.arms.split(",") if n.strip()] if args.arms else None
    arms = ablate.select_arms(cfg, names, args.shard)
    ablate.check_inputs(cfg)                   # the corpus and the task data: before anything is written
    if args.dry_run:
        rows = ablate.dry_run(cfg, arms)
        for row in rows:
            print(json.dumps(row))
        return _failed([r["arm"] for r in rows if r["status"] != "ok"], len(rows), "would fail (their rows say why)")
    summary = ablate.run_grid(cfg, arms, opts)
    if not args.no_report:
        summary["report"] = str(ablate.write_report(cfg, command))
    print(json.dumps(summary))
    if any(summary.get("exit_codes") or []):
        print(f"bertkit ablate: error: a job exited with {summary['exit_codes']} (see the arms' log.txt)",
              file=sys.stderr)
        return 1
    return _failed(summary.get("failed") or [], len(arms), f"failed (each one's error: {cfg.out}/arms/NAME/arm.json)")


def _failed(names: list[str], total: int, what: str) -> int:
    """Exit status 1 and one line when an arm failed (or would): a grid is not done while one is not."""
    if not names:
        return 0
    print(f"bertkit ablate: error: {len(names)} of {total} arms {what}: {', '.join(names)}", file=sys.stderr)
    return 1


def _contract(model: str | None) -> int:
    r = contract_test(model)
    yes = {True: "yes", False: "NO"}
    print(f"minimal implementation test (paper note) on {r['model']}, {r['tokens']} tokens, "
          f"{r['left_tokens']} in the left segment:")
    print(f"  right-hand context changes a left token's state (bidirectional): "
          f"{yes[r['right_context_changes_left']]} (max |change| {r['left_change_bidirectional']:.3g}, "
          f"states ~{r['state_scale']:.3g})")
    print(f"  with a causal mask the left states ignore the right: {yes[r['causal_left_unchanged']]} "
          f"(max |change| {r['left_change_causal']:.3g}; right-hand states still change by "
          f"{r['right_change_causal']:.3g})")
    print(f"  same tensor shape {r['shape_causal']} == {r['shape_bidirectional']}, different contract "
          f"(causal vs bidirectional left states differ by {r['causal_vs_bidirectional_left']:.3g}): "
          f"{yes[r['causal_changes_contract']]}")
    print("passed" if r["passed"] else "FAILED")
    return 0 if r["passed"] else 1
