"""NSP's topic shortcut, measured on a checkpoint (the paper note's failure mode 3, "sentence-pair shortcut").

NSP's negatives take segment B from another document, so a model can tell most of them from true
next segments by topic alone (are A and B about the same thing?) without learning whether B follows
A. From held-out text (one sentence per line, a blank line between documents) this builds three
kinds of pairs that share their A:

  is_next          B = the text right after A (IsNext)
  random_document  B = text of a random other document from a random sentence on, as pre-training's
                   negatives (NotNext)
  same_document    B = text of A's own document whose first sentence is at least `min_distance`
                   sentences after A's last (is_next's is 1), so A and B share a topic (NotNext):
                   the hard negatives that topic cannot solve

and reports the NSP head's accuracy on each kind, the ROC AUC of its P(IsNext) for is_next against
each negative kind, and beside them a bag-of-words baseline on the same pairs (TF-IDF cosine of A
and B, `data.stats.tfidf_cosine`, IDF from the pairs' segments; one threshold fit on half of the
pairs and scored on the other): what topic alone gets. A head that learned topic and not coherence
is right on random_document and near or below chance on same_document.

A = the sentences ending at an anchor sentence i, taken backwards while they fit in half of
max_length - 3 tokens (at least sentence i, its front cut when alone too long); B = the sentences
from its first on while they fit in the other half (at least one, its end cut). Anchors are the
sentences i that have a sentence i + min_distance in their document, drawn with `random.Random(seed)`.

API: nsp_shortcut(model_dir, heldout_text_path, ...) -> dict (the ablation report's entry point);
probe_pairs(documents, ...) -> pairs; nsp_is_next(model, pairs, ...) -> P(IsNext) per pair;
report_text(result) -> the table the command prints.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .blimp import wilson
from .checkpoint import CheckpointError, check_inputs_fit, load_model, model_folder
from .data.stats import roc_auc, tfidf_cosine, threshold_baseline
from .data.text import TextCounts, expand_inputs, read_documents
from .errors import DataError
from .infer.engines import torch_threads
from .runconfig import AT_LEAST_1, SEED, THREADS, Rule, check_fields
from .tasks import collate
from .tokenizer import Tokenizer

KINDS = ("is_next", "random_document", "same_document")
NEGATIVES = KINDS[1:]


def read_documents_ids(paths: Sequence[str | Path], tokenizer) -> list[list[np.ndarray]]:
    """The documents of text files as lists of sentences' word-piece ids (no specials); sentences
    without a token are left out, documents without a sentence too."""
    docs = list(read_documents(expand_inputs([str(p) for p in paths]), TextCounts()))
    flat = tokenizer.encode_ids([s for d in docs for s in d])
    out, k = [], 0
    for d in docs:
        sents = [np.asarray(x, dtype=np.int64) for x in flat[k:k + len(d)] if len(x)]
        k += len(d)
        if sents:
            out.append(sents)
    return out


def _backwards(doc: list[np.ndarray], i: int, budget: int) -> np.ndarray:
    """Sentences i, i - 1, ... while they fit in `budget` tokens (at least sentence i, its front cut)."""
    j, n = i, len(doc[i])
    while j > 0 and n + len(doc[j - 1]) <= budget:
        j -= 1
        n += len(doc[j])
    return np.concatenate(doc[j:i + 1])[-budget:]


def _forwards(doc: list[np.ndarray], j: int, budget: int) -> np.ndarray:
    """Sentences j, j + 1, ... while they fit in `budget` tokens (at least sentence j, its end cut)."""
    k, n = j + 1, len(doc[j])
    while k < len(doc) and n + len(doc[k]) <= budget:
        n += len(doc[k])
        k += 1
    return np.concatenate(doc[j:k])[:budget]


@dataclass
class ShortcutOptions:
    """The settings of `nsp_shortcut` (`bertkit data nsp-shortcut`'s flags: `cliconfig.add_options`)."""
    anchors: Annotated[int, AT_LEAST_1] = 1000
    """A segments drawn; one pair of each kind per A."""
    max_length: Annotated[int, Rule("at least 5 ([CLS] A [SEP] B [SEP], A and B non-empty)", lambda v: v >= 5)] = 128
    """Tokens per pair, [CLS] and [SEP]s included."""
    min_distance: Annotated[int, Rule("at least 2 (1 is the next sentence)", lambda v: v >= 2)] = 2
    """Same-document B starts at least this many sentences after A's last (1 would be the next sentence)."""
    seed: Annotated[int, SEED] = 0
    """Seeds the anchors drawn."""
    batch_size: Annotated[int, AT_LEAST_1] = 64
    """Pairs per batch through the NSP head."""
    threads: Annotated[int | None, THREADS] = None
    """CPU threads (default: torch's count)."""
    topic_only: bool = False
    """The bag-of-words baseline alone (no model run; --model may be a tokenizer folder)."""

    def __post_init__(self):
        check_fields(self, error=DataError)     # the ranges on the fields


def probe_pairs(docs: list[list[np.ndarray]], anchors: int = 1000, seed: int = 0, max_length: int = 128,
                min_distance: int = 2, where: str = "") -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(kind, A ids, B ids): for each of up to `anchors` anchors drawn with `random.Random(seed)`, one
    pair of each kind in KINDS with the same A (so the kinds differ only in B). `where` names the
    text in errors."""
    ShortcutOptions(anchors=anchors, max_length=max_length, min_distance=min_distance)            # checked
    eligible = [(d, i) for d, doc in enumerate(docs) for i in range(len(doc) - min_distance)]
    if len(docs) < 2 or not eligible:
        raise DataError(f"{where or 'the text'}: {len(docs)} documents, {len(eligible)} sentences with {min_distance} "
                        "more after them in their document; the probe needs 2 documents and 1 such sentence "
                        "(one sentence per line, a blank line between documents)")
    rng = random.Random(seed)
    half = (max_length - 3) // 2
    out = []
    for d, i in rng.sample(eligible, min(anchors, len(eligible))):
        doc = docs[d]
        a = _backwards(doc, i, half)
        same = rng.randint(i + min_distance, len(doc) - 1)
        other = rng.randrange(len(docs) - 1)
        other += other >= d                             # any document but d
        start = rng.randrange(len(docs[other]))
        out += [("is_next", a, _forwards(doc, i + 1, half)),
                ("random_document", a, _forwards(docs[other], start, half)),
                ("same_document", a, _forwards(doc, same, half))]
    return out


class NoNSPHead(CheckpointError):
    """The checkpoint was pre-trained without NSP: there is no head to probe (not a broken file)."""


def load_nsp_model(path: Path):
    """A pre-training checkpoint with its NSP head, in eval mode (NoNSPHead when it has none)."""
    model = load_model(path, head="pretraining")
    if model.nsp is None:
        raise NoNSPHead(f"{path}: has no NSP head (pre-trained without NSP, or an MLM-only checkpoint); "
                              "the topic baseline alone runs with --topic-only")
    return model


@torch.inference_mode()
def nsp_is_next(model, pairs: list[tuple[str, np.ndarray, np.ndarray]], cls_id: int, sep_id: int, pad_id: int,
                batch_size: int = 64, progress: bool = False) -> np.ndarray:
    """The NSP head's P(IsNext) of each `[CLS] A [SEP] B [SEP]`, fp32, padded batches of similar length."""

    lengths = np.asarray([len(a) + len(b) + 3 for _, a, b in pairs])
    order = np.argsort(lengths, kind="stable")
    out = np.zeros(len(pairs))
    for lo in tqdm(range(0, len(order), batch_size), desc="nsp probe", disable=not progress, dynamic_ncols=True):
        idx = order[lo:lo + batch_size]
        batch = collate([{"input_ids": [cls_id, *a.tolist(), sep_id, *b.tolist(), sep_id],
                          "token_type_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1)}
                         for _, a, b in (pairs[k] for k in idx)], pad_id)
        ids, types, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
        h = model.bert(ids, types, mask)                                   # (B, T, C)
        logits = model.nsp(model.bert.pool(h, None, mask)).float()         # (B, 2): 0 IsNext, 1 NotNext
        out[idx] = torch.softmax(logits, -1)[:, 0].numpy()
    return out


def summarize(kinds: np.ndarray, cosine: np.ndarray, p_next: np.ndarray | None, seed: int = 0) -> dict:
    """Per kind: the NSP head's accuracy (argmax; Wilson 95%) and mean P(IsNext), and the mean cosine;
    is_next against each negative kind: the head's ROC AUC and balanced accuracy, the topic baseline's."""
    per, against = {}, {}
    for kind in KINDS:
        sel = kinds == kind
        row = {"pairs": int(sel.sum()), "mean_cosine": float(cosine[sel].mean())}
        if p_next is not None:
            right = (p_next[sel] > 0.5) if kind == "is_next" else (p_next[sel] <= 0.5)
            lo, hi = wilson(int(right.sum()), len(right))
            row.update(nsp_accuracy=float(right.mean()), ci95=[lo, hi], mean_p_is_next=float(p_next[sel].mean()))
        per[kind] = row
    pos = kinds == "is_next"
    for kind in NEGATIVES:
        sel = pos | (kinds == kind)
        topic = threshold_baseline(cosine[sel], pos[sel], seed)
        row = {"topic_auc": topic["auc"], "topic_accuracy": topic["accuracy"], "topic_chance": topic["chance"]}
        if p_next is not None:
            row.update(nsp_auc=roc_auc(p_next[sel], pos[sel]),
                       nsp_balanced_accuracy=(per["is_next"]["nsp_accuracy"] + per[kind]["nsp_accuracy"]) / 2)
        against[kind] = row
    return {"kinds": per, "against_is_next": against}


def nsp_shortcut(model_dir: str | Path, heldout_text_path: str | Path | Sequence[str | Path], *,
                 anchors: int = 1000, seed: int = 0, max_length: int = 128, min_distance: int = 2,
                 batch_size: int = 64, threads: int | None = None, topic_only: bool = False,
                 progress: bool = False) -> dict:
    """NSP's topic shortcut on held-out text (one file or several): the NSP head of the checkpoint in
    `model_dir` on is_next / random_document / same_document pairs (`probe_pairs`), beside the
    bag-of-words baseline on the same pairs. `topic_only`: the baseline alone, no model run
    (`model_dir` may then be a tokenizer folder). Returns `summarize`'s dict with the settings."""

    ShortcutOptions(anchors, max_length, min_distance, seed, batch_size, threads, topic_only)      # checked
    paths = [heldout_text_path] if isinstance(heldout_text_path, (str, Path)) else list(heldout_text_path)
    path = model_folder(model_dir)
    tok = Tokenizer.from_dir(path)
    model = None if topic_only else load_nsp_model(path)
    if model is not None:
        check_inputs_fit(model.config, tok.vocab_size, max_length, "max_length", path)
    docs = read_documents_ids(paths, tok)
    pairs = probe_pairs(docs, anchors, seed, max_length, min_distance, where=", ".join(map(str, paths)))
    kinds = np.asarray([k for k, _, _ in pairs])
    seg = np.repeat(np.arange(2 * len(pairs)), [n for _, a, b in pairs for n in (len(a), len(b))])
    cosine = tfidf_cosine(np.concatenate([x for _, a, b in pairs for x in (a, b)]), seg, len(pairs))
    p_next = None
    if model is not None:
        with torch_threads(threads or None):
            p_next = nsp_is_next(model, pairs, tok.cls_id, tok.sep_id, tok.pad_id, batch_size, progress)
    return {"model": str(path), "text": [str(p) for p in paths], "documents": len(docs),
            "anchors": len(pairs) // len(KINDS), "seed": seed, "max_length": max_length,
            "min_distance": min_distance, "nsp_head": model is not None, **summarize(kinds, cosine, p_next, seed)}


def report_text(r: dict) -> str:
    """`nsp_shortcut`'s result as the table `bertkit data nsp-shortcut` prints."""
    head = r["nsp_head"]
    lines = [f"{r['anchors']:,} A segments from {r['documents']:,} held-out documents, one B of each kind (max length "
             f"{r['max_length']}, same-document B at least {r['min_distance']} sentences on, seed {r['seed']})",
             f"{'B':<16} {'pairs':>6} {'cosine':>7}" + (f" {'P(IsNext)':>9}  NSP head accuracy [95%]" if head else "")]
    for kind in KINDS:
        k = r["kinds"][kind]
        lines.append(f"{kind:<16} {k['pairs']:>6,} {k['mean_cosine']:>7.3f}" + (
            f" {k['mean_p_is_next']:>9.3f}  {k['nsp_accuracy']:.3f} [{k['ci95'][0]:.3f}, {k['ci95'][1]:.3f}]"
            if head else ""))
    lines.append("is_next against  topic AUC  topic accuracy (chance)" + ("  NSP AUC  NSP balanced accuracy" if head else ""))
    for kind in NEGATIVES:
        a = r["against_is_next"][kind]
        lines.append(f"{kind:<16} {a['topic_auc']:>9.3f}  {a['topic_accuracy']:>14.3f} ({a['topic_chance']:.3f})" + (
            f"  {a['nsp_auc']:>7.3f}  {a['nsp_balanced_accuracy']:>21.3f}" if head else ""))
    return "\n".join(lines)
