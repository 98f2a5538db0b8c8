"""`bertkit pretrain CONFIG.yaml [--section.key=value ...]` and `bertkit quickstart`."""
from __future__ import annotations

import argparse
import logging
import shlex
import sys
from ..cliconfig import add_options, given, suggest_unknown
from ..quickstart import QuickstartOptions, quickstart
from ..runconfig import PretrainConfig, load_config
from .basic import options_of

log = logging.getLogger("bertkit")


def setup_pretrain(parser: argparse.ArgumentParser) -> None:
    parser.usage = "bertkit pretrain [CONFIG.yaml] [--resume] [--section.key=value ...]"
    parser.description = (
        "Pre-train BERT with MLM (+ NSP) on data written by `bertkit prepare`. Every option is a config key "
        "(the YAML key, the flag and the attribute of bertkit.runconfig.PretrainConfig are one name) and "
        "overrides the YAML file, e.g. --out=runs/mini --data.path=data/prepared --train.budget=30m "
        "--train.batch_size=32 --optim.lr=5e-4. Several processes: "
        "torchrun --nproc_per_node N -m bertkit pretrain CONFIG.yaml ...")
    parser.add_argument("config", nargs="?", help="YAML config (configs/pretrain/mini.yaml, ...)")
    add_options(parser, PretrainConfig, old={"--precision": "train.precision"})
    suggest_unknown(parser)
    parser.set_defaults(run=run_pretrain)


def run_pretrain(args) -> int:
    from ..train import pretrain

    cfg = load_config(PretrainConfig, args.config, values=given(args, PretrainConfig))
    card = pretrain(cfg, command=shlex.join(["bertkit", "pretrain", *sys.argv[2:]]))
    if card and (e := card.get("final_eval")):
        lm = ("next-token", "eval_next_token_accuracy", "eval_next_token_perplexity") if "eval_next_token_loss" in e \
            else ("MLM", "eval_mlm_accuracy", "eval_perplexity")
        log.info("done: %d updates in %.0f s; held-out %s accuracy %.4f, perplexity %.1f", card["updates"],
                 card["wall_time_s"], lm[0], e[lm[1]], e[lm[2]])
    return 0


def setup_quickstart(parser: argparse.ArgumentParser) -> None:
    parser.description = ("The whole pipeline in about five minutes on the bundled corpus (US inaugural addresses "
                          "and 11 Project Gutenberg books, "
                          "public domain): train a WordPiece vocabulary, prepare data, pre-train a small BERT with "
                          "the CPU recipe (configs/pretrain/cpu-5m.yaml), then score it on held-out documents and "
                          "on cloze prompts.")
    add_options(parser, QuickstartOptions)
    parser.set_defaults(run=run_quickstart)


def run_quickstart(args) -> int:
    card = quickstart(**vars(options_of(args, QuickstartOptions)), say=lambda line: print(line, flush=True))
    print("\n".join(card["summary"]), flush=True)
    return 0
