"""`bertkit pretrain CONFIG.yaml [--section.key=value ...]` and `bertkit quickstart`."""
from __future__ import annotations

import argparse
import logging
import shlex
import sys

log = logging.getLogger("bertkit")


def setup_pretrain(parser: argparse.ArgumentParser) -> None:
    from ..cliconfig import add_options, suggest_unknown
    from ..runconfig import RENAMED, PretrainConfig

    parser.usage = "bertkit pretrain [CONFIG.yaml] [--resume] [--section.key=value ...]"
    parser.description = (
        "Pre-train BERT with MLM (+ NSP) on data written by `bertkit prepare`. Every option is a config key "
        "(the YAML key, the flag and the attribute of bertkit.runconfig.PretrainConfig are one name) and "
        "overrides the YAML file, e.g. --out=runs/mini --data.path=data/prepared --train.budget=30m "
        "--train.batch_size=32 --optim.lr=5e-4. Several processes: "
        "torchrun --nproc_per_node N -m bertkit pretrain CONFIG.yaml ...")
    parser.add_argument("config", nargs="?", help="YAML config (configs/pretrain/mini.yaml, ...)")
    add_options(parser, PretrainConfig, old={f"--{k}": v for k, v in RENAMED.items()})
    suggest_unknown(parser)
    parser.set_defaults(run=run_pretrain)


def run_pretrain(args) -> int:
    from ..cliconfig import given
    from ..runconfig import PretrainConfig, load_config
    from ..train import pretrain

    cfg = load_config(PretrainConfig, args.config, values=given(args, PretrainConfig))
    card = pretrain(cfg, command=" ".join(["bertkit", "pretrain"] + [shlex.quote(a) for a in sys.argv[2:]]))
    if card and card.get("final_eval"):
        e = card["final_eval"]
        lm = ("next-token", "eval_next_token_accuracy", "eval_next_token_perplexity") if "eval_next_token_loss" in e \
            else ("MLM", "eval_mlm_accuracy", "eval_perplexity")
        log.info("done: %d updates in %.0f s; held-out %s accuracy %.4f, perplexity %.1f", card["updates"],
                 card["wall_time_s"], lm[0], e[lm[1]], e[lm[2]])
    return 0


def setup_quickstart(parser: argparse.ArgumentParser) -> None:
    parser.description = ("The whole pipeline in about five minutes on the bundled corpus (US inaugural addresses "
                          "and 11 Project Gutenberg books, "
                          "public domain): train a WordPiece vocabulary, prepare data, pre-train a small BERT with "
                          "the CPU recipe (configs/pretrain/cpu-5m.yaml), then score it on held-out documents and "
                          "on cloze prompts.")
    parser.add_argument("--out", default="runs/quickstart", help="run folder (default: runs/quickstart)")
    parser.add_argument("--minutes", type=float, default=5.0,
                        help="total time budget in minutes, tokenizer and data included (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's choice)")
    parser.set_defaults(run=run_quickstart)


# The CPU recipe that `quickstart` runs; configs/pretrain/cpu-5m.yaml holds the same values (a test
# keeps the two equal). Each value was chosen by measurement: docs/pretrain.md, "the CPU recipe".
QUICKSTART_VOCAB = 4000
QUICKSTART_SEQ = 128
QUICKSTART_RECIPE = {
    "model.preset": "tiny", "model.norm_position": "pre", "model.hidden_dropout": 0.0,
    "model.attention_dropout": 0.0, "train.nsp": False, "train.batch_size": 32, "train.precision": "auto",
    "optim.lr": 2e-3, "optim.warmup": 0.05, "optim.schedule": "linear",
}

# Cloze prompts a model of the inaugural addresses should answer, with the words that count as right.
CLOZE = [
    ("the united [MASK] of america .", {"states"}),
    ("we the [MASK] of the united states .", {"people"}),
    ("my fellow [MASK] , thank you .", {"citizens", "americans", "countrymen"}),
    ("i will preserve , protect and [MASK] the constitution of the united states .", {"defend"}),
    ("the president of the united [MASK] .", {"states"}),
    ("life , liberty and the pursuit of [MASK] .", {"happiness"}),
    ("the federal [MASK] has no power to do this .", {"government"}),
    ("may god [MASK] america .", {"bless"}),
]


def quickstart_corpus() -> tuple[list[str], list[str], str]:
    """The bundled public-domain corpus as (training documents, held-out documents, a one-line
    description): the 55 inaugural addresses (the last 5, 1989-2005, held out) and the 11 Project
    Gutenberg books as 235 passages of ~150 sentences (every 20th passage held out, so every part of
    the collection is scored and no held-out sentence is trained on)."""
    import gzip
    from importlib import resources

    def documents(name: str) -> list[str]:
        text = gzip.decompress((resources.files("bertkit") / "sample" / name).read_bytes()).decode("utf-8")
        return [d for d in text.split("\n\n") if d.strip()]

    addresses, passages = documents("inaugural.txt.gz"), documents("gutenberg.txt.gz")
    held_passages = [p for i, p in enumerate(passages) if i % 20 == 10]
    train = addresses[:-5] + [p for i, p in enumerate(passages) if i % 20 != 10]
    held = addresses[-5:] + held_passages
    words = sum(len(d.split()) for d in addresses + passages)
    about = (f"{len(addresses)} US inaugural addresses (1789-2005) and {len(passages)} passages of 11 Project "
             f"Gutenberg books, {words / 1e6:.2f} M words, public domain; held out: the last 5 addresses "
             f"(1989-2005) and {len(held_passages)} passages")
    return train, held, about


def run_quickstart(args) -> int:
    quickstart(args.out, minutes=args.minutes, seed=args.seed, threads=args.threads)
    return 0


def quickstart(out: str, minutes: float = 5.0, seed: int = 0, threads: int = 0) -> dict:
    """The whole pipeline on the bundled corpus: train a WordPiece vocabulary, prepare
    full-sentence sequences, pre-train with the CPU recipe for what is left of `minutes`, then
    report held-out MLM accuracy and the cloze prompts. Returns the run card plus `cloze`."""
    import time
    from pathlib import Path

    from ..data.prepare import PrepareConfig, prepare
    from ..infer import Predictor
    from ..runconfig import PretrainConfig, load_config
    from ..runlog import read_jsonl
    from ..tokenizer import Tokenizer
    from ..train import pretrain

    t0 = time.time()
    root = Path(out)
    (root / "text").mkdir(parents=True, exist_ok=True)
    train_docs, held_docs, about = quickstart_corpus()
    (root / "text" / "train.txt").write_text("\n\n".join(train_docs) + "\n", encoding="utf-8")
    (root / "text" / "heldout.txt").write_text("\n\n".join(held_docs) + "\n", encoding="utf-8")
    print(f"1/4 corpus: {about}", flush=True)
    tok = Tokenizer.train([str(root / "text" / "train.txt")], vocab_size=QUICKSTART_VOCAB, lowercase=True)
    tok.save(root / "tokenizer")
    print(f"2/4 WordPiece vocabulary: {tok.vocab_size:,} tokens", flush=True)
    pcfg = PrepareConfig(max_length=QUICKSTART_SEQ, nsp=False, seed=seed, eval_documents=0)
    meta = prepare([str(root / "text" / "train.txt")], tok, root / "data" / "train", pcfg, progress=False,
                   overwrite=True)
    prepare([str(root / "text" / "heldout.txt")], tok, root / "data" / "heldout", pcfg, progress=False, overwrite=True)
    print(f"3/4 prepared {meta['counts']['instances']:,} sequences of up to {QUICKSTART_SEQ} tokens", flush=True)
    budget = max(minutes * 60 - (time.time() - t0) - 15, 10)     # 15 s kept for the final evaluation and report
    overrides = {**QUICKSTART_RECIPE, "out": str(root / "run"), "data.path": str(root / "data" / "train"),
                 "data.eval_path": str(root / "data" / "heldout"), "data.eval_instances": 256,
                 "train.budget": f"{budget:.0f}s", "train.max_steps": 10_000_000, "train.eval_every": 0,
                 "train.eval_minutes": round(budget / 60 / 12, 4), "train.log_every": 20,
                 "train.checkpoint_every": 0, "train.seed": seed, "train.threads": threads}
    cfg = load_config(PretrainConfig, None, [f"--{k}={v}" for k, v in overrides.items()])
    print(f"4/4 pre-training BERT-{cfg.model.preset} (MLM only, pre-LN) for "
          f"{budget / 60:.1f} minutes ...", flush=True)
    card = pretrain(cfg, command=f"bertkit quickstart --out {out} --minutes {minutes:g}")
    evals = read_jsonl(root / "run" / "eval.jsonl")
    before, after = evals[0], evals[-1]
    predictor = Predictor.from_dir(root / "run" / "final")
    answers = predictor.fill_mask([c[0] for c in CLOZE], top_k=3)
    cloze, hits = [], 0
    for (prompt, expected), preds in zip(CLOZE, answers):
        top = [p["token"] for p in preds[0]]
        ok = bool(expected & set(top))
        hits += ok
        cloze.append({"prompt": prompt, "expected": sorted(expected), "top3": top, "hit": ok})
    card["cloze"] = {"hits": hits, "prompts": len(CLOZE), "answers": cloze}
    final = root / "run" / "final"
    lines = [
        "",
        f"held-out MLM accuracy {before['eval_mlm_accuracy']:.3f} -> {after['eval_mlm_accuracy']:.3f} "
        f"({after.get('eval_mask_accuracy', float('nan')):.3f} at the [MASK] tokens alone; perplexity "
        f"{before['eval_perplexity']:,.0f} -> {after['eval_perplexity']:,.0f}) after {card['updates']:,} "
        f"updates, {card['tokens_seen'] / 1e6:.1f} M tokens, {card['wall_time_s'] / 60:.1f} min of training "
        f"({card['precision']})",
        f"cloze prompts: {hits} of {len(CLOZE)} answered with the expected word in the top 3",
    ]
    for c in cloze:
        lines.append(f"  {'+' if c['hit'] else '-'} {c['prompt']:<76} {', '.join(c['top3'])}")
    lines += [
        "",
        f"What to expect: {card['tokens_seen'] / max(meta['counts']['tokens'], 1):.0f} passes over this "
        f"{meta['counts']['tokens'] / 1e6:.1f} M-token corpus take a 2-layer BERT through the first stage of BERT "
        "training: at a [MASK] it answers with the most frequent pieces, and it copies the 10% of chosen tokens "
        "BERT leaves unchanged, which is most of the accuracy above. Using the words around the gap (a count "
        "model of the left neighbour alone gets ~0.16 at a gap here, of both neighbours ~0.31: "
        "benchmarks/mlm_oracles.py) takes more updates than five CPU minutes give; docs/pretrain.md "
        "('the CPU recipe') has the measured curves.",
        "",
        f"run card:  {root / 'run' / 'run_card.md'}",
        f"curves:    {root / 'run' / 'curves.png'}",
        f"next:      bertkit fill-mask --model {final} \"the united [MASK] of america .\"",
        f"           bertkit finetune configs/finetune/sst2.yaml --model {final} --out runs/sst2",
        f"total {time.time() - t0:.0f} s",
    ]
    print("\n".join(lines), flush=True)
    return card
