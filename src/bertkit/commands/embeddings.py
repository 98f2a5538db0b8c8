"""`bertkit embed-eval`: a checkpoint's sentence embeddings on similarity and retrieval data, per pooling.

    bertkit embed-eval --model DIR --sts STS-B/ --retrieval squad/dev.json.gz
    bertkit embed-eval --model DIR --sts pairs.csv --columns text_a,text_b,label --pooling cls --json

A thin layer over `bertkit.embed_eval` (read_scored_pairs / read_retrieval, evaluate_similarity /
evaluate_retrieval); `bertkit finetune --task embedding` trains what this measures.
"""
from __future__ import annotations

import json

from ..errors import BertkitError
from .basic import add_predictor_options, predictor_options


def setup_embed_eval(p) -> None:
    p.epilog = ("metrics as sentence-transformers' EmbeddingSimilarityEvaluator (cosine Pearson / Spearman) and "
                "InformationRetrievalEvaluator (recall@k, MRR@10, nDCG@10) compute them")
    p.add_argument("--model", required=True, metavar="DIR", help="checkpoint folder (any head; its encoder embeds)")
    p.add_argument("--sts", action="append", default=[], metavar="SOURCE",
                   help="scored pairs: a GLUE STS-B folder, or a CSV / TSV / JSONL / Parquet file or dataset name "
                        "with sentence1, sentence2, score (repeatable)")
    p.add_argument("--retrieval", action="append", default=[], metavar="SOURCE",
                   help="queries and passages: a SQuAD file, folder or dataset name (each question retrieves its "
                        "paragraph), or a BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv) (repeatable)")
    p.add_argument("--split", default="dev", help="split to read from a folder (default dev; BEIR: qrels/SPLIT.tsv)")
    p.add_argument("--columns", default="sentence1,sentence2,score",
                   help="--sts files: the two sentence columns and the score column (default sentence1,sentence2,score)")
    p.add_argument("--pooling", default=None,
                   help="comma-separated poolings among mean, cls, pooler (default: every one the checkpoint has, "
                        "its own first: sentence-transformers' config, else mean)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N pairs / queries of each source")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=32)
    p.add_argument("--skip-bad-rows", dest="skip_bad_rows", action="store_true")
    p.add_argument("--json", action="store_true", help="one JSON object per source and pooling")
    add_predictor_options(p, precision="fp32", small_batches=False, help={
        "precision": "fp32 (default: the same figures on every CPU), bf16, or auto (bf16 where this CPU measures "
                     "it faster and it keeps cosine 0.999 to fp32)"})
    p.set_defaults(run=run_embed_eval)


def run_embed_eval(args) -> int:
    from ..embed_eval import (POOLINGS, RETRIEVAL_METRICS, available_poolings, evaluate_retrieval,
                              evaluate_similarity, own_pooling, read_retrieval, read_scored_pairs)
    from ..infer import Predictor
    from .basic import check_device, check_fits, check_threads

    if not args.sts and not args.retrieval:
        raise BertkitError("give data to evaluate on: --sts SOURCE and/or --retrieval SOURCE")
    for key in ("limit", "batch_size", "max_length"):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            raise BertkitError(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    columns = [c.strip() for c in args.columns.split(",")]
    if len(columns) != 3 or not all(columns):
        raise BertkitError(f"--columns {args.columns!r}: give three names, e.g. sentence1,sentence2,score")
    asked = [x.strip() for x in args.pooling.split(",")] if args.pooling else None
    wrong = [x for x in asked or () if x not in POOLINGS]
    if wrong:
        raise BertkitError(f"--pooling {wrong[0]!r}: choose among {', '.join(POOLINGS)}")
    check_threads(args.threads)
    check_device(args.device)
    # the data first: a bad file fails before the model loads
    sets = [("similarity", read_scored_pairs(s, args.split, columns, args.skip_bad_rows, args.limit)) for s in args.sts]
    sets += [("retrieval", read_retrieval(s, args.split, args.skip_bad_rows, args.limit)) for s in args.retrieval]
    pred = Predictor.from_dir(args.model, predictor_options(args), head="encoder")
    check_fits(pred, args.max_length)
    own = own_pooling(args.model)
    offered = available_poolings(pred, own)
    if asked and "pooler" in asked and "pooler" not in offered:
        raise BertkitError(f"--pooling pooler: {args.model} has no pooler weights")
    poolings = asked or offered
    for kind, data in sets:
        rows = []
        for pooling in poolings:
            before = pred.tokenizer.stats.counts()          # (every pooling reads the same texts)
            run = evaluate_similarity if kind == "similarity" else evaluate_retrieval
            rows.append({"data": data.name, "kind": kind, "pooling": pooling, "own": pooling == own,
                         "precision": pred.precision, **run(pred, data, pooling, args.batch_size, progress=True)})
        pred.tokenizer.stats.report(before, f"{kind} on {data.name}, at {pred.max_length} tokens")
        if args.json:
            for r in rows:
                print(json.dumps(r))
            continue
        names = ("spearman", "pearson") if kind == "similarity" else RETRIEVAL_METRICS
        size = (f"{rows[0]['pairs']} pairs" if kind == "similarity"
                else f"{rows[0]['queries']} queries, {rows[0]['corpus']} passages")
        print(f"{kind} on {data.name} ({size}), {pred.precision}")
        print("  " + f"{'pooling':14s}" + "".join(f"{n:>11s}" for n in names))
        for r in rows:
            label = r["pooling"] + (" (own)" if r["own"] else "")
            print("  " + f"{label:14s}" + "".join(f"{r[n]:11.4f}" for n in names))
    return 0
