"""`bertkit quickstart` as a function: the whole life cycle on the bundled public-domain corpus in a
few minutes (vocabulary, data, pre-training with the CPU recipe, held-out and cloze scores)."""
from __future__ import annotations

import dataclasses
import gzip
import logging
import math
import time
from importlib import resources
from pathlib import Path
from typing import Annotated, Callable, Literal

from .data.prepare import PrepareConfig, prepare
from .errors import BertkitError
from .runconfig import AT_LEAST_1, PretrainConfig, Rule, SEED, THREADS, check_fields, load_config
from .sources import read_jsonl
from .tokenizer import Tokenizer

log = logging.getLogger("bertkit")

# The CPU recipe that `quickstart` runs; configs/pretrain/cpu-5m.yaml holds the same values (a test
# keeps the two equal). Each value was chosen by measurement: docs/pretrain-measurements.md, "The CPU recipe's levers".
QUICKSTART_VOCAB = 4000
QUICKSTART_SEQ = 128
QUICKSTART_FILL = False      # prepare --fill for the training sequences (every one 128 tokens)
QUICKSTART_RECIPE = {
    "model.preset": "tiny", "model.norm_position": "pre", "model.position_embedding_type": "alibi",
    "model.hidden_dropout": 0.0, "model.classifier_pooling": "mean",
    "model.attention_dropout": 0.0, "train.nsp": False, "train.batch_size": 32, "train.precision": "auto", "train.packed": False,
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


# Count models on the quickstart's own split (benchmarks/mlm_oracles.py, 2026-11-30): accuracy at a
# gap from the most frequent piece, from the left neighbour, from both neighbours.
ORACLES = {"unigram": 0.063, "left": 0.163, "left_right": 0.313}


# The documented quickstart (docs/pretrain.md, benchmarks/results/quickstart-kernel-2026-12-01/): what
# its figures took. A slower CPU reaches them in more minutes: the model learns per token, and the
# schedule is keyed to the budget (fp32 and bf16 follow one loss curve: tests/test_recipe.py).
REFERENCE_RUN = {"tokens": 9_802_638, "tokens_per_s": 34_640, "accuracy": 0.297, "hits": 5,
                 "where": "bf16 on a 2-vCPU AMD EPYC Zen 4, 2026-12-01"}


def pace_note(card: dict, other_s: float) -> str:
    """How this machine's training rate compares with the documented run's, and, where it is under
    0.8x, about how many `--minutes` would see as many tokens (`other_s`: the seconds this
    quickstart spent outside training: vocabulary, data, evaluation)."""
    ref = REFERENCE_RUN
    rate = card["tokens_per_s"]            # on the training clock (evaluation not counted)
    ratio = rate / ref["tokens_per_s"]
    line = (f"pace: {rate / 1e3:.1f}k tokens/s in {card['precision']}, {ratio:.2f}x the documented run "
            f"({ref['tokens_per_s'] / 1e3:.1f}k tokens/s, {ref['where']}: {ref['tokens'] / 1e6:.1f} M tokens, "
            f"held-out {ref['accuracy']:.3f}, {ref['hits']} of {len(CLOZE)} cloze prompts)")
    if ratio >= 0.8 or rate <= 0:                # (no tokens trained: nothing to scale)
        return line
    minutes = math.ceil((ref["tokens"] / rate + other_s) / 60)
    return (line + f"; this CPU sees as many tokens in about {minutes} minutes: bertkit quickstart "
            f"--minutes {minutes}")


def hour_recipe(precision: str) -> str:
    """The one-hour recipe for this machine: BERT-mini where training ran in bf16 or fp16, the narrower
    model where it ran in fp32 (an AVX2-only CPU, where cpu-60m-avx2.yaml sees more tokens:
    docs/pretrain-measurements.md, 'One hour on a CPU with AVX2 only')."""
    return "configs/pretrain/cpu-60m-avx2.yaml" if precision == "float32" else "configs/pretrain/cpu-60m.yaml"


def what_to_expect(passes: float, tokens: int, mask_accuracy: float | None) -> str:
    """The closing paragraph: which stage of BERT training the model reached, from its [MASK] accuracy."""
    stage = (f"What to expect: {passes:.0f} passes over this {tokens / 1e6:.1f} M-token corpus. Reference points "
             f"at a [MASK] (benchmarks/mlm_oracles.py): the most frequent piece {ORACLES['unigram']:.2f}, a count "
             f"model of the left neighbour {ORACLES['left']:.2f}, of both neighbours {ORACLES['left_right']:.2f}. ")
    if mask_accuracy is None:
        return stage
    if mask_accuracy < ORACLES["unigram"] + 0.02:
        return (stage + f"At {mask_accuracy:.2f} this model is still at the first stage of "
                "BERT training: it answers a [MASK] with the most frequent pieces (and copies the 10% of chosen "
                "tokens BERT leaves unchanged); docs/pretrain-measurements.md has the measured curves.")
    return (stage + f"At {mask_accuracy:.2f} this model reads the words around a gap "
            "(ALiBi's distance penalty lets a small model find its neighbours within minutes) but not yet the "
            "longer context and rarer words that BERT-base learns over days; longer runs and more text are the "
            "next steps (docs/pretrain.md, 'the CPU recipe').")


MIN_MINUTES = 0.5     # the vocabulary, the data and the final evaluation alone take about half a minute
MINUTES = Rule(f"a number >= {MIN_MINUTES} (the vocabulary, the data and the final evaluation alone take about "
               "half a minute)", lambda v: math.isfinite(v) and v >= MIN_MINUTES)


@dataclasses.dataclass
class QuickstartOptions:
    """`quickstart`'s keywords (`bertkit quickstart`'s flags: `cliconfig.add_options`), checked before
    anything is written (one line naming the field)."""
    out: str = "runs/quickstart"
    """Run folder."""
    minutes: Annotated[float, MINUTES] = 5.0
    """Total time budget in minutes, tokenizer and data included (at least 0.5)."""
    updates: Annotated[int | None, AT_LEAST_1] = None
    """Train exactly this many updates instead of what --minutes leaves time for: the number a timed
    run's card records, to repeat that run bit for bit."""
    seed: Annotated[int, SEED] = 0
    """Seeds the data, the initialisation and the training order."""
    threads: Annotated[int, THREADS] = 0
    """CPU threads (0: torch's choice)."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Training precision: auto (bf16 where measured faster on this machine, once), fp32, bf16."""

    def __post_init__(self):
        check_fields(self)                          # the choices and ranges on the fields
        if Path(self.out).exists() and not Path(self.out).is_dir():
            raise BertkitError(f"--out {self.out}: a file, not a folder")


def training_config(root: Path, budget_s: float, updates: int | None, seed: int, threads: int, precision: str):
    """The PretrainConfig of the quickstart's training: the CPU recipe on its data, for `budget_s`
    seconds (planned into updates when training starts) or exactly `updates`."""
    length = {"train.budget": f"{budget_s:.0f}s", "train.max_steps": 10_000_000, "train.eval_every": 0,
              "train.eval_minutes": round(budget_s / 60 / 12, 4)} if updates is None else \
        {"train.budget": None, "train.max_steps": updates, "train.eval_every": max(1, updates // 12)}
    overrides = {**QUICKSTART_RECIPE, "out": str(root / "run"), "data.path": str(root / "data" / "train"),
                 "data.eval_path": str(root / "data" / "heldout"), "data.eval_instances": 256, **length,
                 "train.log_every": 20, "train.checkpoint_every": 0, "train.seed": seed, "train.threads": threads,
                 "train.precision": precision}
    return load_config(PretrainConfig, None, [f"--{k}={'null' if v is None else v}" for k, v in overrides.items()])


def quickstart(out: str, minutes: float = 5.0, seed: int = 0, threads: int = 0, updates: int | None = None,
               precision: str = "auto", say: Callable[[str], None] = log.info) -> dict:
    """The whole pipeline on the bundled corpus: train a WordPiece vocabulary, prepare
    full-sentence sequences, pre-train with the CPU recipe for what is left of `minutes` (turned into
    a number of updates at the start of training: `train.plan_budget`) or for exactly `updates`,
    then score held-out MLM accuracy and the cloze prompts. `say` gets a line per stage. Returns the
    run card plus `cloze` (the answers) and `summary` (the closing text, one string per line)."""
    t0 = time.time()
    root = Path(out)
    QuickstartOptions(out, minutes, updates, seed, threads, precision)      # checked before anything is written
    training_config(root, max(minutes * 60 - 15, 10), updates, seed, threads, precision)   # its keys checked now
    from .train import pretrain

    (root / "text").mkdir(parents=True, exist_ok=True)
    train_docs, held_docs, about = quickstart_corpus()
    (root / "text" / "train.txt").write_text("\n\n".join(train_docs) + "\n", encoding="utf-8")
    (root / "text" / "heldout.txt").write_text("\n\n".join(held_docs) + "\n", encoding="utf-8")
    say(f"1/4 corpus: {about}")
    tok = Tokenizer.train([str(root / "text" / "train.txt")], vocab_size=QUICKSTART_VOCAB, lowercase=True)
    tok.save(root / "tokenizer")
    say(f"2/4 WordPiece vocabulary: {tok.vocab_size:,} tokens")
    pcfg = PrepareConfig(max_length=QUICKSTART_SEQ, nsp=False, seed=seed, eval_documents=0)
    meta = prepare([str(root / "text" / "train.txt")], tok, root / "data" / "train",
                   dataclasses.replace(pcfg, fill=QUICKSTART_FILL), progress=False, overwrite=True)
    # held out as whole sentences whatever the training data does: the score reads complete text
    prepare([str(root / "text" / "heldout.txt")], tok, root / "data" / "heldout", pcfg, progress=False, overwrite=True)
    say(f"3/4 prepared {meta['counts']['instances']:,} sequences of up to {QUICKSTART_SEQ} tokens")
    budget = max(minutes * 60 - (time.time() - t0) - 15, 10)     # 15 s kept for the final evaluation and report
    cfg = training_config(root, budget, updates, seed, threads, precision)
    say(f"4/4 pre-training BERT-{cfg.model.preset} (MLM only, pre-LN, ALiBi) for "
        + (f"{budget / 60:.1f} minutes ..." if updates is None else f"{updates:,} updates ..."))
    options = f" --seed {seed}" + (f" --threads {threads}" if threads else "") + \
        (f" --precision {precision}" if precision != "auto" else "")
    card = pretrain(cfg, command=f"bertkit quickstart --out {out} "
                                 + (f"--minutes {minutes:g}" if updates is None else f"--updates {updates}") + options)
    card["cloze"] = score_cloze(root / "run" / "final")
    card["summary"] = summary_lines(root, card, read_jsonl(root / "run" / "eval.jsonl"), meta["counts"]["tokens"],
                                    time.time() - t0)
    return card


def score_cloze(model_dir: Path) -> dict:
    """The cloze prompts (`CLOZE`) on a masked LM: each prompt's top 3 and whether an expected word is
    among them."""
    from .infer import Predictor

    answers = Predictor.from_dir(model_dir, small_batches=False).fill_mask([c[0] for c in CLOZE], top_k=3)
    cloze = []
    for (prompt, expected), preds in zip(CLOZE, answers):
        top = [p["token"] for p in preds[0]]
        cloze.append({"prompt": prompt, "expected": sorted(expected), "top3": top,
                      "hit": bool(expected & set(top))})
    return {"hits": sum(c["hit"] for c in cloze), "prompts": len(CLOZE), "answers": cloze}


def summary_lines(root: Path, card: dict, evals: list[dict], data_tokens: int, seconds: float) -> list[str]:
    """The closing text: held-out accuracy before and after, the cloze answers, what to expect, where the
    files are and what to run next (`seconds`: the whole quickstart's)."""
    before, after = evals[0], evals[-1]
    hits, cloze = card["cloze"]["hits"], card["cloze"]["answers"]
    final = root / "run" / "final"
    return [
        "",
        f"held-out MLM accuracy {before['eval_mlm_accuracy']:.3f} -> {after['eval_mlm_accuracy']:.3f} "
        f"({after.get('eval_mask_accuracy', float('nan')):.3f} at the [MASK] tokens alone; perplexity "
        f"{before['eval_perplexity']:,.0f} -> {after['eval_perplexity']:,.0f}) after {card['updates']:,} "
        f"updates, {card['tokens_seen'] / 1e6:.1f} M tokens, {card['wall_time_s'] / 60:.1f} min of training "
        f"({card['precision']})",
        f"cloze prompts: {hits} of {len(CLOZE)} answered with the expected word in the top 3",
        *(f"  {'+' if c['hit'] else '-'} {c['prompt']:<76} {', '.join(c['top3'])}" for c in cloze),
        "",
        what_to_expect(card["tokens_seen"] / max(data_tokens, 1), data_tokens,
                       after.get("eval_mask_accuracy")),
        pace_note(card, seconds - card["wall_time_s"]),
        "",
        *([f"repeat:    {card['reproduce']}   (the same updates: the same weights)"] if card.get("reproduce") else []),
        f"run card:  {root / 'run' / 'run_card.md'}",
        f"curves:    {root / 'run' / 'curves.png'}" if (root / "run" / "curves.png").exists() else
        "curves:    not drawn: matplotlib is not installed (pip install 'bertkit[plot]')",
        f"next:      bertkit fill-mask --model {final} \"the united [MASK] of america .\"",
        f"           bertkit finetune configs/finetune/sst2.yaml --data nyu-mll/glue:sst2 --model {final} "
        f"--out runs/sst2   (GLUE through pip install 'bertkit[datasets]'; or --data YOUR_SST2_FOLDER)",
        f"           bertkit pretrain {hour_recipe(card['precision'])} --data.path={root / 'data' / 'train'} "
        f"--data.eval_path={root / 'data' / 'heldout'} --out runs/hour   (an hour of the recipe for this "
        f"CPU; it wants 10-20 MB of text: bertkit prepare --no-nsp)",
        f"total {seconds:.0f} s",
    ]
