"""`bertkit pretrain CONFIG.yaml [--section.key=value ...]` and `bertkit quickstart`."""
from __future__ import annotations

import argparse
import logging
import shlex
import sys

log = logging.getLogger("bertkit")


def setup_pretrain(parser: argparse.ArgumentParser) -> None:
    parser.usage = "bertkit pretrain [CONFIG.yaml] [--resume] [--section.key=value ...]"
    parser.description = (
        "Pre-train BERT with MLM (+ NSP) on data written by `bertkit prepare`. Every config key can be "
        "overridden on the command line, e.g. --out=runs/mini --data.path=data/prepared "
        "--train.max_steps=1000 --train.budget=30m --train.batch_size=32 --optim.lr=5e-4. "
        "Sections: model, data, train, optim (see configs/pretrain/*.yaml and bertkit/runconfig.py). "
        "Several processes: torchrun --nproc_per_node N -m bertkit pretrain CONFIG.yaml ...")
    parser.add_argument("config", nargs="?", help="YAML config (configs/pretrain/mini.yaml, ...)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest valid checkpoint in --out")
    parser.add_argument("overrides", nargs="*", metavar="--section.key=value",
                        help="config overrides, e.g. --train.max_steps=100 (unknown keys are an error)")
    parser.set_defaults(run=run_pretrain)
    plain = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        """Options are config keys, known only to the dataclasses: split them off ourselves."""
        args = list(sys.argv[2:] if args is None else args)
        if any(a in ("-h", "--help") for a in args):
            return plain(args, namespace)
        config, overrides = split_args(args)
        ns = namespace or argparse.Namespace()
        ns.config, ns.overrides, ns.resume, ns.run = config, overrides, False, run_pretrain
        return ns, []
    parser.parse_known_args = parse_known_args


def split_args(items: list[str]) -> tuple[str | None, list[str]]:
    """(config file, ['--key=value', ...]) from '--key=value', '--key value', '--resume' and one bare path."""
    from ..runconfig import RunConfigError

    config, out, i = None, [], 0
    while i < len(items):
        item = items[i]
        if item == "--resume":
            out.append("--resume=true")
        elif item.startswith("-") and "=" not in item:
            if i + 1 >= len(items) or items[i + 1].startswith("--"):
                raise RunConfigError(f"option {item} needs a value (--section.key=value)")
            out.append(f"{item}={items[i + 1]}")
            i += 1
        elif item.startswith("-"):
            out.append(item)
        elif config is None:
            config = item
        else:
            raise RunConfigError(f"two config files given ({config}, {item}); override keys with --section.key=value")
        i += 1
    return config, out


def run_pretrain(args) -> int:
    from ..runconfig import PretrainConfig, load_config
    from ..train import pretrain

    overrides = list(args.overrides or []) + (["--resume=true"] if args.resume else [])
    cfg = load_config(PretrainConfig, args.config, overrides)
    card = pretrain(cfg, command=" ".join(["bertkit", "pretrain"] + [shlex.quote(a) for a in sys.argv[2:]]))
    if card and card.get("final_eval"):
        e = card["final_eval"]
        log.info("done: %d updates in %.0f s; held-out MLM accuracy %.4f, perplexity %.1f", card["updates"],
                 card["wall_time_s"], e["eval_mlm_accuracy"], e["eval_perplexity"])
    return 0


def setup_quickstart(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/quickstart", help="run folder (default: runs/quickstart)")
    parser.add_argument("--minutes", type=float, default=3.0,
                        help="pre-training time budget in minutes (default 3)")
    parser.add_argument("--vocab-size", type=int, default=8000, help="WordPiece vocabulary to train (default 8000)")
    parser.add_argument("--preset", default="tiny", help="model size (default tiny: 2 layers, hidden 128)")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(run=run_quickstart)


def run_quickstart(args) -> int:
    from ..quickstart import quickstart

    quickstart(args.out, minutes=args.minutes, vocab_size=args.vocab_size, preset=args.preset, seed=args.seed)
    return 0
