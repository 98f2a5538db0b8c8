"""`bertkit serve`: a thin layer over bertkit.serve."""
from __future__ import annotations

import argparse
import logging
import math
import os
from pathlib import Path

from ..cliconfig import add_options, given, suggest_unknown
from ..errors import BertkitError
from ..infer import Predictor, agreement
from ..infer.choose import sample_lines
from ..predict import PredictOptions
from ..serve import ServeConfig
from ..serve.http import check_bind, is_loopback
from ..st_files import sentence_transformers_pooling
from .basic import Args, add_predictor_options, check_device, predictor_options

log = logging.getLogger("bertkit")


def report_int8(args, predictor) -> dict:
    """Log how closely the int8 model follows fp32 on the bundled sample sentences."""
    reference = Predictor.from_dir(args.model, head=args.head, device="cpu", precision="fp32",
                                   max_length=predictor.max_length, small_batches=False)
    rep = agreement(predictor, reference, sample_lines())
    log.info("int8 vs fp32 on %d sample sentences: cosine mean %.4f, min %.4f, max abs diff %.3g",
             rep["n"], rep["cosine_mean"], rep["cosine_min"], rep["max_abs_diff"])
    predictor.int8_agreement = rep
    return rep


# ---- serve ---------------------------------------------------------------------------------------
# Default token budget of one batching round: on the CPU a round of 8192 tokens takes seconds, and
# requests arriving meanwhile wait for it and then for their own (docs/serve-measurements.md: 2048
# gave twice the requests/s); a GPU round of 8192 takes milliseconds, and larger batches use it better.
CPU_BATCH_TOKENS, GPU_BATCH_TOKENS = 2048, 8192

# ServeConfig fields a checkpoint decides (sentence-transformers pooling), not options
_FROM_CHECKPOINT = ("embed_pooling", "embed_normalize")
# former flags -> ServeConfig fields: each a one-line "is now" error naming the new spelling
_FORMER = {"--header-timeout": "header_timeout_s", "--body-timeout": "body_timeout_s",
           "--send-timeout": "send_timeout_s", "--keep-alive-timeout": "keep_alive_s",
           "--shutdown-timeout": "shutdown_timeout_s"}


def setup_serve(p: argparse.ArgumentParser) -> None:
    """Model options (how a Predictor loads), then one option per ServeConfig field (`bertkit.cliconfig`):
    the flag and the attribute are one name (--max_batch_tokens, also --max-batch-tokens)."""
    add_options(p, Args, names=("model", "head"), defaults=True)
    add_predictor_options(p, exclude=("max_length",))           # its max_length is ServeConfig's
    add_options(p, ServeConfig, exclude=_FROM_CHECKPOINT, defaults=True, old=_FORMER, help={
        "max_batch_tokens": f"Most real tokens one batching round may hold (default {CPU_BATCH_TOKENS} on the CPU, "
                            f"{GPU_BATCH_TOKENS} on a GPU).",
        "max_length": "Most tokens of one text (default: the checkpoint's limit); longer texts get 413 unless "
                      "\"truncate\": true.",
        "served_model_name": "The `model` that /v1/embeddings and /v1/models report (default: the checkpoint "
                             "folder's name).",
        "api_key": "Require 'Authorization: Bearer KEY' on every route but /healthz and the page / (default: "
                   "$BERTKIT_API_KEY); a --host beyond loopback needs it or --insecure-no-api-key."})
    p.set_defaults(max_batch_tokens=None, max_length=None, served_model_name=None,
                   api_key=os.environ.get("BERTKIT_API_KEY") or None)
    p.add_argument("--insecure-no-api-key", action="store_true",
                   help="allow a --host beyond loopback without an API key")
    add_options(p, PredictOptions, names=("null_threshold",), defaults=True)        # evaluate's and predict's
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    suggest_unknown(p)
    p.set_defaults(run=run_serve)


def run_serve(args) -> int:
    try:
        from ..serve import serve
    except ImportError as e:
        raise BertkitError(f"bertkit serve needs FastAPI and uvicorn: pip install 'bertkit[serve]' ({e})") from None
    ServeConfig(**{k: v for k, v in given(args, ServeConfig).items() if v is not None})   # in range: fail fast
    check_device(args.device)
    check_bind(args.host, args.api_key, args.insecure_no_api_key)      # before the model loads: fail fast
    if args.null_threshold is not None and not math.isfinite(args.null_threshold):
        raise BertkitError(f"null_threshold must be a finite number, got {args.null_threshold}")
    how = predictor_options(args, ("max_length",), max_length=args.max_length)
    predictor = Predictor.from_dir(args.model, how, head=args.head)
    if args.null_threshold is not None:
        predictor.null_threshold = args.null_threshold
    if args.int8:
        report_int8(args, predictor)
    if args.max_length is not None and args.max_length > predictor.max_length:
        raise BertkitError(f"--max_length {args.max_length} is over the model's limit {predictor.max_length}")
    if args.max_batch_tokens is None:
        args.max_batch_tokens = CPU_BATCH_TOKENS if predictor.device.type == "cpu" else GPU_BATCH_TOKENS
    if args.max_batch_tokens < predictor.max_length:
        log.warning("--max_batch_tokens %d is below --max_length %d: long texts run alone",
                    args.max_batch_tokens, predictor.max_length)
    pooling, normalize = sentence_transformers_pooling(args.model)
    cfg = ServeConfig(**{**given(args, ServeConfig), "max_length": predictor.max_length,
                         "served_model_name": args.served_model_name or Path(args.model).resolve().name,
                         "embed_pooling": pooling, "embed_normalize": normalize})
    if args.api_key is None and not is_loopback(args.host):
        log.warning("listening on %s without an API key (--insecure-no-api-key)", args.host)
    return serve(predictor, cfg, log_level=args.log_level)

