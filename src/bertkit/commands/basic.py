"""`bertkit info / tokenize / embed / fill-mask`: thin layers over Tokenizer, load_model and Predictor."""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Iterator, Literal

from ..cliconfig import POSITIONAL, add_options, given
from ..errors import BertkitError
from ..runconfig import AT_LEAST_1, Checked, Rule
from ..sources import jsonl_objects
from ..st_files import sentence_transformers_pooling
from ..tokenizer import Tokenizer, TokenizerError

log = logging.getLogger("bertkit")


@dataclass(kw_only=True)
class Args:
    """What the commands read and write: one field per option whatever the command (how each runs: its options)."""
    input: Annotated[str, POSITIONAL]
    """JSONL file, one input per line ('-' = stdin)"""
    text: Annotated[str, POSITIONAL]
    """the text ([MASK] where an MLM checkpoint should predict)"""
    pair: Annotated[str | None, POSITIONAL] = None
    """the right-hand segment (default: the text's second half of words, for the segment test)"""
    model: str
    """checkpoint folder (any head) with its tokenizer"""
    task: str | None = None
    """task whose input format and post-processing to use (default: the checkpoint's)"""
    data: str
    """a data file with references (also Parquet / Arrow / JSONL), a task folder (--split) or NAME:CONFIG[:SPLIT]"""
    split: str = "dev"
    """split to read when --data is a folder"""
    predictions: str | None = None
    """also write {id, prediction} JSONL here (input to `bertkit score`)"""
    head: str | None = None
    """head to load or export (default: the one config.json names)"""
    out: str | None = None
    """output JSONL (default stdout)"""
    references: str
    """the task's file as distributed (GLUE TSV, CoNLL columns, SQuAD JSON, SWAG CSV; plain or .gz); ids are its
    id column, else the 0-based data row (CoNLL: sentence)"""
    null_odds: str | None = None
    """SQuAD 2.0: {id: null odds} JSON (evaluate-v2.0.py's --na-prob-file); adds best_exact, best_f1, thresholds"""
    published: str | None = None
    """per-paradigm accuracies to show beside (default: the BLiMP paper's, bundled)"""
    json: bool = False
    """print one JSON object"""


# ---- reading inputs ------------------------------------------------------------------------------
def read_inputs(source: str, jsonl: bool | None = None) -> tuple[list[str], list[str | None] | None]:
    """Texts (and optional pairs) from a text file (one per line), `-` (stdin) or JSONL with
    `text` and optional `text_pair`. Blank lines of a text file are skipped and counted."""
    name = "<stdin>" if source == "-" else source
    if jsonl is None:
        jsonl = source.endswith((".jsonl", ".json", ".ndjson"))
    lines = list(_lines(source, name))
    blank = sum(1 for line in lines if not line.strip())
    texts: list[str] = []
    pairs: list[str | None] = []
    if jsonl:
        for lineno, obj in jsonl_objects(lines, name, error=BertkitError):
            if not isinstance(obj.get("text"), str):
                raise BertkitError(f"{name}:{lineno}: expected an object with a string field \"text\"")
            pair = obj.get("text_pair")
            if pair is not None and not isinstance(pair, str):
                raise BertkitError(f"{name}:{lineno}: \"text_pair\" must be a string")
            for field, value in (("text", obj["text"]), ("text_pair", pair)):
                if value is not None and not _is_unicode(value):
                    raise BertkitError(f"{name}:{lineno}: \"{field}\" holds a lone surrogate (\\ud800-\\udfff), "
                                       "not a Unicode character")
            texts.append(obj["text"])
            pairs.append(pair)
    else:
        texts = [line for line in lines if line.strip()]
        pairs = [None] * len(texts)
    if blank:
        log.warning("%s: skipped %d blank line(s)", name, blank)
    if not texts:
        raise BertkitError(f"{name}: no input texts (the input is empty)")
    return texts, (pairs if any(p is not None for p in pairs) else None)


def _is_unicode(text: str) -> bool:
    """False for a str holding a lone surrogate (JSON "\\ud800", or undecodable bytes in argv)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_device(device: str | None) -> None:
    """--device names a device this machine has (None: the default)."""
    if device is None:
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise BertkitError(f"--device {device!r}: not a device name (cpu, cuda, cuda:1, mps)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BertkitError(f"--device {device}: no CUDA GPU on this machine (or torch built without CUDA)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise BertkitError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise BertkitError(f"--device {device}: MPS is not available on this machine")
    elif dev.type != "cpu" or dev.index not in (None, 0):
        raise BertkitError(f"--device {device}: bertkit runs on cpu, cuda[:N] or mps")


def add_predictor_options(p: argparse.ArgumentParser, exclude: tuple[str, ...] = (),
                          help: dict[str, str] | None = None, **defaults) -> None:
    """One flag per `PredictorOptions` field (`bertkit.cliconfig`); `defaults` are this command's own (a
    one-shot command times no engine of short batches: small_batches=False)."""
    from ..infer import PredictorOptions

    add_options(p.add_argument_group("how the model runs (bertkit.infer.PredictorOptions)"), PredictorOptions,
                exclude=exclude, help=help, defaults=True, old={"--onnx": "onnx_file"})
    p.set_defaults(**defaults)


def options_of(args: argparse.Namespace, cls: type, exclude: tuple[str, ...] = (), **values):
    """The options dataclass `cls` of a command's flags (`cliconfig.add_options`, the same `exclude`) and
    `values`; the fields not given keep their defaults, and the dataclass checks them."""
    return cls(**{k: v for k, v in given(args, cls).items() if k not in exclude}, **values)


def predictor_options(args: argparse.Namespace, exclude: tuple[str, ...] = (), **values):
    """The `PredictorOptions` of a command's flags (`add_predictor_options`, the same `exclude`) and `values`."""
    from ..infer import PredictorOptions

    return options_of(args, PredictorOptions, exclude, **values)


def _lines(source: str, name: str) -> Iterator[str]:
    if source == "-":
        raw = sys.stdin.buffer.read()
    else:
        path = Path(source)
        if path.is_dir():
            raise BertkitError(f"{name}: is a directory, expected a text or JSONL file")
        if not path.is_file():
            raise BertkitError(f"{name}: no such file")
        raw = path.read_bytes()
    pieces = raw.split(b"\n")
    if pieces and pieces[-1] == b"":      # the newline that ends the last line opens no new line
        pieces.pop()
    for lineno, line in enumerate(pieces, 1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BertkitError(f"{name}:{lineno}: invalid UTF-8 at byte {e.start} of the line") from None
        text = text.removesuffix("\r")
        if lineno == 1 and text.startswith("\ufeff"):
            text = text[1:]
        yield text


def write_jsonl(rows, output: str | None) -> None:
    """One JSON object a line into `output` (None: stdout)."""
    with open(output, "w", encoding="utf-8") if output else contextlib.nullcontext(sys.stdout) as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


# ---- info ----------------------------------------------------------------------------------------
def setup_info(p) -> None:
    p.add_argument("model", metavar="DIR", help="checkpoint folder (Hugging Face format)")
    add_options(p, Args, names=("json",), defaults=True)
    p.set_defaults(run=run_info)


def describe(path: str | Path) -> dict:
    """Config, parameter count, heads and tokenizer casing of a checkpoint folder."""
    from ..checkpoint import bertkit_names, check_weights_fit_config, heads_in, read_config, read_state_dict

    path = Path(path)
    cfg, raw = read_config(path)
    sd = read_state_dict(path)
    names = bertkit_names(sd)
    renamed = {n: sd[k] for k, n in names.items() if n}
    check_weights_fit_config(cfg, renamed, path)
    params = sum(sd[k].numel() for k in names)
    encoder = sum(sd[k].numel() for k, n in names.items() if (n or "").startswith("bert."))
    info = {"path": str(path), "architectures": raw.get("architectures") or [],
            "config": {k: v for k, v in cfg.to_hf_dict().items() if k != "architectures"},
            "parameters": params, "encoder_parameters": encoder,
            "pooler": "bert.pooler.weight" in renamed, "heads": heads_in(set(renamed))}
    if raw.get("id2label"):
        info["labels"] = raw["id2label"]
    try:
        tok = Tokenizer.from_dir(path)
        info["tokenizer"] = {"vocab_size": tok.vocab_size, "lowercase": tok.lowercase,
                             "strip_accents": tok.strip_accents, "fingerprint": tok.fingerprint()[:16]}
        if tok.vocab_size > cfg.vocab_size:
            info["tokenizer"]["error"] = (f"tokenizer has {tok.vocab_size} ids but the model only "
                                          f"{cfg.vocab_size} embedding rows")
    except TokenizerError as e:
        if not any((path / f).is_file() for f in ("vocab.txt", "tokenizer.json")):
            raise       # no tokenizer at all: not a model folder anything can run (e.g. an interrupted save)
        info["tokenizer"] = {"error": str(e)}
    return info


def run_info(args) -> int:
    from ..hardware import capabilities

    info = describe(args.model)
    c = info["config"]
    caps = capabilities(c["hidden_size"], c["intermediate_size"])     # bf16 vs fp32 speed on this CPU
    info["hardware"] = {**asdict(caps), "short_inputs": _short_inputs()}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    tok = info["tokenizer"]
    lines = [
        f"checkpoint   {info['path']}",
        f"architecture {', '.join(info['architectures']) or '(not named)'}",
        f"size         {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, {c['num_attention_heads']} heads, "
        f"intermediate {c['intermediate_size']}, {c['hidden_act']}",
        "positions    " + (f"ALiBi (no table; bertkit only), trained at "
                              f"{c.get('bertkit_trained_length', c['max_position_embeddings'])}, longer with --max-length"
                              if c.get("position_embedding_type") == "alibi" else f"{c['max_position_embeddings']}")
        + f"{'; pre-LN (bertkit only)' if c.get('bertkit_norm_position') == 'pre' else ''}, segment types "
          f"{c['type_vocab_size']}, vocab {c['vocab_size']}",
        f"parameters   {info['parameters']:,} ({info['encoder_parameters']:,} in the encoder)",
        f"heads        pooler: {'yes' if info['pooler'] else 'no'}"
        f"{' (over the mean of the tokens; bertkit only)' if c.get('classifier_pooling') == 'mean' else ''}; "
        f"{', '.join(info['heads']) or 'none (encoder only)'}",
    ]
    if "labels" in info:
        lines.append(f"labels       {', '.join(f'{k}={v}' for k, v in info['labels'].items())}")
    if "error" in tok and "vocab_size" not in tok:
        lines.append(f"tokenizer    {tok['error']}")
    else:
        lines.append(f"tokenizer    WordPiece, {tok['vocab_size']} tokens, "
                     f"{'uncased (lower-cased, accents stripped)' if tok['lowercase'] else 'cased'}")
        if "error" in tok:
            lines.append(f"warning      {tok['error']}")
    lines.append(f"runs here    {caps.summary()}" + (" if it matches fp32 at load" if caps.bf16_fast else ""))
    lines.append(f"short inputs {info['hardware']['short_inputs']}")
    if r := c.get("bertkit_run"):
        lines.append(f"trained in   {r.get('precision')} on {r.get('device')}, attention {r.get('attention_kernel')}, "
                     f"{'padding-free' if r.get('packed') else 'padded'} (reused by --resume and continued runs)")
    lines.append(f"measured     {_measurements()}")
    print("\n".join(lines))
    return 0


def _measurements() -> str:
    """Where this machine's measurements live (`hardware.measured_once`) and how many there are."""
    from ..hardware import _read_measurements, measurements_path

    path = measurements_path()
    n = len(_read_measurements(path))
    return f"{path} ({n} measurement{'s' if n != 1 else ''} of this machine's speed, each made once: " \
           f"delete the file to measure again)" if n else f"{path} (nothing measured yet)"


def _short_inputs() -> str:
    """What a Predictor (bertkit serve, the Python API) will run short batches on, before loading it."""
    from ..infer.engines import installed_engines

    engines = installed_engines()
    if not engines:
        return "PyTorch (pip install 'bertkit[onnx]': onnxruntime's GEMMs are faster on short inputs on some CPUs)"
    return (f"{' or '.join(engines)} where one follows fp32 and times faster than PyTorch at load "
            "(bertkit serve, Predictor), else PyTorch")


# ---- tokenize ------------------------------------------------------------------------------------
MAX_LENGTH = Rule("at least 3 (room for [CLS] x [SEP])", lambda v: v >= 3)


@dataclass
class TokenizeOptions(Checked):
    """How `bertkit tokenize` reads and encodes its input (its flags: `cliconfig.add_options`)."""
    max_length: Annotated[int | None, MAX_LENGTH] = None
    """Truncate to N tokens (longest first for pairs)."""
    jsonl: bool | None = None
    """Read INPUT as JSONL whatever its name (default: by its name, .jsonl / .json / .ndjson)."""


def setup_tokenize(p) -> None:
    p.add_argument("input", metavar="INPUT", help="text file (one text per line), '-' for stdin, or JSONL "
                   "with 'text' and optional 'text_pair'")
    add_options(p, Args, names=("model",), defaults=True, help={"model": "checkpoint or tokenizer folder"})
    add_options(p, TokenizeOptions)
    p.set_defaults(run=run_tokenize)
    p.epilog = "example: bertkit tokenize --model DIR --max-length 128 texts.txt"


def run_tokenize(args) -> int:
    o = options_of(args, TokenizeOptions)
    tok = Tokenizer.from_dir(args.model)
    texts, pairs = read_inputs(args.input, o.jsonl)
    encs = tok.encode_batch(texts, pairs, o.max_length)
    write_jsonl(({"input_ids": e.input_ids, "token_type_ids": e.token_type_ids, "tokens": e.tokens,
                   "offsets": [list(span) for span in e.offsets], "truncated": e.truncated} for e in encs), None)
    tok.stats.report()                              # logs how many inputs truncation cut
    return 0


def _one_shot_options(args: argparse.Namespace):
    """`predictor_options`, checked: max_length (at least 1 there) leaves room for [CLS] x [SEP], a device here."""
    how = predictor_options(args)
    if how.max_length is not None and (problem := MAX_LENGTH.problem(how.max_length)):
        raise BertkitError(f"max_length {problem}")
    check_device(how.device)
    return how


# ---- embed ---------------------------------------------------------------------------------------
@dataclass
class EmbedOptions(Checked):
    """What `bertkit embed` reads and computes (its flags: `cliconfig.add_options`; how the model runs,
    max_length included: `PredictorOptions`)."""
    pooling: Literal["cls", "mean", "pooler", "none"] | None = None
    """Mean over tokens, the [CLS] state, the pre-trained pooler over it, or per token (default: the
    checkpoint's sentence-transformers pooling, else mean)."""
    normalize: bool = False
    """Unit-length vectors."""
    batch_size: Annotated[int, AT_LEAST_1] = 32
    """Texts per batch."""
    jsonl: bool | None = None
    """Read INPUT as JSONL whatever its name (default: by its name, .jsonl / .json / .ndjson)."""


def setup_embed(p) -> None:
    p.add_argument("input", metavar="INPUT", help="text file (one per line), '-' for stdin, or JSONL")
    add_options(p, Args, names=("model",), defaults=True)
    add_options(p, EmbedOptions)
    p.add_argument("--output", metavar="FILE", help="FILE.jsonl or FILE.npy (default: JSONL on stdout)")
    add_predictor_options(p, small_batches=False)           # one pass over a file: no start-up timing
    p.set_defaults(run=run_embed)


def run_embed(args) -> int:
    from tqdm.auto import tqdm

    from ..infer import Predictor

    o, how = options_of(args, EmbedOptions), _one_shot_options(args)
    to_npy = bool(args.output) and args.output.endswith(".npy")
    if args.output:
        if not args.output.endswith((".jsonl", ".npy")):
            raise BertkitError(f"--output {args.output}: use a .jsonl or .npy file name")
        if to_npy and o.pooling == "none":
            raise BertkitError("--pooling none gives one matrix per text; write it as .jsonl, not .npy")
        out = Path(args.output)
        if out.is_dir():
            raise BertkitError(f"--output {args.output}: is a directory")
        if not out.parent.is_dir():
            raise BertkitError(f"--output {args.output}: the folder {out.parent} does not exist")
    pred = Predictor.from_dir(args.model, how, head="encoder")
    texts, pairs = read_inputs(args.input, o.jsonl)
    sink = _EmbeddingSink(args.output, len(texts), pred.config.hidden_size, to_npy)
    pooling = o.pooling or sentence_transformers_pooling(args.model)[0]
    # Blocks of EMBED_BLOCK texts: memory stays flat on big inputs (written as they come), and the
    # bar moves; each block is still sorted by length into batches.
    with sink, tqdm(total=len(texts), desc="embed", unit="text", disable=None, leave=False) as bar:
        for at in range(0, len(texts), EMBED_BLOCK):
            block = slice(at, at + EMBED_BLOCK)
            vecs = pred.embed(texts[block], pairs[block] if pairs is not None else None, pooling=pooling,
                              normalize=o.normalize, max_length=how.max_length, batch_size=o.batch_size)
            sink.write(at, vecs)
            bar.update(len(vecs))
    pred.tokenizer.stats.report()
    if args.output:
        log.info("wrote %d embeddings to %s", len(texts), args.output)
    return 0


EMBED_BLOCK = 4096


class _EmbeddingSink:
    """Where `bertkit embed` writes: JSONL lines (a file or stdout) or one (N, C) .npy array
    filled block by block through a memory map. A file is written as OUTPUT.part and renamed
    when every embedding is in; on an error the partial file is removed."""

    def __init__(self, output: str | None, n: int, width: int, to_npy: bool):
        self.output, self.n, self.width, self.to_npy = output, n, width, to_npy
        self.part = output + ".part" if output else None
        self.file = self.array = None

    def __enter__(self):
        if self.to_npy:
            from numpy.lib.format import open_memmap
            self.array = open_memmap(self.part, mode="w+", dtype="float32", shape=(self.n, self.width))
        else:
            self.file = open(self.part, "w", encoding="utf-8") if self.part else sys.stdout
        return self

    def write(self, at: int, vecs) -> None:
        if self.array is not None:
            self.array[at:at + len(vecs)] = vecs
            return
        for v in vecs:
            self.file.write(json.dumps({"embedding": v.tolist()}) + "\n")

    def __exit__(self, exc_type, *exc) -> None:
        if self.array is not None:
            self.array.flush()
            del self.array
        elif self.part is not None:
            self.file.close()
        if self.part is not None:
            try:
                if exc_type is None:
                    os.replace(self.part, self.output)
            finally:
                Path(self.part).unlink(missing_ok=True)


# ---- fill-mask -----------------------------------------------------------------------------------
def setup_fill_mask(p) -> None:
    from ..predict import PredictOptions

    p.add_argument("texts", nargs="+", metavar="TEXT", help="texts with one or more [MASK] tokens")
    add_options(p, Args, names=("model", "json"), defaults=True, help={"model": "checkpoint with a masked-LM head",
                "json": "print JSON: a list per text of lists per [MASK] of {token, id, score}"})
    add_options(p, PredictOptions, names=("top_k",))            # predict's --top-k: the same setting
    add_predictor_options(p, small_batches=False)
    p.set_defaults(run=run_fill_mask)


def run_fill_mask(args) -> int:
    from ..infer import Predictor
    from ..predict import PredictOptions

    o, how = options_of(args, PredictOptions), _one_shot_options(args)
    for i, text in enumerate(args.texts):
        if not _is_unicode(text):
            raise BertkitError(f"text {i + 1}: not valid UTF-8 (undecodable bytes)")
    # the masked-LM head of a BertForMaskedLM or BertForPreTraining checkpoint (NSP weights unused)
    pred = Predictor.from_dir(args.model, how, head="masked_lm")
    results = pred.fill_mask(args.texts, top_k=o.top_k)
    pred.tokenizer.stats.report()
    if args.json:
        print(json.dumps(results, ensure_ascii=False))
        return 0
    for text, masks in zip(args.texts, results):
        print(text)
        for m, cands in enumerate(masks):
            shown = ", ".join(f"{c['token']} ({c['score']:.3f})" for c in cands)
            print(f"  [MASK] {m + 1}: {shown}")
    return 0
