"""`bertkit embed-eval`: a checkpoint's sentence embeddings on similarity and retrieval data, per pooling.

    bertkit embed-eval --model DIR --sts STS-B/ --retrieval squad/dev.json.gz
    bertkit embed-eval --model DIR --sts pairs.csv --columns text_a,text_b,label --pooling cls --json

A thin layer over `bertkit.embed_eval` (read_scored_pairs / read_retrieval, evaluate_similarity /
evaluate_retrieval); `bertkit finetune --task embedding` trains what this measures.
"""
from __future__ import annotations

import json

from ..cliconfig import add_options
from ..embed_eval import (EmbedEvalOptions, RETRIEVAL_METRICS, available_poolings, evaluate_retrieval,
                          evaluate_similarity, own_pooling, read_retrieval, read_scored_pairs)
from ..errors import BertkitError
from ..infer import Predictor
from .basic import Args, add_predictor_options, check_device, options_of, predictor_options


def setup_embed_eval(p) -> None:
    p.epilog = ("metrics as sentence-transformers' EmbeddingSimilarityEvaluator (cosine Pearson / Spearman) and "
                "InformationRetrievalEvaluator (recall@k, MRR@10, nDCG@10) compute them")
    add_options(p, Args, names=("model",), defaults=True,
                help={"model": "checkpoint folder (any head; its encoder embeds)"})
    p.add_argument("--sts", action="append", default=[], metavar="SOURCE",
                   help="scored pairs: a GLUE STS-B folder, or a CSV / TSV / JSONL / Parquet file or dataset name "
                        "with sentence1, sentence2, score (repeatable)")
    p.add_argument("--retrieval", action="append", default=[], metavar="SOURCE",
                   help="queries and passages: a SQuAD file, folder or dataset name (each question retrieves its "
                        "paragraph), or a BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv) (repeatable)")
    add_options(p, EmbedEvalOptions)
    add_options(p, Args, names=("json",), defaults=True, help={"json": "one JSON object per source and pooling"})
    add_predictor_options(p, precision="fp32", small_batches=False, help={
        "precision": "fp32 (default: the same figures on every CPU), bf16, or auto (bf16 where this CPU measures "
                     "it faster and it keeps cosine 0.999 to fp32)"})
    p.set_defaults(run=run_embed_eval)


def run_embed_eval(args) -> int:
    if not args.sts and not args.retrieval:
        raise BertkitError("give data to evaluate on: --sts SOURCE and/or --retrieval SOURCE")
    o, how = options_of(args, EmbedEvalOptions), predictor_options(args)
    check_device(how.device)
    # the data first: a bad file fails before the model loads
    sets = [("similarity", read_scored_pairs(s, o.split, o.column_names, o.skip_bad_rows, o.limit)) for s in args.sts]
    sets += [("retrieval", read_retrieval(s, o.split, o.skip_bad_rows, o.limit)) for s in args.retrieval]
    pred = Predictor.from_dir(args.model, how, head="encoder")
    own = own_pooling(args.model)
    offered = available_poolings(pred, own)
    if "pooler" in (o.poolings or ()) and "pooler" not in offered:
        raise BertkitError(f"--pooling pooler: {args.model} has no pooler weights")
    poolings = o.poolings or offered
    for kind, data in sets:
        rows = []
        for pooling in poolings:
            before = pred.tokenizer.stats.counts()          # (every pooling reads the same texts)
            run = evaluate_similarity if kind == "similarity" else evaluate_retrieval
            rows.append({"data": data.name, "kind": kind, "pooling": pooling, "own": pooling == own,
                         "precision": pred.precision, **run(pred, data, pooling, o.batch_size, progress=True)})
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
