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
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = config_keys_help()
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


def config_keys_help() -> str:
    """Every config key with its default, for --help (the field docs are in bertkit/runconfig.py)."""
    from ..runconfig import PretrainConfig, to_dict

    lines = ["config keys (defaults):"]
    for key, value in to_dict(PretrainConfig()).items():
        if isinstance(value, dict):
            lines.append("  " + "  ".join(f"--{key}.{k}={v}" for k, v in value.items()))
        else:
            lines.append(f"  --{key}={value}")
    wrapped = []
    for line in lines:                        # wrap long rows at ~100 columns
        words, row = line.split("  "), ""
        for w in words:
            if row and len(row) + len(w) > 100:
                wrapped.append(row.rstrip())
                row = "    "
            row += w + "  "
        wrapped.append(row.rstrip())
    return "\n".join(wrapped)


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
        lm = ("next-token", "eval_next_token_accuracy", "eval_next_token_perplexity") if "eval_next_token_loss" in e \
            else ("MLM", "eval_mlm_accuracy", "eval_perplexity")
        log.info("done: %d updates in %.0f s; held-out %s accuracy %.4f, perplexity %.1f", card["updates"],
                 card["wall_time_s"], lm[0], e[lm[1]], e[lm[2]])
    return 0


def setup_quickstart(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/quickstart", help="run folder (default: runs/quickstart)")
    parser.add_argument("--minutes", type=float, default=3.0,
                        help="pre-training time budget in minutes (default 3)")
    parser.add_argument("--vocab-size", type=int, default=8000, help="WordPiece vocabulary to train (default 8000)")
    parser.add_argument("--preset", default="tiny", help="model size (default tiny: 2 layers, hidden 128)")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(run=run_quickstart)


FILL_MASK_EXAMPLES = [
    "we the people of the united [MASK] .",
    "the [MASK] of the nation is in the hands of the people .",
    "i do solemnly swear that i will faithfully execute the office of [MASK] of the united states .",
    "our [MASK] is a government of the people , by the people , for the people .",
]


def run_quickstart(args) -> int:
    quickstart(args.out, minutes=args.minutes, vocab_size=args.vocab_size, preset=args.preset, seed=args.seed)
    return 0


def quickstart(out: str, minutes: float = 3.0, vocab_size: int = 8000, preset: str = "tiny", seed: int = 0) -> dict:
    """The whole pipeline on the bundled corpus (US inaugural addresses, public domain): train a
    WordPiece vocabulary, prepare NSP pairs, pre-train a small BERT for `minutes`, report."""
    import gzip
    import time
    from importlib import resources
    from pathlib import Path

    from ..data.prepare import PrepareConfig, prepare
    from ..infer import Predictor
    from ..runconfig import PretrainConfig, load_config
    from ..runlog import read_jsonl
    from ..tokenizer import Tokenizer
    from ..train import pretrain

    t0 = time.time()
    root = Path(out)
    (root / "text").mkdir(parents=True, exist_ok=True)
    text = gzip.decompress((resources.files("bertkit") / "sample" / "inaugural.txt.gz").read_bytes()).decode("utf-8")
    docs = [d for d in text.split("\n\n") if d.strip()]
    # the last 5 addresses are held out: the "before / after" accuracy is on documents never trained on
    (root / "text" / "train.txt").write_text("\n\n".join(docs[:-5]) + "\n", encoding="utf-8")
    (root / "text" / "heldout.txt").write_text("\n\n".join(docs[-5:]) + "\n", encoding="utf-8")
    print(f"1/4 corpus: {len(docs)} inaugural addresses (1789-2005), {len(text) / 1e6:.2f} MB; "
          f"5 held out -> {root / 'text'}", flush=True)
    tok = Tokenizer.train([str(root / "text" / "train.txt")], vocab_size=vocab_size, lowercase=True)
    tok.save(root / "tokenizer")
    print(f"2/4 WordPiece vocabulary: {tok.vocab_size} tokens -> {root / 'tokenizer'}", flush=True)
    pcfg = PrepareConfig(max_seq_length=128, seed=seed, eval_fraction=0.0)     # the held-out text is its own file
    meta = prepare([str(root / "text" / "train.txt")], tok, root / "data" / "train", pcfg, progress=False,
                   overwrite=True)
    prepare([str(root / "text" / "heldout.txt")], tok, root / "data" / "heldout", pcfg, progress=False, overwrite=True)
    print(f"3/4 prepared {meta['counts']['instances']} NSP pairs of up to 128 tokens -> {root / 'data'}", flush=True)
    spent = time.time() - t0
    overrides = {"out": str(root / "run"), "data.path": str(root / "data" / "train"),
                 "data.eval_path": str(root / "data" / "heldout"), "data.eval_instances": 256,
                 "model.preset": preset, "train.budget": f"{max(minutes * 60 - spent, 5):.0f}s",
                 "train.max_steps": 1000000, "train.batch_size": 32, "train.eval_every": 100,
                 "train.log_every": 10, "train.checkpoint_every": 0, "train.seed": seed,
                 "optim.lr": 2e-3, "optim.warmup": 0.05}
    cfg = load_config(PretrainConfig, None, [f"--{k}={v}" for k, v in overrides.items()])
    print(f"4/4 pre-training BERT-{preset} (MLM + NSP) for {cfg.train.budget} on {cfg.train.num_threads or 'all'} "
          f"CPU threads ...", flush=True)
    card = pretrain(cfg, command=f"bertkit quickstart --out {out} --minutes {minutes}")
    evals = read_jsonl(root / "run" / "eval.jsonl")
    before, after = evals[0], evals[-1]
    print(f"\nheld-out MLM accuracy: {before['eval_mlm_accuracy']:.3f} before -> {after['eval_mlm_accuracy']:.3f} "
          f"after {card['updates']} updates ({card['tokens_seen']:,} tokens, {card['wall_time_s']:.0f} s); "
          f"perplexity {before['eval_perplexity']:.0f} -> {after['eval_perplexity']:.0f}; NSP accuracy "
          f"{after['eval_nsp_accuracy']:.3f}")
    predictor = Predictor.from_dir(root / "run" / "final")
    print("\nfill-mask (top 3):")
    for text_, preds in zip(FILL_MASK_EXAMPLES, predictor.fill_mask(FILL_MASK_EXAMPLES, top_k=3)):
        guesses = ", ".join(f"{p['token']} ({p['score']:.2f})" for p in preds[0])
        print(f"  {text_}\n      -> {guesses}")
    print(f"\nrun card: {root / 'run' / 'run_card.md'}\ncurves:   {root / 'run' / 'curves.png'}\n"
          f"model:    {root / 'run' / 'final'} (Hugging Face format; try: bertkit fill-mask --model "
          f"{root / 'run' / 'final'} ...)\ntotal {time.time() - t0:.0f} s")
    return card
