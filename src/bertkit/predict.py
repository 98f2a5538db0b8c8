"""Running a fine-tuned checkpoint on new inputs: what `bertkit evaluate` and `bertkit predict` do.

`load_task_predictor` turns a checkpoint folder into a `Predictor` plus the task it was trained on
and its labels; `predict` parses JSON rows with the task's own rules, runs them through the
Predictor and post-processes them (masked-LM checkpoints answer each [MASK] instead). config.json
is read once (`checkpoint.read_config`) and handed down to the Predictor's loader and the task's
settings: how the checkpoint reads long inputs and SQuAD v2.0's null threshold
(`tasks.plumbing.inference_stride`, `qa_options`) come from it unless the caller overrides them.
The task side lives in `bertkit.tasks.plumbing`; fine-tuning (`finetune/`) is never imported.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from .checkpoint import check_inputs_fit, read_config
from .config import BertConfig
from .errors import BertkitError
from .infer import Predictor, PredictorOptions
from .runconfig import AT_LEAST_1, Checked
from .tasks import DataError
from .tasks.glue import class_probabilities
from .tasks.plumbing import checkpoint_task, featurize, inference_stride, parse_rows, qa_options


@dataclass
class PredictOptions(Checked):
    """How `evaluate` and `predict` read a task's inputs, `predict`'s keywords (the commands' flags:
    `cliconfig.add_options`; how the model runs is `PredictorOptions`). None: the checkpoint's."""
    max_length: Annotated[int | None, AT_LEAST_1] = None
    """Tokens per input (default: the fine-tuning length)."""
    stride: Annotated[int | None, AT_LEAST_1] = None
    """Overlap of the windows over long inputs (default: the stride the model was fine-tuned with)."""
    windows: bool | None = None
    """Sentence classification: average the logits of overlapping windows over long inputs; --no-windows:
    longest-first truncation (default: as fine-tuned)."""
    batch_size: Annotated[int, AT_LEAST_1] = 64
    """Inputs per batch."""
    top_k: Annotated[int, AT_LEAST_1] = 5
    """Masked LM: candidates per [MASK]."""
    null_threshold: float | None = None
    """SQuAD v2.0: answer "" when the null odds exceed this (default: the threshold best on dev, saved by
    finetune; else 0)."""


def load_task_predictor(model_dir: str | Path, task_name: str | None = None, columns: dict | None = None,
                        options: PredictorOptions | None = None, max_length: int | None = None,
                        config_json: tuple[BertConfig, dict] | None = None):
    """(predictor, task, labels, config.json) of a fine-tuned checkpoint, for `bertkit evaluate` and
    `predict`: a `Predictor` run as `options` say (default: no engine of short batches), precision
    'auto' being fp32, the precision fine-tuning evaluated in (so `evaluate` repeats its dev figures
    on any machine), the task it was trained on (or `task_name`),
    its label names. `max_length` is checked against the positions before the weights load;
    `config_json`: the folder's (BertConfig, raw dict) when the caller has read it (else read here, once)."""
    o = options or PredictorOptions(small_batches=False)
    config_json = config_json or read_config(Path(model_dir))
    config, raw = config_json
    check_inputs_fit(config, max_length=max_length)
    if o.backend == "onnx" and o.precision not in ("auto", "fp32"):
        raise BertkitError(f"--precision {o.precision}: backend onnx runs the exported fp32 graph")
    auto = o.backend == "torch" and o.precision == "auto"
    predictor = Predictor.from_dir(model_dir, o, precision="fp32" if auto else o.precision, config_json=config_json)
    if auto:
        predictor.precision_reason = "auto: fp32, the precision fine-tuning evaluated in"
    model, head = predictor.model, predictor.head
    task = checkpoint_task(raw, head, str(model_dir), task_name, columns)
    id2label = raw.get("id2label") or {}
    labels = [id2label[k] for k in sorted(id2label, key=int)] if id2label and head in (
        "sequence_classification", "token_classification") and getattr(model, "num_labels", 2) > 1 else None
    if head == "sequence_classification" and getattr(model, "problem", None) == "regression":
        labels = None
    return predictor, task, labels, raw


def predict(model_dir: str | Path, rows: list[tuple[str, dict]], task_name: str | None = None,
            columns: dict | None = None, max_length: int | None = None, stride: int | None = None,
            windows: bool | None = None, batch_size: int = 64, top_k: int = 5,
            null_threshold: float | None = None, options: PredictorOptions | None = None,
            where: str = "input") -> list[dict]:
    """`bertkit predict`: one {id, prediction, ...} record per (where, JSON object) row, in order.
    A masked-LM checkpoint answers each [MASK] with its top-k words; a task checkpoint runs the
    task's own input parsing and post-processing (classification adds class scores, NER the words,
    SQuAD v2.0 the null odds)."""
    config_json = read_config(Path(model_dir))          # the one read of config.json: handed down from here
    raw = config_json[1]
    archs = raw.get("architectures") or ["BertModel"]
    if archs[0] in ("BertForMaskedLM", "BertForPreTraining"):
        return fill_mask_rows(model_dir, rows, top_k, batch_size, max_length, options, config_json)
    predictor, task, labels, _ = load_task_predictor(model_dir, task_name, columns, options, max_length, config_json)
    head, tokenizer = predictor.head, predictor.tokenizer
    if task is None or task.parse is None:
        raise BertkitError(f"{model_dir}: `predict` needs a task head (got {head}); "
                           "use `bertkit embed` for a bare encoder")
    examples = parse_rows(task, rows, where)
    max_length = max_length or int(raw.get("bertkit_max_length", task.max_length))
    stride = inference_stride(task, raw, str(model_dir), max_length, windows, stride)
    feats, _ = featurize(task, examples, tokenizer, labels, max_length, stride, "predict")
    outputs = predictor.outputs(feats, batch_size, desc="predict")
    predictions = task.postprocess(outputs, feats, examples, labels,
                                   **qa_options(task, raw, str(model_dir), null_threshold))
    extra: dict = {}
    if head == "sequence_classification" and labels is not None:
        extra = {k: {"scores": v} for k, v in class_probabilities(outputs, feats, examples, labels).items()}
    if head == "token_classification":
        extra = {ex.id: {"words": ex.words} for ex in examples}
    if getattr(predictions, "null_odds", None):          # SQuAD v2.0: null score - best span score
        extra = {q: {"null_odds": round(v, 6)} for q, v in predictions.null_odds.items()}
    return [{"id": ex.id, "prediction": predictions[ex.id], **extra.get(ex.id, {})} for ex in examples]


def fill_mask_rows(model_dir: str | Path, rows: list[tuple[str, dict]], top_k: int = 5, batch_size: int = 64,
                   max_length: int | None = None, options: PredictorOptions | None = None,
                   config_json: tuple[BertConfig, dict] | None = None) -> list[dict]:
    """Masked-LM checkpoints: the top-k words for each [MASK] (via `bertkit.infer.Predictor`; 'auto':
    bf16 where measured faster on this machine and accurate on the sample, as `fill-mask`);
    `config_json` as `load_task_predictor` takes it."""
    texts = []
    for at, obj in rows:
        if not isinstance(obj.get("text"), str):
            raise DataError(f"{at}: needs a \"text\" field with a [MASK]")
        texts.append(obj["text"])
    predictor = Predictor.from_dir(model_dir, options or PredictorOptions(small_batches=False), head="masked_lm",
                                   max_length=max_length, config_json=config_json)
    results = predictor.fill_mask(texts, top_k=top_k, batch_size=batch_size)
    predictor.tokenizer.stats.report()
    return [{"id": str(obj.get("id", i)), "prediction": [c[0]["token"] for c in res], "candidates": res}
            for i, ((_, obj), res) in enumerate(zip(rows, results))]
