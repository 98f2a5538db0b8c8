"""`bertkit convert`: Google's original TensorFlow BERT checkpoint to a bertkit / Hugging Face folder.

    bertkit convert uncased_L-12_H-768_A-12 --out bert-base-uncased
    bertkit convert biobert_v1.1_pubmed/model.ckpt-1000000 --out biobert --do-lower-case false

A thin layer over `bertkit.checkpoint.convert.convert`; TensorFlow is not needed.
"""
from __future__ import annotations

import argparse
import json

from ..cliconfig import add_options, field_docs
from ..checkpoint.convert import ConvertOptions, convert
from .basic import Args, options_of


def _flag(text: str) -> bool:
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


def setup_convert(parser) -> None:
    parser.add_argument("source", metavar="CHECKPOINT",
                        help="a folder as Google's releases ship it (bert_model.ckpt.index, "
                             "bert_model.ckpt.data-*, bert_config.json, vocab.txt), or a checkpoint prefix in "
                             "such a folder (DIR/model.ckpt-100000)")
    add_options(parser, Args, names=("out",), defaults=True, required=("out",),
                help={"out": "the folder to write (a previous checkpoint there is replaced whole, at the end)"})
    # Google's flag takes a value (--do_lower_case false), which a generated switch does not
    parser.add_argument("--do_lower_case", "--do-lower-case", type=_flag, metavar="true|false",
                        default=argparse.SUPPRESS, help=field_docs(ConvertOptions)["do_lower_case"])
    add_options(parser, ConvertOptions, exclude=("do_lower_case",))
    add_options(parser, Args, names=("json",), defaults=True)
    parser.set_defaults(run=run_convert)


def run_convert(args) -> int:
    r = convert(args.source, args.out, options_of(args, ConvertOptions))
    if args.json:
        print(json.dumps({"checkpoint": str(r.prefix), "out": str(r.out), "architecture": r.architecture,
                          "heads": r.heads, "weights": r.weights, "left_out": r.left_out,
                          "parameters": r.parameters, "vocab_size": r.vocab_size, "lowercase": r.lowercase,
                          "checksums_verified": r.verified, "files": r.files}, indent=2))
        return 0
    c = r.config
    casing = ("lower-cased" if r.lowercase else "cased") + (f" ({r.lowercase_why})" if r.lowercase_why != "given"
                                                            else " (--do-lower-case)")
    print(f"read   {r.prefix}: {r.weights} weights, {r.left_out} optimizer slots and counters left out, "
          + ("checksums verified" if r.verified else "checksums not checked (--no-verify)"))
    print(f"model  {r.architecture}: {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, "
          f"{c['num_attention_heads']} heads; heads {', '.join(r.heads) or 'none'}; {r.parameters:,} parameters")
    print(f"vocab  {r.vocab_size} tokens, {casing}")
    print(f"wrote  {r.out}: {', '.join(r.files)}")
    return 0
