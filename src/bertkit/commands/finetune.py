"""`bertkit finetune`: a thin layer over `bertkit.finetune` (evaluate and predict: `commands/predict.py`)."""
from __future__ import annotations

import argparse
import json
import shlex
import sys

from ..cliconfig import add_options, given, suggest_unknown
from ..errors import BertkitError
from ..finetune import finetune, grid
from ..finetune.biencoder import finetune_embedding
from ..finetune.config import FinetuneConfig
from ..finetune.seeds import finetune_seeds, parse_seeds, summary_lines
from ..runconfig import RunConfigError, from_dict, read_yaml_mapping
from ..tasks.plumbing import COLUMN_KEYS
from .predict import column_options


# ---- finetune -----------------------------------------------------------------------------------
def setup_finetune(p: argparse.ArgumentParser) -> None:
    """Every option is a FinetuneConfig field of the same name (`bertkit.cliconfig`): the flag, the
    YAML key and the attribute are one name; --batch-size is accepted for --batch_size."""
    p.epilog = ("example: bertkit finetune --task sst2 --data ../shared/data/glue/SST-2 --model MODEL_DIR "
                "--out runs/sst2   |   bertkit finetune configs/finetune/sst2_minilm.yaml --seed 1")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("config", nargs="?", help="YAML file of FinetuneConfig values (options below override it)")
    add_options(p, FinetuneConfig, exclude=COLUMN_KEYS)
    p.add_argument("--grid", action="store_true",
                   help="the paper's grid: batch {16,32} x lr {5e-5,3e-5,2e-5} x epochs {2,3,4}; best on dev")
    p.add_argument("--seeds", type=_seeds, metavar="N,N,...",
                   help="fine-tune once per seed into OUT/seed-N (a finished seed is skipped on a rerun), print "
                        "each dev metric's mean, std, min-max and the collapsed seeds, keep the best seed on dev "
                        "as OUT's model (bertkit.finetune.seeds)")
    column_options(p, show_defaults=True)
    suggest_unknown(p)
    p.set_defaults(run=run_finetune)


def _seeds(text: str) -> list[int]:
    """--seeds 0,1,2: argparse's one-line error for a bad list."""
    try:
        return parse_seeds(text)
    except BertkitError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--seeds: ")) from None


def finetune_config(args: argparse.Namespace):
    """FinetuneConfig from the YAML file (if any), then the options given (same names, checked alike)."""
    data = read_yaml_mapping(args.config, "FinetuneConfig keys") if args.config else {}
    data.update(given(args, FinetuneConfig))
    try:
        cfg = from_dict(FinetuneConfig, data, args.config or "options")
    except RunConfigError as e:
        raise BertkitError(str(e)) from None
    if not cfg.model:
        raise BertkitError("give --model DIR (a pre-trained checkpoint folder) or `model:` in the config")
    return cfg


def run_finetune(args: argparse.Namespace) -> int:
    if args.seeds is not None and (hasattr(args, "seed") or args.grid):
        raise BertkitError(f"give --seeds or {'--seed' if hasattr(args, 'seed') else '--grid'}, not both")
    cfg = finetune_config(args)
    command = shlex.join(["bertkit", *sys.argv[1:]])
    if args.seeds is not None:
        summary = finetune_seeds(cfg, args.seeds, command)
        print("\n".join(summary_lines(summary, cfg.out)))
    elif args.grid:
        summary = grid(cfg, command)
        print(json.dumps(summary["best"]))
    else:
        result = (finetune_embedding if cfg.task == "embedding" else finetune)(cfg, command)   # a bi-encoder: biencoder.py
        print(json.dumps({"task": result["task"], "out": cfg.out, "best_step": result["best_step"],
                          "dev": {k: v for k, v in (result["dev"] or {}).items() if not isinstance(v, dict)}}))
    return 0
