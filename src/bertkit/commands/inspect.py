"""`bertkit inspect`: look inside a model on one sentence (pair).

    bertkit inspect --model $M "The cat sat on the mat." "It was warm there." --out runs/inspect-minilm
    bertkit inspect --model runs/quickstart/final "The capital of France is [MASK]." --steps 8

A thin layer over `bertkit.inspect` (the measurements) and `bertkit.inspect_report` (figures, page).
"""
from __future__ import annotations

import json


def setup_inspect(p) -> None:
    p.epilog = ("Prints [CLS]'s attention mass per layer and the segment-change test; --out writes report.html "
                "(figures embedded), one PNG per figure and report.json (needs matplotlib: bertkit[plot]).")
    p.add_argument("text", help="the text ([MASK] where an MLM checkpoint should predict)")
    p.add_argument("pair", nargs="?", default=None,
                   help="the right-hand segment (default: the text's second half of words, for the segment test)")
    p.add_argument("--model", required=True, metavar="DIR", help="checkpoint folder (any head) with its tokenizer")
    p.add_argument("--out", metavar="DIR", help="write the report here (report.html, *.png, report.json)")
    p.add_argument("--layer", type=int, default=None, metavar="N",
                   help="whose full attention maps to draw, 1-based (default: the last layer)")
    p.add_argument("--replace", default=None, metavar="TEXT",
                   help="also replace the right segment by this sentence (besides [MASK]s and a shuffled copy)")
    p.add_argument("--steps", type=int, default=8, help="tokens to generate left to right with an LM head (default 8)")
    p.add_argument("--top-k", dest="top_k", type=int, default=5, help="predictions shown at each [MASK] (default 5)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads (default 1: one sentence is little work, and one thread is fastest on a busy "
                        "machine; 0 = torch's count)")
    p.add_argument("--json", action="store_true", help="print the measurements as JSON instead of the summary")
    p.set_defaults(run=run_inspect)


def run_inspect(args) -> int:
    import torch

    from ..errors import BertkitError
    from ..inspect import inspect, load
    from ..inspect_report import check_out, summary_lines, write_report
    from .basic import check_threads

    check_threads(args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.top_k < 1:
        raise BertkitError(f"--top-k must be >= 1, got {args.top_k}")
    if args.out:
        check_out(args.out)                         # a file there, no matplotlib: one line before the model loads
    result = inspect(load(args.model), args.text, args.pair, layer=args.layer, other=args.replace,
                     steps=args.steps, top_k=args.top_k)
    page = write_report(result, args.out) if args.out else None
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(summary_lines(result)))
        print(f"\n[CLS]: {result['answers']['cls']}\n\ngeneration: {result['answers']['generate']}")
    if page:
        print(f"\nwrote {page}")
    return 0
