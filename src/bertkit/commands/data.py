"""`bertkit tokenizer train|stats`, `bertkit prepare`, `bertkit data stats|show|nsp-shortcut`."""
from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from dataclasses import dataclass
from typing import Annotated

from ..cliconfig import POSITIONAL, add_options, given, suggest_unknown
from ..data.masking import default_max_predictions
from ..data.prepare import PrepareConfig, PrepareRunOptions, prepare
from ..data.pretraining import open_dataset
from ..data.stats import (DataStatsOptions, ShowOptions, TokenizerStatsOptions, data_stats, show_instances,
                          tokenizer_stats)
from ..data.text import expand_inputs
from ..errors import BertkitError
from ..runconfig import RunConfigError, from_dict
from ..tokenizer import Tokenizer, TokenizerTrainOptions, train_to_folder
from .basic import options_of

log = logging.getLogger("bertkit")


@dataclass(kw_only=True)
class DataArgs:
    """What `bertkit tokenizer|prepare|data` read and write (how each reads it: its options dataclass)."""
    files: Annotated[tuple[str, ...], POSITIONAL]
    """.txt / .txt.gz files, globs or folders"""
    dir: Annotated[str, POSITIONAL]
    """prepared data folder"""
    input: tuple[str, ...]
    """.txt / .txt.gz files, globs or folders: one sentence per line, blank line between documents"""
    model: str
    """tokenizer or checkpoint folder (vocab.txt / tokenizer.json)"""
    out: str
    """folder to write (tokenizer train: the tokenizer; prepare: meta.json + shard-*/)"""
    json: bool = False
    """print one JSON object"""
    progress: bool = True
    """a progress bar (where stderr is a terminal)"""


def _sub(parser: argparse.ArgumentParser, name: str, help_: str) -> argparse.ArgumentParser:
    subs = getattr(parser, "_bertkit_subs", None)
    if subs is None:
        subs = parser.add_subparsers(dest="action", metavar="ACTION")
        parser._bertkit_subs = subs
        parser.set_defaults(run=lambda a: (parser.print_help(), 2)[1])     # no action given: the help, exit 2
    return subs.add_parser(name, help=help_, description=help_)


# ---- tokenizer ----------------------------------------------------------------------------------
def setup_tokenizer(parser: argparse.ArgumentParser) -> None:
    p = _sub(parser, "train", "learn a WordPiece vocabulary (vocab.txt, tokenizer.json, tokenizer_config.json)")
    add_options(p, DataArgs, names=("files", "out"), defaults=True)
    add_options(p, TokenizerTrainOptions)
    p.set_defaults(run=run_tokenizer_train)
    p = _sub(parser, "stats", "measure a tokenizer on your text: pieces per word, [UNK] rate, truncation")
    add_options(p, DataArgs, names=("files", "model", "json"), defaults=True)
    add_options(p, TokenizerStatsOptions)
    p.set_defaults(run=run_tokenizer_stats)


def run_tokenizer_train(args) -> int:
    o = options_of(args, TokenizerTrainOptions)
    files = expand_inputs(args.files)
    # written as OUT.incomplete and swapped in whole: a killed rerun never mixes old and new files
    tok = train_to_folder(files, args.out, o, show_progress=sys.stderr.isatty())
    log.info("trained a %s WordPiece vocabulary of %d tokens on %d files -> %s",
             "cased" if o.cased else "uncased", tok.vocab_size, len(files), args.out)
    return 0


def run_tokenizer_stats(args) -> int:
    o = options_of(args, TokenizerStatsOptions)                 # checked before the tokenizer loads
    s = tokenizer_stats(Tokenizer.from_dir(args.model), args.files, o)
    if args.json:
        print(json.dumps(s))
        return 0
    print(f"{s['sentences']:,} sentences in {s['documents']:,} documents ({s['words']:,} words, "
          f"{s['pieces']:,} pieces){' - sampled' if s['sampled'] else ''}")
    print(f"pieces per word        {s['pieces_per_word']:.3f}")
    print(f"[UNK] rate             {s['unk_rate']:.4%} of pieces")
    print(f"words in 3+ pieces     {s['words_3plus_pieces']:.2%}")
    print(f"mean sentence length   {s['mean_sentence_pieces']:.1f} pieces")
    print(f"over {s['max_length']} tokens:       {s['documents_truncated']:.1%} of documents, "
          f"{s['pairs_truncated']:.1%} of consecutive sentence pairs, {s['sentences_truncated']:.2%} of sentences")
    return 0


# ---- prepare ------------------------------------------------------------------------------------
# Former spellings (Google's create_pretraining_data.py names, shortcuts): the one-line error "X is now Y".
MOVED_FLAGS = {"--max_seq_length": "max_length", "--masked_lm_prob": "masking_config.mask_prob",
               "--max_predictions_per_seq": "masking_config.max_predictions",
               "--mask_token_fraction": "masking_config.mask_token_fraction",
               "--random_token_fraction": "masking_config.random_token_fraction",
               "--whole_word": "--masking_config.mode=whole_word", "--span": "--masking_config.mode=span"}


def setup_prepare(parser: argparse.ArgumentParser) -> None:
    """Every data option is a PrepareConfig field of the same name (`bertkit.cliconfig`), masking ones
    as `--masking_config.KEY`, and how it runs a PrepareRunOptions field; Google's spellings
    (--masked-lm-prob, ...) say what replaced them."""
    p = parser
    add_options(p, DataArgs, names=("model", "input", "out"), defaults=True)
    add_options(p, PrepareRunOptions)
    add_options(p, PrepareConfig, old=MOVED_FLAGS, help={
        "masking_config.max_predictions": "Cap on predictions per sequence (default: max_length x mask_prob "
                                          "rounded up to a multiple of 10: 20 at 128, 80 at 512, as Google's scripts)"})
    suggest_unknown(p)
    p.set_defaults(run=run_prepare)


def prepare_config(args: argparse.Namespace):
    """PrepareConfig from the options given (defaults for the rest); the prediction cap, when not
    given, follows the length and the masking rate (`masking.default_max_predictions`)."""
    values = given(args, PrepareConfig)
    masking = values.setdefault("masking_config", {})
    if "max_predictions" not in masking:
        masking["max_predictions"] = default_max_predictions(values.get("max_length", 128),
                                                             masking.get("mask_prob", 0.15))
    try:
        return from_dict(PrepareConfig, values, "options")
    except RunConfigError as e:
        raise BertkitError(str(e).removeprefix("options: ")) from None


def command_line(args: argparse.Namespace) -> str:
    """The command as it would be typed again: every option given but --[no-]progress, in its canonical
    spelling."""
    parts = ["bertkit", "prepare", "--model", args.model, "--input", *args.input, "--out", args.out]

    def flat(values: dict, prefix: str = "") -> None:
        for k, v in values.items():
            if isinstance(v, dict):
                flat(v, f"{prefix}{k}.")
            elif isinstance(v, bool):
                parts.append(f"--{prefix}{k}" if v else f"--no-{prefix}{k}")
            else:
                parts.extend([f"--{prefix}{k}", str(v)])
    flat({k: v for k, v in given(args, PrepareRunOptions).items() if k != "progress"})
    flat(given(args, PrepareConfig))
    return shlex.join(parts)


def run_prepare(args) -> int:
    cfg, run = prepare_config(args), options_of(args, PrepareRunOptions)
    meta = prepare(args.input, Tokenizer.from_dir(args.model), args.out, cfg, **vars(run), command=command_line(args))
    c = meta["counts"]
    notes = [f"{c[k]} {k.replace('_', ' ')}" for k in ("empty_files", "invalid_utf8_lines", "long_lines_split",
                                                        "long_documents_split", "one_sentence_documents",
                                                        "sentences_split", "sentences_cut", "empty_documents_dropped") if c.get(k)]
    if notes:
        log.info("input notes (counted in meta.json): %s", ", ".join(notes))
    return 0


# ---- data ---------------------------------------------------------------------------------------
def setup_data(parser: argparse.ArgumentParser) -> None:
    from ..nsp_probe import ShortcutOptions

    p = _sub(parser, "stats", "instances, tokens, lengths, NSP and masking fractions of prepared data")
    add_options(p, DataArgs, names=("dir", "json"), defaults=True)
    add_options(p, DataStatsOptions, old={"--whole_word": "--mask_mode=whole_word", "--span": "--mask_mode=span"})
    p.set_defaults(run=run_data_stats)
    p = _sub(parser, "show", "print decoded instances with segments and masks marked {shown|target}")
    add_options(p, DataArgs, names=("dir",), defaults=True)
    add_options(p, ShowOptions)
    p.set_defaults(run=run_data_show)
    p = _sub(parser, "nsp-shortcut", "NSP's topic shortcut: a checkpoint's NSP head on next, other-document and "
             "same-document pairs of held-out text, beside a bag-of-words baseline")
    add_options(p, DataArgs, names=("files", "model", "progress", "json"), defaults=True, help={
        "files": "held-out .txt / .txt.gz: one sentence per line, blank line between documents",
        "model": "checkpoint with an NSP head (or, with --topic_only, a tokenizer)"})
    add_options(p, ShortcutOptions)
    p.set_defaults(run=run_nsp_shortcut)


def run_data_stats(args) -> int:
    o = options_of(args, DataStatsOptions)                      # checked before the data opens
    s = data_stats(open_dataset(args.dir), o)
    if args.json:
        print(json.dumps(s))
        return 0
    m = s["masking"]
    print(f"{s['instances']:,} instances, {s['tokens']:,} tokens in {s['shards']} shards "
          f"(max length {s['max_length']}, longest {s['longest']}, mean {s['mean_length']:.1f}, "
          f"{s['full_length_fraction']:.1%} full)")
    if s["nsp"]:
        print(f"NSP: {s['random_next_fraction']:.2%} random next; A {s['mean_a_length']:.1f} / "
              f"B {s['mean_b_length']:.1f} tokens on average; {s['short_fraction']:.2%} from short targets")
    else:
        print("no NSP (full-sentence packing)")
    print(f"masking ({m['mode']}, {m['config']['mode']}, measured on {m['instances_measured']:,} instances): "
          f"{m['selected_fraction']:.2%} of tokens selected ({m['predictions_per_instance']:.1f} per instance, "
          f"{m['at_cap_fraction']:.1%} at the cap of {m['config']['max_predictions']}); of those "
          f"{m['mask_fraction']:.1%} [MASK], {m['keep_fraction']:.1%} kept, {m['random_fraction']:.1%} random")
    print("length histogram: " + ", ".join(f"{k}: {v}" for k, v in s["length_histogram"].items() if v))
    print(_held_out_line(s["held_out"]))
    if s.get("topic"):
        print(_topic_line(s["topic"]))
    if s["malformed"]:
        print(f"WARNING: {s['malformed']} malformed instances")
    return 0


def _held_out_line(h: dict) -> str:
    if h.get("overlap") is None:
        return f"held-out: {h.get('source', 'none')}"
    seen = (f"{h['overlap']:.2%} of its 12-grams occur in training ({h['eval_instances']} instances measured "
            f"against {h['train_tokens_scanned'] / 1e6:.2f} M of {h['train_tokens'] / 1e6:.2f} M training tokens)")
    if h["source"] == "split":
        sp = h["split"]
        return (f"held-out split: {sp['documents']:,} of {sp['of_documents']:,} documents ({sp['fraction']:.1%}), "
                f"{sp['instances']:,} instances in {h['path']}; {seen}")
    return (f"held-out: NONE - prepared without a split, so pretrain would evaluate on the last "
            f"{h['instances']} instances; {seen}: mask leakage (prepare again to hold documents out)")


def _topic_line(t: dict) -> str:
    """The topic shortcut in one line (data.stats.topic_baseline)."""
    if t["auc"] is None or t["accuracy"] is None:
        return f"topic shortcut: not measured ({t['pairs']} pairs, one class only)"
    what = "in-order from swapped (SOP: expect chance)" if t["pair_mode"] == "sop" else "is-next from random-next"
    return (f"topic shortcut: the words of A and B alone (TF-IDF cosine, no model, no order) tell {what} in "
            f"{t['accuracy']:.1%} of {t['scored_pairs']:,} pairs (threshold fit on {t['fit_pairs']:,} others; chance "
            f"{t['chance']:.1%}; ROC AUC {t['auc']:.3f}): NSP accuracy up to that needs no coherence")


def run_nsp_shortcut(args) -> int:
    from ..nsp_probe import ShortcutOptions, nsp_shortcut, report_text

    r = nsp_shortcut(args.model, args.files, **vars(options_of(args, ShortcutOptions)),
                     progress=args.progress and sys.stderr.isatty())
    print(json.dumps(r) if args.json else report_text(r))
    return 0


def run_data_show(args) -> int:
    o = options_of(args, ShowOptions)
    ds = open_dataset(args.dir)
    if o.start >= len(ds):
        raise BertkitError(f"--start {o.start}: {args.dir} holds {len(ds)} instances (0..{len(ds) - 1})")
    print(show_instances(ds, o))
    return 0
