"""`bertkit finetune`, `bertkit evaluate`, `bertkit predict`: thin layers over `bertkit.finetune`."""
from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path

from ..errors import BertkitError

log = logging.getLogger("bertkit")


def _column_options(p: argparse.ArgumentParser, show_defaults: bool = False) -> None:
    """--text_column ... --format: FinetuneConfig's fields (evaluate/predict: default = the checkpoint's)."""
    from ..cliconfig import add_options
    from ..finetune import COLUMN_KEYS, FinetuneConfig

    g = p.add_argument_group("your own data (--task classify / regress / tokens)")
    add_options(g, FinetuneConfig, names=COLUMN_KEYS, show_defaults=show_defaults)


def _window_options(p: argparse.ArgumentParser, help_windows: str) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--windows", dest="windows", action="store_const", const=True, help=help_windows)
    g.add_argument("--no-windows", dest="windows", action="store_const", const=False,
                   help="sentence classification: longest-first truncation of long inputs")


def qa_options(args: argparse.Namespace, task, raw: dict, where: str) -> dict:
    """Postprocess options of a QA checkpoint: SQuAD v2.0's null threshold (--null-threshold, else
    the one fine-tuning found best on dev, config.json `bertkit_null_threshold`, else 0)."""
    threshold = getattr(args, "null_threshold", None)
    if task is None or task.head != "question_answering":
        if threshold is not None:
            raise BertkitError("--null-threshold applies to SQuAD v2.0 question answering")
        return {}
    from ..tasks.squad import qa_settings
    if threshold is not None and task.name != "squad2":
        raise BertkitError(f"--null-threshold applies to SQuAD v2.0 models; this one answers {task.name}")
    try:
        saved = qa_settings(raw)["null_threshold"]
    except BertkitError as e:
        raise BertkitError(f"{where}/{e}") from None
    if threshold is not None and (threshold != threshold or abs(threshold) == float("inf")):
        raise BertkitError(f"--null-threshold must be a finite number, got {threshold}")
    return {"null_threshold": saved if threshold is None else threshold}


def _null_threshold_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--null-threshold", dest="null_threshold", type=float,
                   help="SQuAD v2.0: answer \"\" when the null odds exceed this (default: the threshold "
                        "best on dev, saved by finetune; else 0)")


def inference_stride(args: argparse.Namespace, task, raw: dict, where: str, max_length: int) -> int | None:
    """--stride / --windows / --no-windows, else how the checkpoint was fine-tuned to read long
    inputs (config.json `bertkit_stride`), else the task's default."""
    from ..finetune import input_stride

    saved = raw.get("bertkit_stride", task.stride)
    if saved is not None and (isinstance(saved, bool) or not isinstance(saved, int) or saved < 0):
        raise BertkitError(f"{where}/config.json: bertkit_stride must be a non-negative integer or null, "
                           f"got {saved!r}")
    windows, stride = getattr(args, "windows", None), args.stride
    if windows is None and stride is None:
        return saved
    if windows and stride is None and saved is not None:
        stride = saved
    return input_stride(task, windows, stride, max_length)


# ---- finetune -----------------------------------------------------------------------------------
def setup_finetune(p: argparse.ArgumentParser) -> None:
    """Every option is a FinetuneConfig field of the same name (`bertkit.cliconfig`): the flag, the
    YAML key and the attribute are one name; --batch-size is accepted for --batch_size."""
    from ..cliconfig import add_options, suggest_unknown
    from ..finetune import COLUMN_KEYS, FinetuneConfig

    p.epilog = ("example: bertkit finetune --task sst2 --data ../shared/data/glue/SST-2 --model MODEL_DIR "
                "--out runs/sst2   |   bertkit finetune configs/finetune/sst2_minilm.yaml --seed 1")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("config", nargs="?", help="YAML file of FinetuneConfig values (options below override it)")
    add_options(p, FinetuneConfig, exclude=COLUMN_KEYS)
    p.add_argument("--grid", action="store_true",
                   help="the paper's grid: batch {16,32} x lr {5e-5,3e-5,2e-5} x epochs {2,3,4}; best on dev")
    _column_options(p, show_defaults=True)
    suggest_unknown(p)
    p.set_defaults(run=run_finetune)


def finetune_config(args: argparse.Namespace):
    """FinetuneConfig from the YAML file (if any), then the options given (same names, checked alike)."""
    from ..cliconfig import given
    from ..finetune import FinetuneConfig
    from ..runconfig import RunConfigError, from_dict, read_yaml_mapping

    data: dict = {}
    source = "options"
    if args.config:
        data = read_yaml_mapping(args.config, "FinetuneConfig keys")
        source = args.config
    data.update(given(args, FinetuneConfig))
    try:
        cfg = from_dict(FinetuneConfig, data, source)
    except RunConfigError as e:
        raise BertkitError(str(e)) from None
    if not cfg.model:
        raise BertkitError("give --model DIR (a pre-trained checkpoint folder) or `model:` in the config")
    return cfg


def run_finetune(args: argparse.Namespace) -> int:
    from ..finetune import finetune, grid

    cfg = finetune_config(args)
    command = "bertkit " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    if args.grid:
        summary = grid(cfg, command)
        print(json.dumps(summary["best"]))
    else:
        result = finetune(cfg, command)
        print(json.dumps({"task": result["task"], "out": cfg.out, "best_step": result["best_step"],
                          "dev": {k: v for k, v in (result["dev"] or {}).items() if not isinstance(v, dict)}}))
    return 0


# ---- evaluate -----------------------------------------------------------------------------------
def setup_evaluate(p: argparse.ArgumentParser) -> None:
    p.epilog = "example: bertkit evaluate --model runs/sst2 --data ../shared/data/glue/SST-2/dev.tsv.gz"
    p.add_argument("--model", required=True, help="fine-tuned checkpoint folder")
    p.add_argument("--task", help="task (default: the one the checkpoint was fine-tuned on)")
    p.add_argument("--data", required=True, help="a data file with references (also Parquet / Arrow / JSONL), a "
                                                "task folder (see --split), or a dataset name NAME:CONFIG[:SPLIT]")
    p.add_argument("--split", default="dev", help="split to read when --data is a folder (default dev)")
    p.add_argument("--max-length", dest="max_length", type=int, help="default: the fine-tuning length")
    p.add_argument("--stride", type=int, help="default: the stride the model was fine-tuned with")
    _window_options(p, "sentence classification: average the logits of overlapping windows over long inputs")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=64)
    p.add_argument("--skip-bad-rows", dest="skip_bad_rows", action="store_true")
    p.add_argument("--predictions", help="also write {id, prediction} JSONL here (input to `bertkit score`)")
    _null_threshold_option(p)
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.add_argument("--threads", type=int)
    _column_options(p)
    p.set_defaults(run=run_evaluate)


def load_for_inference(args: argparse.Namespace, backend: str = "torch"):
    """(predictor, task, labels, config.json) of --model (`bertkit.finetune.load_for_inference`)."""
    from ..finetune import COLUMN_KEYS, load_for_inference as load

    columns = {k: getattr(args, k) for k in COLUMN_KEYS if getattr(args, k, None) is not None}
    return load(args.model, args.task, columns, backend=backend, onnx_file=getattr(args, "onnx", None),
                threads=args.threads)


def run_evaluate(args: argparse.Namespace) -> int:
    from ..finetune import check_references, evaluate, featurize, write_predictions
    from ..tasks import BadRows

    predictor, task, labels, raw = load_for_inference(args)
    tokenizer = predictor.tokenizer
    if task is None:
        raise BertkitError(f"{args.model}: a {predictor.head} checkpoint has no task to evaluate; give --task")
    path = task.split_path(args.data, args.split)
    bad = BadRows(skip=args.skip_bad_rows)
    examples = task.read(path, bad)
    check_references(task, examples, labels, str(path))
    max_length = args.max_length or int(raw.get("bertkit_max_length", task.max_length))
    stride = inference_stride(args, task, raw, args.model, max_length)
    feats, _ = featurize(task, examples, tokenizer, labels, max_length, stride, "evaluate")
    post = qa_options(args, task, raw, args.model)
    scores, predictions = evaluate(predictor, task, examples, feats, labels, args.batch_size, progress=True, post=post)
    if args.predictions:
        write_predictions(predictions, Path(args.predictions))
    flat = {k: v for k, v in scores.items() if not isinstance(v, dict)}
    result = {"task": task.name, "data": str(path), "examples": len(examples), **flat}
    if bad.count:
        result["skipped_rows"] = bad.count
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{task.name} on {path} ({len(examples)} examples" +
              (f", {bad.count} bad rows skipped" if bad.count else "") + ")")
        for k, v in flat.items():
            print(f"  {k:16s} {v:.4f}" if isinstance(v, float) else f"  {k:16s} {v}")
    return 0


# ---- predict ------------------------------------------------------------------------------------
def setup_predict(p: argparse.ArgumentParser) -> None:
    p.epilog = ('input lines: classification {"text": .., "text_pair": ..}; NER {"tokens": [..]} or {"text": ..}; '
                'QA {"question": .., "context": ..}; masked LM {"text": "paris is the [MASK] of france."}')
    p.add_argument("input", help="JSONL file, one input per line ('-' = stdin)")
    p.add_argument("--model", required=True, help="checkpoint folder (any head)")
    p.add_argument("--task", help="task whose input format and post-processing to use (default: the checkpoint's)")
    p.add_argument("--out", help="output JSONL (default stdout)")
    p.add_argument("--max-length", dest="max_length", type=int)
    p.add_argument("--stride", type=int, help="default: the stride the model was fine-tuned with")
    _window_options(p, "sentence classification: average the logits of overlapping windows over long inputs")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=64)
    p.add_argument("--top-k", dest="top_k", type=int, default=5, help="masked LM: candidates per [MASK]")
    _null_threshold_option(p)
    p.add_argument("--threads", type=int)
    p.add_argument("--backend", choices=("torch", "onnx"), default="torch",
                   help="run the model on PyTorch or on onnxruntime (a file from `bertkit export onnx`)")
    p.add_argument("--onnx", default=None, metavar="FILE", help="ONNX file for --backend onnx (default DIR/model.onnx)")
    _column_options(p)
    p.set_defaults(run=run_predict)


def read_jsonl_inputs(path: str) -> list[tuple[str, dict]]:
    from ..tasks import DataError

    f = sys.stdin if path == "-" else open(path, encoding="utf-8-sig")
    rows = []
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object")
            rows.append((f"{path}:{lineno}", obj))
    if not rows:
        raise DataError(f"{path}: no input lines (empty file)")
    return rows


def run_predict(args: argparse.Namespace) -> int:
    rows = read_jsonl_inputs(args.input)
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
    try:
        for record in predict_rows(args, rows):
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    finally:
        if args.out:
            out.close()
    return 0


def predict_rows(args: argparse.Namespace, rows: list[tuple[str, dict]]) -> list[dict]:
    from ..checkpoint import read_config
    from ..finetune import featurize

    _, raw = read_config(Path(args.model))
    archs = raw.get("architectures") or ["BertModel"]
    if archs[0] in ("BertForMaskedLM", "BertForPreTraining"):
        return fill_mask_rows(args, rows)
    predictor, task, labels, raw = load_for_inference(args, getattr(args, "backend", "torch"))
    head, tokenizer = predictor.head, predictor.tokenizer
    if task is None or task.parse is None:
        raise BertkitError(f"{args.model}: `predict` needs a task head (got {head}); "
                           "use `bertkit embed` for a bare encoder")
    examples = []
    for i, (where, obj) in enumerate(rows):
        ex = task.parse(obj, where)
        if not ex.id:
            ex.id = str(i)
        examples.append(ex)
    ids = [ex.id for ex in examples]
    if len(set(ids)) != len(ids):
        raise BertkitError(f"{args.input}: ids must be unique")
    max_length = args.max_length or int(raw.get("bertkit_max_length", task.max_length))
    stride = inference_stride(args, task, raw, args.model, max_length)
    feats, _ = featurize(task, examples, tokenizer, labels, max_length, stride, "predict")
    outputs = predictor.outputs(feats, args.batch_size, desc="predict")
    predictions = task.postprocess(outputs, feats, examples, labels, **qa_options(args, task, raw, args.model))
    extra: dict = {}
    if head == "sequence_classification" and labels is not None:
        from ..tasks.glue import class_probabilities
        extra = {k: {"scores": v} for k, v in class_probabilities(outputs, feats, examples, labels).items()}
    if head == "token_classification":
        extra = {ex.id: {"words": ex.words} for ex in examples}
    if getattr(predictions, "null_odds", None):          # SQuAD v2.0: null score - best span score
        extra = {q: {"null_odds": round(v, 6)} for q, v in predictions.null_odds.items()}
    return [{"id": ex.id, "prediction": predictions[ex.id], **extra.get(ex.id, {})} for ex in examples]


def fill_mask_rows(args: argparse.Namespace, rows: list[tuple[str, dict]]) -> list[dict]:
    """Masked-LM checkpoints: the top-k words for each [MASK] (via `bertkit.infer.Predictor`)."""
    from ..infer import Predictor
    from ..tasks import DataError

    texts = []
    for where, obj in rows:
        if not isinstance(obj.get("text"), str):
            raise DataError(f"{where}: needs a \"text\" field with a [MASK]")
        texts.append(obj["text"])
    predictor = Predictor.from_dir(args.model, head="masked_lm", threads=args.threads, max_length=args.max_length,
                                   backend=getattr(args, "backend", "torch"), onnx_file=getattr(args, "onnx", None))
    results = predictor.fill_mask(texts, top_k=args.top_k, batch_size=args.batch_size)
    return [{"id": str(obj.get("id", i)), "prediction": [c[0]["token"] for c in res], "candidates": res}
            for i, ((_, obj), res) in enumerate(zip(rows, results))]
