"""`bertkit score`: official metrics from a predictions file and the task's reference file.

    bertkit score --task mrpc --predictions preds.jsonl --references MRPC/dev.tsv
    bertkit score --task squad2 --predictions predictions.json --references dev-v2.0.json \\
        --null-odds null_odds.json --json

A thin layer over `bertkit.tasks.metrics.score_files`.
"""
from __future__ import annotations

import gzip
import json
import math
import zlib
from pathlib import Path

from ..cliconfig import add_options
from ..errors import BertkitError
from ..tasks.metrics import ScoreOptions, score_files
from .basic import Args, options_of


def setup_score(parser) -> None:
    add_options(parser, Args, names=("task", "predictions", "references", "null_odds"), defaults=True,
                required=("task", "predictions"), help={
        "task": "cola, sst2, mrpc, stsb, qqp, mnli, mnli-mm, qnli, rte, wnli, conll2003 (ner), squad, squad2 or swag",
        "predictions": 'JSONL lines {"id": .., "prediction": ..} (a label, a score, a list of tags, an answer, a '
                       'choice index), or the official SQuAD {id: answer} JSON'})
    add_options(parser, ScoreOptions)
    add_options(parser, Args, names=("json",), defaults=True)
    parser.set_defaults(run=run_score)


def run_score(args) -> int:
    o = options_of(args, ScoreOptions)
    for option, path in (("--references", args.references), ("--predictions", args.predictions),
                         ("--null-odds", args.null_odds)):
        if path is None:
            continue
        if option == "--references" and (not Path(path).is_file() or Path(path).suffix in (".parquet", ".arrow")):
            continue            # a glob, a dataset name or a table: the task's reader (sources.py) checks it
        _check_text_file(option, path)
    result = score_files(args.task, args.predictions, args.references, args.null_odds, o)
    if args.json:
        print(json.dumps(_finite(result)))
        return 0
    per_type = result.pop("per_type", None)
    for name, value in result.items():
        print(f"{name:20s} {_fmt(value)}")
    if per_type:
        print(f"{'type':10s} {'precision':>10s} {'recall':>10s} {'f1':>10s} {'support':>8s}")
        for t, s in per_type.items():
            print(f"{t:10s} {s['precision']:10.4f} {s['recall']:10.4f} {s['f1']:10.4f} {s['support']:8d}")
    return 0


def _check_text_file(option: str, path: str) -> None:
    """The file exists and is UTF-8 text (gzip-compressed if named .gz): a clear error naming it here,
    rather than a decoding error deep in a task reader that does not say which file."""
    p = Path(path)
    if not p.exists():
        raise BertkitError(f"{option} {path}: no such file")
    if not p.is_file():
        raise BertkitError(f"{option} {path}: not a file")
    try:
        raw = p.read_bytes()
        if p.suffix == ".gz":
            raw = gzip.decompress(raw)
        raw.decode("utf-8")
    except (OSError, EOFError, zlib.error) as e:
        raise BertkitError(f"{option} {path}: not a valid gzip file ({e})") from None
    except UnicodeDecodeError as e:
        raise BertkitError(f"{option} {path}: not valid UTF-8 text (byte {e.start})") from None


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _finite(obj):
    """JSON has no NaN: an undefined correlation (a constant column) is written as null."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
