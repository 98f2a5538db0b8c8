"""`bertkit blimp`: BLiMP minimal pairs scored zero-shot by any checkpoint with a (masked or causal) LM head.

    bertkit blimp --model runs/quickstart/final blimp/data/ --out runs/blimp-quickstart
    bertkit blimp --model DIR blimp_dev.jsonl.gz --limit 50 --method pll-word-l2r

A thin layer over `bertkit.blimp` (read_pairs, score_pairs, summarize).
"""
from __future__ import annotations

import datetime
import json
import platform
import time
from pathlib import Path

from .. import __version__
from ..blimp import (BlimpOptions, PUBLISHED, load, method_for, pair_rows, published, read_pairs, score_pairs,
                     summarize)
from ..cliconfig import add_options
from ..errors import BertkitError
from ..hardware import cpu_model
from ..outdir import write_whole
from .basic import Args, check_device, options_of

COLUMNS = {"ngram": "5-gram", "lstm": "LSTM", "txl": "TXL", "gpt2": "GPT-2"}     # the paper's models, short


def setup_blimp(p) -> None:
    """Positional files, --model, the outputs; one flag per BlimpOptions field (`bertkit.cliconfig`)."""
    p.epilog = ("BLiMP files: github.com/alexwarstadt/blimp, data/*.jsonl (CC BY 4.0): one JSON object per pair "
                "with UID, linguistics_term, pairID, sentence_good, sentence_bad. A pair counts when the good "
                "sentence scores strictly higher; ties fail.")
    p.add_argument("files", nargs="+", metavar="FILE", help="BLiMP JSONL files (.jsonl or .jsonl.gz) or folders of them")
    add_options(p, Args, names=("model", "out", "json", "published"), defaults=True, help={
        "model": "checkpoint folder with an MLM head (bertkit pretrain's final/ or a checkpoint, a Hugging Face BERT "
                 "folder) and its tokenizer",
        "out": "a folder (results.json + pairs.jsonl) or FILE.json (pairs in FILE.pairs.jsonl)"})
    add_options(p, BlimpOptions)
    p.set_defaults(run=run_blimp)


def run_blimp(args) -> int:
    from tqdm.auto import tqdm

    o = options_of(args, BlimpOptions)
    check_device(o.device)
    out = _out_paths(args.out) if args.out else None
    reference = published(args.published)
    pairs = read_pairs(args.files, o.limit)
    pred = load(args.model, o.precision, o.device, o.threads)
    method = method_for(pred, o.method)
    t0 = time.perf_counter()
    with tqdm(total=2 * len(pairs), desc=f"blimp {method}", unit="sentence", disable=None, leave=False) as bar:
        scored = score_pairs(pred, pairs, method, o.max_tokens, bar.update, o.threads)
    wall = time.perf_counter() - t0
    summary = summarize(pairs, scored["good"], scored["bad"], reference)
    correct = summary.pop("correct")
    result = {"model": str(args.model), "method": method, "files": [str(f) for f in args.files],
              "limit": o.limit, **summary, "run": _run_facts(pred, wall, len(pairs), scored["tokens_read"])}
    if out:
        _write(out, result, pairs, scored, correct)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print_tables(result, pred.precision)
        if out:
            print(f"wrote {out[0]} and {out[1]}")
    return 0


def _out_paths(out: str) -> tuple[Path, Path]:
    p = Path(out)
    if p.suffix == ".json":
        if not p.parent.is_dir():
            raise BertkitError(f"--out {out}: the folder {p.parent} does not exist")
        return p, p.with_suffix(".pairs.jsonl")
    if p.exists() and not p.is_dir():
        raise BertkitError(f"--out {out}: exists and is not a folder (name a folder or a .json file)")
    return p / "results.json", p / "pairs.jsonl"


def _run_facts(pred, wall: float, pairs: int, tokens_read: int) -> dict:
    import torch

    return {"wall_s": round(wall, 2), "sentences": 2 * pairs, "sentences_per_s": round(2 * pairs / max(wall, 1e-9), 1),
            "tokens_read": int(tokens_read), "precision": pred.precision, "precision_reason": pred.precision_reason,
            "device": str(pred.device), "threads": torch.get_num_threads(),
            "cpu": cpu_model() if pred.device.type == "cpu" else torch.cuda.get_device_name(pred.device),
            "torch": torch.__version__, "python": platform.python_version(), "bertkit": __version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def _write(out: tuple[Path, Path], result: dict, pairs, scored: dict, correct) -> None:
    out[0].parent.mkdir(parents=True, exist_ok=True)
    write_whole(out[1], "".join(json.dumps(r) + "\n" for r in pair_rows(pairs, scored, correct)))
    write_whole(out[0], json.dumps(result, indent=1) + "\n")


def _print_tables(r: dict, precision: str) -> None:
    o, run = r["overall"], r["run"]
    print(f"BLiMP, {r['model']}: {r['method']}, {precision}; {o['pairs']:,} pairs of {o['paradigms']} paradigms "
          f"({len(r['phenomena'])} phenomena) in {run['wall_s']:.1f} s ({run['sentences_per_s']:,.0f} sentences/s)")
    print(f"accuracy {o['accuracy']:.3f} (95% {o['ci95'][0]:.3f}-{o['ci95'][1]:.3f}), mean over paradigms "
          f"{o['paradigm_mean']:.3f}, ties {o['ties']}")
    if r["published"]:
        print("the BLiMP paper on these paradigms: " +
              ", ".join(f"{name} {r['published'][k]:.3f}" for k, name in PUBLISHED.items()))
    head = f"{'pairs':>6s} {'accuracy':>8s} {'95% interval':>13s} " + " ".join(f"{k:>6s}" for k in COLUMNS.values())
    for title, rows in (("phenomenon", r["phenomena"]), ("paradigm", r["paradigms"])):
        width = max(len(title), *map(len, rows))
        print(f"\n{title:{width}s} {head}")
        for name, g in rows.items():
            pub = " ".join(f"{g['published'][k]:6.3f}" if g["published"] else f"{'-':>6s}" for k in COLUMNS)
            print(f"{name:{width}s} {g['pairs']:6d} {g['accuracy']:8.3f}   {g['ci95'][0]:.3f}-{g['ci95'][1]:.3f} {pub}")
