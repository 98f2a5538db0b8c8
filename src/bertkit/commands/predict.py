"""`bertkit evaluate` and `bertkit predict`: a fine-tuned checkpoint on new data, thin layers over
`bertkit.predict` and `bertkit.tasks.plumbing`; nothing here imports fine-tuning."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..cliconfig import add_options
from ..errors import BertkitError, DataError
from ..predict import PredictOptions, load_task_predictor, predict
from ..sources import jsonl_objects
from ..tasks import BadRows, SkipBadRows
from ..tasks.plumbing import (COLUMN_KEYS, Columns, check_references, evaluate, featurize, inference_stride, qa_options,
                              write_predictions)
from .basic import Args, add_predictor_options, options_of, predictor_options, write_jsonl


def column_options(p: argparse.ArgumentParser, show_defaults: bool = False) -> None:
    """--text_column ... --format: `tasks.plumbing.Columns` (evaluate/predict: default = the checkpoint's)."""
    add_options(p.add_argument_group("your own data (--task classify / regress / tokens)"), Columns,
                show_defaults=show_defaults)


# ---- evaluate -----------------------------------------------------------------------------------
def setup_evaluate(p: argparse.ArgumentParser) -> None:
    p.epilog = "example: bertkit evaluate --model runs/sst2 --data ../shared/data/glue/SST-2/dev.tsv.gz"
    add_options(p, Args, names=("model", "task", "data", "split", "predictions", "json"), defaults=True,
                help={"model": "fine-tuned checkpoint folder", "json": "print the metrics as one JSON object"})
    add_options(p, PredictOptions, exclude=("top_k",))
    add_options(p, SkipBadRows, defaults=True)
    add_predictor_options(p, exclude=("max_length",), small_batches=False, help={
        "precision": "auto (fp32, the precision fine-tuning evaluated in), fp32, bf16 or fp16 (GPU)"})
    column_options(p)
    p.set_defaults(run=run_evaluate)


def _columns(args: argparse.Namespace) -> dict:
    """The --text_column ... --format options given (evaluate, predict: the rest come from the checkpoint)."""
    return {k: getattr(args, k) for k in COLUMN_KEYS if getattr(args, k, None) is not None}


def run_evaluate(args: argparse.Namespace) -> int:
    o, how = options_of(args, PredictOptions), predictor_options(args, ("max_length",))
    predictor, task, labels, raw = load_task_predictor(args.model, args.task, _columns(args), how, max_length=o.max_length)
    if task is None:
        raise BertkitError(f"{args.model}: a {predictor.head} checkpoint has no task to evaluate; give --task")
    path = task.split_path(args.data, args.split)
    bad = BadRows(skip=args.skip_bad_rows)
    examples = task.read(path, bad)
    check_references(task, examples, labels, str(path))
    max_length = o.max_length or int(raw.get("bertkit_max_length", task.max_length))
    stride = inference_stride(task, raw, args.model, max_length, o.windows, o.stride)
    feats, _ = featurize(task, examples, predictor.tokenizer, labels, max_length, stride, "evaluate")
    post = qa_options(task, raw, args.model, o.null_threshold)
    scores, predictions = evaluate(predictor, task, examples, feats, labels, o.batch_size, progress=True, post=post)
    if args.predictions:
        write_predictions(predictions, Path(args.predictions))
    flat = {k: v for k, v in scores.items() if not isinstance(v, dict)}
    result = {"task": task.name, "data": str(path), "examples": len(examples), **flat}
    if bad.count:
        result["skipped_rows"] = bad.count
    # after predicting: the fine-tuning package (its loop) loads only now, for a `finetune --seeds` folder's
    # spread beside the score
    from ..finetune.seeds import read_summary, spread_footer, spread_text

    seeds = read_summary(args.model)
    if seeds is not None:
        result["seeds"] = {k: v for k, v in seeds.items() if k != "runs"}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{task.name} on {path} ({len(examples)} examples" +
              (f", {bad.count} bad rows skipped" if bad.count else "") + ")")
        for k, v in flat.items():
            print((f"  {k:16s} {v:.4f}" if isinstance(v, float) else f"  {k:16s} {v}") +
                  (spread_text(seeds, k) if seeds else ""))
        if seeds:
            print(spread_footer(seeds))
    return 0


# ---- predict ------------------------------------------------------------------------------------
def setup_predict(p: argparse.ArgumentParser) -> None:
    p.epilog = ('input lines: classification {"text": .., "text_pair": ..}; NER {"tokens": [..]} or {"text": ..}; '
                'QA {"question": .., "context": ..}; masked LM {"text": "paris is the [MASK] of france."}')
    add_options(p, Args, names=("input", "model", "task", "out"), defaults=True,
                help={"model": "checkpoint folder (any head)"})
    add_options(p, PredictOptions)
    add_predictor_options(p, exclude=("max_length",), small_batches=False, help={
        "precision": "auto (fp32 for a fine-tuned task model, as fine-tuning evaluated; a masked LM as fill-mask), "
                     "fp32, bf16 or fp16 (GPU)"})
    column_options(p)
    p.set_defaults(run=run_predict)


def read_jsonl_inputs(path: str) -> list[tuple[str, dict]]:
    with sys.stdin if path == "-" else open(path, encoding="utf-8-sig") as f:
        rows = [(f"{path}:{lineno}", obj) for lineno, obj in jsonl_objects(f, path)]
    if not rows:
        raise DataError(f"{path}: no input lines (empty file)")
    return rows


def run_predict(args: argparse.Namespace) -> int:
    rows = read_jsonl_inputs(args.input)
    o, how = options_of(args, PredictOptions), predictor_options(args, ("max_length",))
    records = predict(args.model, rows, args.task, _columns(args), **vars(o), options=how, where=args.input)
    write_jsonl(records, args.out)
    return 0
