"""Are a checkpoint's sentence embeddings any good? Semantic similarity and retrieval, measured as
sentence-transformers' own evaluators measure them (`bertkit embed-eval`; tested equal to 1e-4).

    p = Predictor.from_dir(DIR, precision="fp32")
    evaluate_similarity(p, read_scored_pairs("STS-B/"), "mean")      # {"pairs", "spearman", "pearson"}
    evaluate_retrieval(p, read_retrieval("squad/dev.json"), "cls")   # {"queries", "corpus", "recall@1", ...}

Similarity (`EmbeddingSimilarityEvaluator`'s cosine metrics): the cosine of each pair's two
vectors against the gold scores, Pearson and Spearman. Data: a GLUE STS-B folder (its `dev.tsv`
for split dev) or any CSV / TSV / JSONL / Parquet file or dataset name with the columns
`sentence1, sentence2, score` (other names through `columns`), read by `tasks.custom`.

Retrieval (`InformationRetrievalEvaluator`'s definitions): every query's vector against every
passage's (cosine), binary relevance; recall@k = relevant passages in the top k / relevant
passages, MRR@10, nDCG@10 (its ideal ranking holds min(relevant, 10) hits). Equal scores rank
by passage id, as sentence-transformers ranks them; queries without a relevant passage are left
out. Data: a SQuAD file, folder or dataset name (each question retrieves its paragraph among all
paragraphs of the split: the questions of the first `limit` only, when given, among their
paragraphs), or a BEIR folder: `corpus.jsonl` (`_id`, `title`, `text`: a passage is title and
text joined by a space), `queries.jsonl` (`_id`, `text`) and `qrels/SPLIT.tsv` (`query-id`,
`corpus-id`, `score`: relevant when the score is above 0).

Poolings: 'mean' (every real token, [CLS] and [SEP] included, as sentence-transformers), 'cls'
(the [CLS] state) and 'pooler' (the pre-trained pooler, tanh(W h_[CLS] + b), trained by NSP; only
where the checkpoint has its weights). `available_poolings` lists what a checkpoint offers, its own
(the sentence-transformers config's, `own_pooling`) first.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .errors import BertkitError
from .runconfig import AT_LEAST_1, check_fields
from .sources import open_table
from .st_files import sentence_transformers_pooling
from .tasks import BadRows, DataError, SkipBadRows, get_task, open_text
from .tasks.custom import custom_task
from .tasks.metrics import pearson_spearman

POOLINGS = ("mean", "cls", "pooler")
RETRIEVAL_METRICS = ("recall@1", "recall@10", "mrr@10", "ndcg@10")
BLOCK = 2048          # texts per call to the Predictor (the progress bar moves; memory stays flat)


@dataclass
class EmbedEvalOptions(SkipBadRows):
    """How `bertkit embed-eval` reads its data and which poolings it measures (its flags:
    `cliconfig.add_options`; how the model runs is `PredictorOptions`)."""
    split: str = "dev"
    """Split to read from a folder (BEIR: qrels/SPLIT.tsv)."""
    columns: str = "sentence1,sentence2,score"
    """--sts files: the two sentence columns and the score column."""
    pooling: str | None = None
    """Comma-separated poolings among mean, cls, pooler (default: every one the checkpoint has, its own
    first: sentence-transformers' config, else mean)."""
    limit: Annotated[int | None, AT_LEAST_1] = None
    """Only the first N pairs / queries of each source."""
    batch_size: Annotated[int, AT_LEAST_1] = 32
    """Texts per batch."""

    def __post_init__(self):
        check_fields(self)                          # the ranges on the fields
        if len(self.column_names) != 3 or not all(self.column_names):
            raise BertkitError(f"columns {self.columns!r}: give three names, e.g. sentence1,sentence2,score")
        if wrong := [x for x in self.poolings or () if x not in POOLINGS]:
            raise BertkitError(f"pooling {wrong[0]!r}: choose among {', '.join(POOLINGS)}")

    @property
    def column_names(self) -> list[str]:
        return [c.strip() for c in self.columns.split(",")]

    @property
    def poolings(self) -> list[str] | None:
        """The poolings asked for, None for the checkpoint's."""
        return [x.strip() for x in self.pooling.split(",")] if self.pooling else None


@dataclass
class ScoredPairs:
    """Sentence pairs with a gold similarity score each."""
    name: str
    sentences1: list[str]
    sentences2: list[str]
    scores: list[float]


@dataclass
class Retrieval:
    """Queries, a corpus of passages and which passages answer each query (ids are strings)."""
    name: str
    queries: dict[str, str]
    corpus: dict[str, str]
    relevant: dict[str, set[str]]


# ---- reading ------------------------------------------------------------------------------------
def read_scored_pairs(source: str | Path, split: str = "dev", columns: Sequence[str] = ("sentence1", "sentence2", "score"),
                      skip_bad_rows: bool = False, limit: int | None = None) -> ScoredPairs:
    """Scored pairs from a GLUE STS-B folder (`split`'s file) or a CSV / TSV / JSONL / Parquet file
    or dataset name with the columns `columns` (first sentence, second sentence, score)."""
    bad = BadRows(skip=skip_bad_rows)
    if Path(source).is_dir():
        task = get_task("stsb")
        path: str | Path = task.split_path(source, split)
    else:
        task = custom_task("regress", text_column=columns[0], pair_column=columns[1], label_column=columns[2])
        path = source
    examples = task.read(path, bad)[:limit or None]
    for ex in examples:
        if ex.label is None:
            raise DataError(f"{ex.where or path}: no score in {columns[2]!r}")
    return ScoredPairs(str(source), [ex.text for ex in examples], [ex.pair for ex in examples],
                       [float(ex.label) for ex in examples])


def read_retrieval(source: str | Path, split: str = "dev", skip_bad_rows: bool = False,
                   limit: int | None = None) -> Retrieval:
    """A SQuAD file, folder or dataset name (questions -> their paragraphs) or a BEIR folder."""
    path = Path(source)
    if path.is_dir() and any((path / f).is_file() for f in ("corpus.jsonl", "corpus.jsonl.gz")):
        return read_beir(path, split, limit)
    squad = get_task("squad")
    examples = squad.read(squad.split_path(source, split), BadRows(skip=skip_bad_rows))[:limit or None]
    return pair_retrieval(str(source), {ex.id: ex.question for ex in examples}, [ex.context for ex in examples])


def pair_retrieval(name: str, queries: dict, positives: Sequence[str], others: Sequence[str] = ()) -> Retrieval:
    """Each query (in order) retrieves its positive among every positive and `others` (SQuAD: each
    question its paragraph); passage ids "0", "1", ... in order of first appearance."""
    passages = {text: str(i) for i, text in enumerate(dict.fromkeys([*positives, *others]))}
    return Retrieval(name, queries, {pid: text for text, pid in passages.items()},
                     {q: {passages[p]} for q, p in zip(queries, positives)})


def read_beir(folder: Path, split: str, limit: int | None = None) -> Retrieval:
    """A BEIR folder: corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv (plain or .gz)."""
    qrels = next((folder / "qrels" / n for n in (f"{split}.tsv", f"{split}.tsv.gz")
                  if (folder / "qrels" / n).is_file()), None)
    if qrels is None:
        have = sorted(p.name for p in (folder / "qrels").glob("*.tsv*")) if (folder / "qrels").is_dir() else []
        raise DataError(f"{folder}: no qrels/{split}.tsv (has: {', '.join(have) or 'no qrels folder'}); "
                        f"choose the split with --split")
    relevant: dict[str, set[str]] = {}
    with open_text(qrels) as f:
        for lineno, line in enumerate(f, 1):
            cells = line.rstrip("\r\n").split("\t")
            if lineno == 1 and not cells[-1].lstrip("-").replace(".", "").isdigit():
                continue                                                      # the header
            if len(cells) != 3:
                raise DataError(f"{qrels}:{lineno}: expected query-id, corpus-id, score (tab-separated)")
            try:
                score = float(cells[2])
            except ValueError:
                raise DataError(f"{qrels}:{lineno}: score {cells[2]!r} is not a number") from None
            if score > 0:
                relevant.setdefault(cells[0], set()).add(cells[1])
    corpus = {str(r["_id"]): f"{r.get('title') or ''} {r.get('text') or ''}".strip()
              for r in _beir_rows(folder, "corpus")}
    wanted = list(relevant)[:limit or None]
    texts = {str(r["_id"]): str(r.get("text") or "") for r in _beir_rows(folder, "queries")}
    if missing := [q for q in wanted if q not in texts]:
        raise DataError(f"{qrels}: query {missing[0]!r} is not in queries.jsonl")
    return Retrieval(str(folder), {q: texts[q] for q in wanted}, corpus, {q: relevant[q] for q in wanted})


def _beir_rows(folder: Path, name: str):
    path = next((folder / n for n in (f"{name}.jsonl", f"{name}.jsonl.gz") if (folder / n).is_file()), None)
    if path is None:
        raise DataError(f"{folder}: no {name}.jsonl")
    for where, row in open_table(path).rows():
        if "_id" not in row:
            raise DataError(f"{path}: {where}: no \"_id\" field")
        yield row


# ---- embedding and metrics ----------------------------------------------------------------------
def own_pooling(path: str | Path) -> str | None:
    """The pooling a checkpoint folder's sentence-transformers config names (None: no such config)."""
    return sentence_transformers_pooling(path)[0] if (Path(path) / "modules.json").is_file() else None


def available_poolings(predictor, own: str | None = None) -> list[str]:
    """The poolings a loaded checkpoint offers, `own` first; 'pooler' only where it has pooler weights."""
    has_pooler = not predictor.engine.heads and predictor.encoder.pooler is not None
    offered = [p for p in POOLINGS if p != "pooler" or has_pooler]
    return sorted(offered, key=lambda p: p != own)


def embed_texts(predictor, texts: Sequence[str], pooling: str, batch_size: int = 32,
                desc: str | None = None) -> np.ndarray:
    """(n, C) unit vectors of `texts` (each distinct text embedded once; a progress bar `desc`)."""
    from tqdm.auto import tqdm

    unique = list(dict.fromkeys(texts))
    out = np.zeros((len(unique), predictor.config.hidden_size), np.float32)
    with tqdm(total=len(unique), desc=desc, unit="text", disable=None if desc else True, leave=False) as bar:
        for at in range(0, len(unique), BLOCK):
            block = unique[at:at + BLOCK]
            out[at:at + len(block)] = predictor.embed(block, pooling=pooling, normalize=True, batch_size=batch_size)
            bar.update(len(block))
    where = {t: i for i, t in enumerate(unique)}
    return out[[where[t] for t in texts]]


def similarity_metrics(vectors1: np.ndarray, vectors2: np.ndarray, scores: Sequence[float]) -> dict[str, float]:
    """Pearson and Spearman of the pairs' cosine similarities against the gold scores."""
    a, b = (torch.as_tensor(v, dtype=torch.float64) for v in (vectors1, vectors2))
    cosine = F.cosine_similarity(a, b, dim=-1).numpy()
    r = pearson_spearman(list(scores), cosine)
    return {"spearman": r["spearman"], "pearson": r["pearson"]}


def rank(query_vectors: np.ndarray, corpus_vectors: np.ndarray, corpus_ids: Sequence[str], k: int = 10,
         chunk: int = 50_000) -> list[list[str]]:
    """The ids of each query's k passages of highest cosine, best first; equal scores by passage id
    (as sentence-transformers breaks ties), the corpus read `chunk` passages at a time."""
    q = F.normalize(torch.as_tensor(query_vectors, dtype=torch.float32), dim=-1)
    hits: list[list[tuple[float, str]]] = [[] for _ in range(len(q))]
    for start in range(0, len(corpus_ids), chunk):
        c = F.normalize(torch.as_tensor(corpus_vectors[start:start + chunk], dtype=torch.float32), dim=-1)
        scores = q @ c.T                                                          # (Q, chunk)
        threshold = scores.topk(min(k, scores.shape[1]), dim=1).values[:, -1:]    # (Q, 1): the k-th best
        rows, cols = (scores >= threshold).nonzero(as_tuple=True)                 # ~k per query (more on ties)
        for r, c_, s in zip(rows.tolist(), cols.tolist(), scores[rows, cols].tolist()):
            hits[r].append((s, corpus_ids[start + c_]))
        for h in hits:
            h.sort(key=lambda x: (-x[0], x[1]))
            del h[k:]
    return [[cid for _, cid in h] for h in hits]


def retrieval_metrics(ranked: Sequence[Sequence[str]], relevant: Sequence[set[str]]) -> dict[str, float]:
    """recall@1, recall@10, MRR@10 and nDCG@10 (binary relevance) of ranked passage ids."""
    recall1, recall10, mrr, ndcg = [], [], [], []
    for ids, rel in zip(ranked, relevant):
        hit = [cid in rel for cid in ids[:10]]
        recall1.append(sum(hit[:1]) / len(rel))
        recall10.append(sum(hit) / len(rel))
        mrr.append(next((1.0 / (i + 1) for i, h in enumerate(hit) if h), 0.0))
        dcg = sum(h / np.log2(i + 2) for i, h in enumerate(hit))
        ndcg.append(dcg / sum(1.0 / np.log2(i + 2) for i in range(min(len(rel), 10))))
    return {name: float(np.mean(v)) for name, v in zip(RETRIEVAL_METRICS, (recall1, recall10, mrr, ndcg))}


def evaluate_similarity(predictor, data: ScoredPairs, pooling: str, batch_size: int = 32,
                        progress: bool = False) -> dict:
    """{"pairs", "spearman", "pearson"} of `data` embedded by `predictor` with `pooling`."""
    n = len(data.scores)
    if n < 2:
        raise DataError(f"{data.name}: {n} scored pair(s); a correlation needs two or more")
    v = embed_texts(predictor, data.sentences1 + data.sentences2, pooling, batch_size,
                    desc=f"embed {pooling}" if progress else None)
    return {"pairs": n, **similarity_metrics(v[:n], v[n:], data.scores)}


def evaluate_retrieval(predictor, data: Retrieval, pooling: str, batch_size: int = 32,
                       progress: bool = False) -> dict:
    """{"queries", "corpus", "recall@1", "recall@10", "mrr@10", "ndcg@10"} of `data` embedded by
    `predictor` with `pooling` (queries without a relevant passage are left out)."""
    qids = [q for q in data.queries if data.relevant.get(q)]
    if not qids or not data.corpus:
        raise DataError(f"{data.name}: no query with a relevant passage, or an empty corpus")
    cids = list(data.corpus)
    desc = f"embed {pooling}" if progress else None
    corpus = embed_texts(predictor, [data.corpus[c] for c in cids], pooling, batch_size, desc)
    queries = embed_texts(predictor, [data.queries[q] for q in qids], pooling, batch_size, desc)
    ranked = rank(queries, corpus, cids)
    return {"queries": len(qids), "corpus": len(cids),
            **retrieval_metrics(ranked, [data.relevant[q] for q in qids])}
