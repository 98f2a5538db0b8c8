"""`bertkit inspect`: look inside a model on one sentence (pair).

    bertkit inspect --model $M "The cat sat on the mat." "It was warm there." --out runs/inspect-minilm
    bertkit inspect --model runs/quickstart/final "The capital of France is [MASK]." --steps 8

A thin layer over `bertkit.inspect` (the measurements) and `bertkit.inspect.report` (figures, page).
"""
from __future__ import annotations

import json

from ..cliconfig import add_options
from ..inspect import InspectOptions, inspect, load
from ..inspect.report import check_out, summary_lines, write_report
from .basic import Args, options_of


def setup_inspect(p) -> None:
    p.epilog = ("Prints [CLS]'s attention mass per layer and the segment-change test; --out writes report.html "
                "(figures embedded), one PNG per figure and report.json (needs matplotlib: bertkit[plot]).")
    add_options(p, Args, names=("text", "pair", "model", "out", "json"), defaults=True, help={
        "out": "write the report here (report.html, *.png, report.json)", "json": "print the measurements as JSON"})
    add_options(p, InspectOptions)
    p.set_defaults(run=run_inspect)


def run_inspect(args) -> int:
    import torch

    o = options_of(args, InspectOptions)
    if o.threads:                                   # set here, not in inspect(): a server shares its process
        torch.set_num_threads(o.threads)
    if args.out:
        check_out(args.out)                         # a file there, no matplotlib: one line before the model loads
    result = inspect(load(args.model), args.text, args.pair, o)
    page = write_report(result, args.out) if args.out else None
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(summary_lines(result)))
        print(f"\n[CLS]: {result['answers']['cls']}\n\ngeneration: {result['answers']['generate']}")
    if page:
        print(f"\nwrote {page}")
    return 0
