"""`bertkit tokenizer train|stats`, `bertkit prepare`, `bertkit data stats|show`."""
from __future__ import annotations

import argparse
import json
import logging
import math
import shlex
import sys

from ..errors import BertkitError

log = logging.getLogger("bertkit")


def _sub(parser: argparse.ArgumentParser, name: str, help_: str) -> argparse.ArgumentParser:
    subs = getattr(parser, "_bertkit_subs", None)
    if subs is None:
        subs = parser.add_subparsers(dest="action", metavar="ACTION")
        parser._bertkit_subs = subs
    return subs.add_parser(name, help=help_, description=help_)


def _load_tokenizer(path: str):
    from ..tokenizer import Tokenizer
    return Tokenizer.from_dir(path)


# ---- tokenizer ----------------------------------------------------------------------------------
def setup_tokenizer(parser: argparse.ArgumentParser) -> None:
    p = _sub(parser, "train", "learn a WordPiece vocabulary (vocab.txt, tokenizer.json, tokenizer_config.json)")
    p.add_argument("files", nargs="+", help=".txt / .txt.gz files, globs or folders")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--cased", action="store_true", help="keep case and accents (default: uncased, like bert-base-uncased)")
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--out", required=True, help="folder to write the tokenizer to")
    p.set_defaults(run=run_tokenizer_train)
    p = _sub(parser, "stats", "measure a tokenizer on your text: pieces per word, [UNK] rate, truncation")
    p.add_argument("files", nargs="+", help=".txt / .txt.gz files, globs or folders")
    p.add_argument("--model", required=True, help="tokenizer or checkpoint folder")
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--max-sentences", type=int, default=200_000, help="measure on the first N sentences")
    p.add_argument("--sentence-split", action="store_true", help="lines are paragraphs: split into sentences")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run_tokenizer_stats)
    parser.set_defaults(run=lambda a: (parser.print_help(), 2)[1])


def run_tokenizer_train(args) -> int:
    from ..tokenizer import train_to_folder
    from ..data.text import expand_inputs
    if args.vocab_size < 10:
        raise BertkitError(f"--vocab-size {args.vocab_size}: too small")
    files = expand_inputs(args.files)
    # written as OUT.incomplete and swapped in whole: a killed rerun never mixes old and new files
    tok = train_to_folder(files, args.out, vocab_size=args.vocab_size, lowercase=not args.cased,
                          min_frequency=args.min_frequency, show_progress=sys.stderr.isatty())
    log.info("trained a %s WordPiece vocabulary of %d tokens on %d files -> %s",
             "cased" if args.cased else "uncased", tok.vocab_size, len(files), args.out)
    return 0


def run_tokenizer_stats(args) -> int:
    from ..data.stats import tokenizer_stats
    s = tokenizer_stats(_load_tokenizer(args.model), args.files, args.max_length, args.max_sentences,
                        args.sentence_split)
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
def setup_prepare(parser: argparse.ArgumentParser) -> None:
    p = parser
    p.add_argument("--model", required=True, help="tokenizer or checkpoint folder (vocab.txt / tokenizer.json)")
    p.add_argument("--input", nargs="+", required=True, help=".txt / .txt.gz files, globs or folders: one sentence "
                   "per line, blank line between documents")
    p.add_argument("--out", required=True, help="output folder (meta.json + shard-*/)")
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--nsp", action=argparse.BooleanOptionalAction, default=True,
                   help="Google's sentence pairs with next-sentence labels (--no-nsp: RoBERTa FULL-SENTENCES packing)")
    p.add_argument("--short-seq-prob", type=float, default=0.1)
    p.add_argument("--lone-segment", choices=["next", "random"], default="next",
                   help="NSP when one sentence fills the target: 'next' keeps random-next at 50%%; "
                   "'random' is Google's exact rule (about 60%% random-next on short documents)")
    p.add_argument("--masking", choices=["dynamic", "static"], default="dynamic",
                   help="dynamic: masks drawn per epoch by the collator; static: Google's pre-masked copies")
    p.add_argument("--dupe-factor", type=int, default=None, help="copies with different splits/masks "
                   "(default 10 static, 1 dynamic)")
    p.add_argument("--max-predictions-per-seq", type=int, default=None,
                   help="cap on predictions per instance (default: max-seq-length x masked-lm-prob rounded up to "
                   "a multiple of 10: 20 at 128, 80 at 512, as Google's scripts); pretrain uses it unless overridden")
    p.add_argument("--masked-lm-prob", type=float, default=0.15)
    p.add_argument("--whole-word", action="store_true", help="whole-word masking")
    p.add_argument("--span", action="store_true", help="span masking (SpanBERT)")
    p.add_argument("--mask-token-fraction", type=float, default=0.8)
    p.add_argument("--random-token-fraction", type=float, default=0.1)
    p.add_argument("--eval-fraction", type=float, default=0.01,
                   help="share of the documents held out for evaluation, written to OUT/eval/ (chosen by a hash of "
                   "seed and text, before any instance is built; at least 2 when the input has 20 or more; 0 = none)")
    p.add_argument("--eval-documents", type=int, default=None, help="hold out exactly N documents instead")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--workers", type=int, default=1, help="processes (output is identical for any number)")
    p.add_argument("--num-shards", type=int, default=1, help="split the corpus over N machines ...")
    p.add_argument("--shard-index", type=int, default=0, help="... and do part I of N here")
    p.add_argument("--sentence-split", action="store_true", help="input lines are paragraphs: split into sentences")
    p.add_argument("--strict", action="store_true", help="fail on invalid UTF-8 instead of replacing and counting it")
    p.add_argument("--chunk-mb", type=float, default=4.0, help="text per shard and per random-next pool")
    p.add_argument("--overwrite", action="store_true", help="delete shards already in --out")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=run_prepare, _parser=p)


def command_line(args) -> str:
    """The command as it would be typed again: every option that differs from its default."""
    parts = ["bertkit", "prepare"]
    for a in args._parser._actions:
        if not a.option_strings or a.dest in ("help",):
            continue
        v = getattr(args, a.dest, None)
        if v == a.default:
            continue
        flag = a.option_strings[-1] if isinstance(a, argparse.BooleanOptionalAction) and not v else a.option_strings[0]
        if isinstance(v, bool):
            parts.append(flag)
        elif isinstance(v, list):
            parts += [flag, *map(str, v)]
        else:
            parts += [flag, str(v)]
    return " ".join(shlex.quote(x) for x in parts)


def masking_from_args(args):
    from ..data.masking import MaskingConfig, MaskingError
    if args.whole_word and args.span:
        raise BertkitError("--whole-word and --span exclude each other")
    cap = args.max_predictions_per_seq
    if cap is None:
        cap = max(1, math.ceil(args.max_seq_length * args.masked_lm_prob / 10 - 1e-9) * 10)
    try:
        return MaskingConfig(mode="span" if args.span else "whole_word" if args.whole_word else "token",
                             mask_prob=args.masked_lm_prob, max_predictions=cap,
                             mask_token_fraction=args.mask_token_fraction,
                             random_token_fraction=args.random_token_fraction)
    except MaskingError as e:              # name the options, not the fields
        msg = str(e)
        for field, flag in (("mask_token_fraction", "--mask-token-fraction"),
                            ("random_token_fraction", "--random-token-fraction"),
                            ("max_predictions", "--max-predictions-per-seq"), ("mask_prob", "--masked-lm-prob")):
            msg = msg.replace(field, flag)
        raise BertkitError(msg) from None


def run_prepare(args) -> int:
    from ..data.prepare import PrepareConfig, prepare
    cfg = PrepareConfig(max_seq_length=args.max_seq_length, nsp=args.nsp, short_seq_prob=args.short_seq_prob,
                        lone_segment=args.lone_segment, masking=args.masking, dupe_factor=args.dupe_factor,
                        masking_config=masking_from_args(args), seed=args.seed, chunk_mb=args.chunk_mb,
                        sentence_split=args.sentence_split, strict=args.strict, eval_fraction=args.eval_fraction,
                        eval_documents=args.eval_documents)
    if args.workers < 1:
        raise BertkitError(f"--workers {args.workers}: expected >= 1")
    command = command_line(args)
    meta = prepare(args.input, _load_tokenizer(args.model), args.out, cfg, workers=args.workers,
                   num_shards=args.num_shards, shard_index=args.shard_index, overwrite=args.overwrite,
                   progress=not args.no_progress, command=command)
    c = meta["counts"]
    notes = [f"{c[k]} {k.replace('_', ' ')}" for k in ("empty_files", "invalid_utf8_lines", "long_lines_split",
                                                        "long_documents_split", "one_sentence_documents",
                                                        "sentences_split", "empty_documents_dropped") if c.get(k)]
    if notes:
        log.info("input notes (counted in meta.json): %s", ", ".join(notes))
    return 0


# ---- data ---------------------------------------------------------------------------------------
def setup_data(parser: argparse.ArgumentParser) -> None:
    p = _sub(parser, "stats", "instances, tokens, lengths, NSP and masking fractions of prepared data")
    p.add_argument("dir", help="prepared data folder")
    p.add_argument("--sample", type=int, default=20000, help="instances to measure masking on")
    p.add_argument("--whole-word", action="store_true", help="dynamic data: measure whole-word masking")
    p.add_argument("--span", action="store_true", help="dynamic data: measure span masking")
    p.add_argument("--seed", type=int, default=0, help="dynamic data: the collator seed (pretrain's train.seed)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run_data_stats)
    p = _sub(parser, "show", "print decoded instances with segments and masks marked {shown|target}")
    p.add_argument("dir", help="prepared data folder")
    p.add_argument("-n", type=int, default=5, help="how many")
    p.add_argument("--start", type=int, default=0, help="first instance")
    p.add_argument("--epoch", type=int, default=0, help="dynamic data: the epoch whose masks to show")
    p.add_argument("--seed", type=int, default=0, help="dynamic data: the collator seed")
    p.set_defaults(run=run_data_show)
    parser.set_defaults(run=lambda a: (parser.print_help(), 2)[1])


def _dynamic_cfg(args, ds):
    from ..data.masking import MaskingConfig
    cfg = MaskingConfig(**ds.meta.get("masking_config", {}))
    if getattr(args, "whole_word", False) or getattr(args, "span", False):
        cfg.mode = "span" if args.span else "whole_word"
    return cfg


def _non_negative(args, *names: str) -> None:
    for name in names:
        if getattr(args, name) < 0:
            raise BertkitError(f"{'-n' if name == 'n' else '--' + name} {getattr(args, name)}: expected >= 0")


def run_data_stats(args) -> int:
    from ..data.pretraining import open_dataset
    from ..data.stats import data_stats
    _non_negative(args, "sample", "seed")
    ds = open_dataset(args.dir)
    s = data_stats(ds, _dynamic_cfg(args, ds), sample=args.sample, seed=args.seed)
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


def run_data_show(args) -> int:
    from ..data.pretraining import open_dataset
    from ..data.stats import show_instances
    _non_negative(args, "n", "start", "seed", "epoch")
    ds = open_dataset(args.dir)
    print(show_instances(ds, args.n, args.start, _dynamic_cfg(args, ds), args.seed, args.epoch))
    return 0
