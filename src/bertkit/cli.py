"""The `bertkit` command: one table of subcommands.

Each entry names the module that defines the subcommand: `setup(parser)` adds its options and
`run(args) -> int` does the work (a thin layer over the Python API). Modules are imported only
when their command runs, so `bertkit --help` stays fast.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib
import logging
import os
import sys
from . import __version__
from .cliconfig import suggest_unknown
from .errors import BertkitError
from .heap import Heap

# commands that run without torch: they start without importing it (about 2 s)
NO_TORCH = {"tokenize", "tokenizer", "prepare"}
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
    logging.getLogger("bertkit").debug("%s", Heap().keep_freed())     # freed activations reused, not faulted in again
    with contextlib.ExitStack() as stack:
        if args.command not in NO_TORCH:    # before torch's worker threads exist: they inherit it
            from .hardware import denormals_flushed
            logging.getLogger("bertkit").debug("%s", stack.enter_context(denormals_flushed()))
        return _run(args, verbose)


def _run(args: argparse.Namespace, verbose: bool) -> int:
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
