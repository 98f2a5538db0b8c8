"""The `bertkit` command: one table of subcommands.

Each entry names the module that defines the subcommand: `setup(parser)` adds its options and
`run(args) -> int` does the work (a thin layer over the Python API). Modules are imported only
when their command runs, so `bertkit --help` stays fast.
"""
from __future__ import annotations

import argparse
import gzip
import importlib
import logging
import os
import platform
import sys
from . import __version__
from .cliconfig import suggest_unknown
from .errors import BertkitError

# name -> (module under bertkit.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "info":       ("basic",    "show a checkpoint's config, parameters, heads and tokenizer casing"),
    "tokenize":   ("basic",    "encode texts or pairs to JSONL (ids, segment ids, tokens, offsets)"),
    "embed":      ("basic",    "sentence or token embeddings (cls / mean / none pooling)"),
    "embed-eval": ("embeddings", "sentence embeddings on similarity (STS) and retrieval data, per pooling"),
    "fill-mask":  ("basic",    "top-k predictions for each [MASK] in a text"),
    "inspect":    ("inspect",  "look inside a model on one sentence (pair): attention per layer and head, the segment-change test, MLM generation"),
    "tokenizer":  ("data",     "train a WordPiece vocabulary, or measure one on your text (train / stats)"),
    "prepare":    ("data",     "raw text -> sharded pre-training instances (NSP pairs, masking)"),
    "data":       ("data",     "inspect prepared data (stats / show)"),
    "pretrain":   ("pretrain", "pre-train with MLM (+NSP) on one CPU, one GPU or many (torchrun)"),
    "quickstart": ("pretrain", "train a tokenizer, prepare data and pre-train a tiny BERT in minutes"),
    "finetune":   ("finetune", "fine-tune a task head (GLUE, NER, SQuAD, SWAG, your CSV/JSONL)"),
    "evaluate":   ("predict",  "evaluate a fine-tuned checkpoint on a task's data"),
    "blimp":      ("blimp",    "BLiMP grammar minimal pairs, zero-shot: pseudo-log-likelihood (MLM) or log-likelihood (causal)"),
    "probe":      ("probe",    "logistic-regression probes of a frozen checkpoint's features (L-BFGS, C by cross-validation)"),
    "predict":    ("predict",  "run any head on JSONL input, JSONL out"),
    "score":      ("score",    "official metrics from prediction and reference files"),
    "serve":      ("serve",    "HTTP API with dynamic batching (embed, classify, fill-mask, ner, qa)"),
    "export":     ("export",   "export to ONNX (parity-checked, optional int8)"),
    "convert":    ("convert",  "Google's original TensorFlow checkpoint (bert_model.ckpt.*) to a bertkit / HF folder"),
    "ablate":     ("ablate",   "a grid of pre-training + fine-tuning arms that differ in one setting each; a table"),
}


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake (an unknown option, a bad value, a missing argument) is what any
    other bad input is: one line `bertkit COMMAND: error: ...` and exit status 1 (no usage block)."""

    def error(self, message: str):
        self.exit(1, f"{' '.join(self.prog.split()[:2])}: error: {message}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = Parser(prog="bertkit", description="BERT end to end: tokenize, prepare, "
                    "pre-train, fine-tune, evaluate, serve.")
    parser.add_argument("--version", action="version", version=f"bertkit {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging and full tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == only:  # only the command being run is imported (and --help lists them all)
            mod = importlib.import_module(f"bertkit.commands.{module}")
            getattr(mod, "setup_" + name.replace("-", "_"))(p)
            _did_you_mean(p)
    return parser


def _did_you_mean(parser: argparse.ArgumentParser) -> None:
    """Every command (and sub-command: `tokenizer train`) names its unknown option and the closest
    known one (`cliconfig.suggest_unknown`), not only those whose options come from a config class."""
    if "parse_known_args" not in vars(parser):          # not done by the command itself
        suggest_unknown(parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _did_you_mean(child)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
KEEP_FREED_BYTES = 1 << 30


def keep_freed_memory() -> str:
    """Ask glibc's malloc to keep freed blocks up to 1 GiB for the next allocation instead of handing
    them back to the OS (mmap and trim thresholds 1 GiB). Every training step and inference batch
    allocates the same large activations again; handed back, each comes back page by page, and on
    the VMs this project runs on a page fault costs ~1 us: a BERT-mini pre-training step took 150,000
    of them (docs/pretrain-measurements.md). What the IPEX launcher gets by preloading jemalloc. Process-
    wide, so the `bertkit` command calls it (its process is bertkit's), the library never does; the
    process's memory then stays at its peak. Off with BERTKIT_SYSTEM_MALLOC=1. Returns what was done."""
    if os.environ.get("BERTKIT_SYSTEM_MALLOC") == "1":
        return "system malloc settings kept (BERTKIT_SYSTEM_MALLOC=1)"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return f"system malloc settings kept (not glibc: {platform.system()} {platform.libc_ver()[0] or '?'})"
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, KEEP_FREED_BYTES) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES) == 1
    except (OSError, AttributeError) as e:
        return f"system malloc settings kept ({e})"
    return "glibc malloc keeps freed blocks up to 1 GiB (mmap and trim thresholds)" if ok else \
        "system malloc settings kept (mallopt refused)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=command if command in COMMANDS else None)
    try:
        args = parser.parse_args(argv)
    except BertkitError as e:          # a command that reads its own options (pretrain) found a bad one
        print(f"bertkit {command}: error: {e}", file=sys.stderr)
        return 1
    verbose = args.verbose or os.environ.get("BERTKIT_DEBUG") == "1"
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(levelname)s: %(message)s" if verbose else "%(message)s")
    if not getattr(args, "run", None):
        parser.print_help()
        return 2 if args.command is None else 0
    logging.getLogger("bertkit").debug("%s", keep_freed_memory())
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("bertkit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `bertkit ... | head`
        return 0
    except (BertkitError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError,
            UnicodeDecodeError, gzip.BadGzipFile) as e:
        if verbose:
            raise
        msg = str(e) if isinstance(e, BertkitError) else _os_error_message(e)
        print(f"bertkit {args.command}: error: {msg}", file=sys.stderr)
        return 1


def _os_error_message(e: Exception) -> str:
    if isinstance(e, UnicodeDecodeError):
        return f"input is not valid UTF-8 (byte {e.start}): {e.reason}"
    if isinstance(e, gzip.BadGzipFile):
        return f"a .gz input is not a gzip file ({e})"
    if isinstance(e, OSError) and e.filename:
        return f"{e.filename}: {e.strerror}"
    return str(e)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
