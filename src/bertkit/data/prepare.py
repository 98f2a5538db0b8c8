"""`bertkit prepare`: raw text -> sharded pre-training instances, streaming, in parallel, resumable.

Held-out documents first: a quick pass over the input (reading only) gives every document a key,
blake2b(seed, text); the documents with the smallest keys (--eval-fraction of them, default 1%,
or exactly --eval-documents) form the evaluation split, written to OUT/eval/ as a prepared folder
of its own. No instance ever mixes the two sides, so held-out text is never trained on (only
text that also occurs in other documents can overlap; `data stats` and `pretrain` measure it).

The main process then reads the inputs in order, sends each document to its side and cuts each
side into chunks of whole documents (`text.Chunker`: >= chunk_mb of text and >= 2 documents).
Chunk C becomes shard C; a worker tokenizes it (Rust, batched), builds the instances
(`instances.py`: Google's NSP builder or FULL-SENTENCES packing), masks them when masking is
static, shuffles them and writes the shard atomically. Everything random in chunk C comes from
generators seeded by (seed, C) (`random.Random` for the builder as Google,
`np.random.default_rng([seed, C])` for static masks; the held-out chunks have their own), and
the random-next document pool is the chunk's own documents, so the output is byte-identical for
any --workers, memory is bounded by a few chunks in flight (never by the corpus), and a cluster
can split one corpus with --num-shards N --shard-index I (machine I does the chunks C = I mod N).

Resume: a shard whose shard.json carries the same configuration, tokenizer and input-chunk
hashes is kept; anything else is rewritten. Data made with another tokenizer is refused. The
meta file is the completion mark: a rerun deletes it first and writes it last, so an
interrupted run is visibly incomplete (readers refuse it) until the same command finishes it
(the folder's bookkeeping: `folder.py`; the text and instance building: text.py, instances.py).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import multiprocessing as mp
import os
import random
import shutil
import signal
import sys
import threading
import time
from array import array
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Callable, Iterator, Literal

import numpy as np
from tokenizers import Tokenizer as RustTokenizer
from tqdm import tqdm

from ..errors import BertkitError
from ..runconfig import AT_LEAST_1, NON_NEGATIVE, POSITIVE, PROBABILITY, SEED, UNIT, Checked, Rule, check_fields
from .encode import CachedEncoder
from .folder import EVAL_DIR, build_meta, check_existing, remove_meta, save_tokenizer, write_meta
from .instances import BuildCounts, Doc, nsp_instances, packed_instances, sop_instances
from .masking import MaskingConfig, TokenInfo, mask_many
from .pretraining import read_shard_info, shard_name, write_shard
from .text import Chunker, TextCounts, expand_inputs, read_documents

log = logging.getLogger("bertkit")
LENGTH = Rule("in [8, 65535]", lambda v: 8 <= v <= 65535)


@dataclass
class PrepareConfig:
    max_length: Annotated[int, LENGTH] = 128
    """Longest instance in tokens, [CLS] and [SEP]s included (Google's max_seq_length)."""
    nsp: bool = True
    """Google's sentence pairs with next-sentence labels; False packs full sentences (RoBERTa)."""
    fill: bool = False
    """With nsp false: cut the sentence that does not fit and carry its rest into the next
    instance, so every instance is max_length tokens but the last (no padding to compute on;
    whole sentences leave ~17% of a 128-token instance empty on the shared corpus)."""
    short_seq_prob: Annotated[float, UNIT] = 0.1
    """NSP: probability of a random shorter target length for a document."""
    lone_segment: Literal["next", "random"] = "next"
    """NSP, when one sentence fills the target: 'next' keeps random-next at 50% (B = the next
    sentence); 'random' is Google's exact rule (B always random then: ~60% random-next)."""
    pair_mode: Literal["nsp", "sop"] = "nsp"
    """With nsp: 'nsp' (B follows A or, half the time, comes from another document) or 'sop'
    (sentence-order prediction, ALBERT: B always follows A and half the pairs are swapped; the
    pair label, read by the NSP head, is 1 = swapped). See `instances.sop_instances`."""
    masking: Literal["dynamic", "static"] = "dynamic"
    """'dynamic' (masks drawn by the collator every epoch) or 'static' (Google: stored with the data)."""
    dupe_factor: Annotated[int | None, AT_LEAST_1] = None
    """Passes over the corpus with different splits (and masks); default 10 static, 1 dynamic."""
    masking_config: MaskingConfig = field(default_factory=MaskingConfig)
    """Masking used for static data, and recorded as the default for dynamic data."""
    seed: Annotated[int, SEED] = 12345
    """Everything random in chunk C is drawn from generators seeded with (seed, C)."""
    chunk_mb: Annotated[float, POSITIVE] = 4.0
    """Text per chunk (= per shard and per random-next pool), in MB."""
    sentence_split: bool = False
    """Input lines are paragraphs: split them into sentences."""
    strict: bool = False
    """Fail on invalid UTF-8 (file:line) instead of replacing and counting it."""
    max_line_bytes: Annotated[int, AT_LEAST_1] = 65536
    """Longer lines are cut at a space into several sentences (counted)."""
    eval_fraction: Annotated[float, PROBABILITY] = 0.01
    """Share of the documents held out as the evaluation split (OUT/eval/, a prepared folder of
    its own), chosen before any instance is built: the documents with the smallest keys
    blake2b(seed, text), so the choice is deterministic and an exact duplicate of a held-out
    document is held out with it. At least 2 documents when the input has 20 or more; none below."""
    eval_documents: Annotated[int | None, NON_NEGATIVE] = None
    """Hold out exactly this many documents instead (0 = no evaluation split)."""

    def __post_init__(self):
        if isinstance(self.masking_config, dict):
            self.masking_config = MaskingConfig(**self.masking_config)
        check_fields(self)                              # the choices and ranges on the fields
        if self.dupe_factor is None:
            self.dupe_factor = 10 if self.masking == "static" else 1
        if self.pair_mode == "sop" and not self.nsp:
            raise BertkitError("pair_mode sop builds sentence pairs: it needs nsp (pairs), not nsp false (--no-nsp) packing")
        if self.fill and self.nsp:
            raise BertkitError("fill packs full-length instances of running text: it needs nsp false (--no-nsp); "
                               "sentence pairs keep Google's target lengths")
        if self.nsp and self.eval_documents == 1:
            raise BertkitError("eval_documents 1: NSP pairs need at least 2 held-out documents (or nsp false: --no-nsp)")

    @property
    def eval_requested(self) -> bool:
        return self.eval_documents != 0 and (self.eval_documents is not None or self.eval_fraction > 0)

    def to_dict(self) -> dict:
        d = asdict(self)
        if not d["fill"]:            # absent unless set: folders prepared before it keep their config hash
            del d["fill"]
        return d

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class _Job:
    """What a worker needs (sent once per worker)."""
    cfg: PrepareConfig
    eval_cfg: PrepareConfig                # the held-out split: one pass (dupe factor 1), no split of its own
    tokenizer_json: str
    info: TokenInfo
    out: str
    tokenizer_hash: str
    token_dtype: str
    lowercase: bool

    def split_cfg(self, split: str) -> PrepareConfig:
        return self.eval_cfg if split == "eval" else self.cfg

    def folder(self, split: str) -> Path:
        return Path(self.out) / EVAL_DIR if split == "eval" else Path(self.out)


_JOB: _Job | None = None
_BACKEND = None


def _init_worker(job: _Job, single_thread: bool, parent: int | None = None) -> None:
    global _JOB, _BACKEND
    if parent is not None:
        _die_with_parent(parent)
    if single_thread:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _JOB, _BACKEND = job, CachedEncoder(RustTokenizer.from_str(job.tokenizer_json), job.lowercase)


def _die_with_parent(parent: int) -> None:
    """A worker ends when the process that started it ends, even by kill -9 (no orphans left
    blocked on the task queue): Linux's PR_SET_PDEATHSIG, else a thread watching the parent."""
    if sys.platform.startswith("linux"):
        try:
            if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0) == 0:   # PR_SET_PDEATHSIG
                if os.getppid() != parent:          # the parent died before the call
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)
    threading.Thread(target=watch, name="bertkit-parent-watch", daemon=True).start()


def tokenize_documents(docs: list[list[str]], encoder) -> list[Doc]:
    """Sentences -> word-piece ids (no specials); sentences with no tokens and empty documents dropped."""
    ids, lengths = encoder.encode_flat([s for d in docs for s in d])
    start = [0, *np.cumsum(lengths).tolist()]
    out, k = [], 0
    for d in docs:
        lo, hi = start[k], start[k + len(d)]
        off = [0]
        for e in start[k + 1:k + len(d) + 1]:
            if e - lo != off[-1]:                # drop sentences without tokens
                off.append(e - lo)
        k += len(d)
        if len(off) > 1:
            out.append(Doc(ids[lo:hi], off))
    return out


def build_chunk(chunk_index: int, docs: list[list[str]], job: _Job, encoder, split: str = "train"
                ) -> tuple[dict, dict]:
    """One chunk of documents -> (arrays of its shard, counts). Pure function of its inputs."""
    cfg, info = job.split_cfg(split), job.info
    held = split == "eval"                                 # held-out chunks draw from their own generators
    rng = chunk_rng(cfg.seed, f"eval-{chunk_index}" if held else chunk_index)   # as Google's random.Random
    mask_rng = np.random.default_rng([cfg.seed, chunk_index, 1] if held else [cfg.seed, chunk_index])
    tok_docs = tokenize_documents(docs, encoder)
    counts = BuildCounts()
    instances = []
    for _ in range(cfg.dupe_factor):
        if cfg.nsp:
            if len(tok_docs) < 2 and cfg.pair_mode == "nsp":     # SOP pairs stay inside a document
                raise BertkitError(f"chunk {chunk_index}: NSP needs at least 2 documents with text "
                                   "(blank lines separate documents); use --no-nsp for one long text")
            order = list(range(len(tok_docs)))
            rng.shuffle(order)                               # Google shuffles the documents first
            for d in order:
                args = (tok_docs, int(d), cfg.max_length, cfg.short_seq_prob, rng, info.cls_id, info.sep_id, counts)
                if cfg.pair_mode == "sop":                   # sentence-order pairs (ALBERT)
                    instances.extend(sop_instances(*args))
                else:
                    instances.extend(nsp_instances(*args, cfg.lone_segment))
        else:
            instances.extend(packed_instances(tok_docs, cfg.max_length, info.cls_id, info.sep_id, counts, cfg.fill))
    # these counters tick once per dupe pass (the first two with nsp, the others without); report per corpus pass
    for name in ("one_sentence_documents", "lone_segments_next", "sentences_split", "sentences_cut"):
        setattr(counts, name, getattr(counts, name) // cfg.dupe_factor)
    rng.shuffle(instances)
    lens = np.fromiter((x.length for x in instances), dtype=np.int64, count=len(instances))
    total = int(lens.sum())
    flat = np.concatenate([p for x in instances for p in x.parts]) if instances else np.zeros(0, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    arrays = {
        "input_ids": flat.astype(job.token_dtype),
        "offsets": offsets,
        "b_start": np.fromiter((x.b_start for x in instances), dtype=np.int32, count=len(instances)),
        "nsp_labels": np.fromiter((x.nsp_label for x in instances), dtype=np.int8, count=len(instances)),
        "short": np.fromiter((x.short for x in instances), dtype=np.uint8, count=len(instances)),
    }
    if cfg.masking == "static":   # Google masks each instance as it is made; same distribution, done at once
        masked, pos, ids, mlm_offsets = mask_many(flat, offsets, cfg.masking_config, mask_rng, info.vocab_size,
                                                  info.mask_id, info.never_mask, info.subword)
        arrays["input_ids"] = masked.astype(job.token_dtype)
        arrays["masked_lm_offsets"] = mlm_offsets
        arrays["masked_lm_positions"] = pos.astype(np.int32)
        arrays["masked_lm_ids"] = ids.astype(job.token_dtype)
    stats = {"instances": len(instances), **asdict(counts), "tokens": total, "documents": len(tok_docs),
             "sentences": sum(len(d.off) - 1 for d in tok_docs), "max_length": int(lens.max()) if len(lens) else 0,
             "empty_documents_dropped": len(docs) - len(tok_docs)}
    return arrays, stats


def chunk_rng(seed: int, chunk_index: int | str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256(f"{seed}:{chunk_index}".encode()).digest()[:8], "big"))


def chunk_hash(docs: list[list[str]]) -> str:
    """sha1 of a chunk's text (resume keeps a shard only when its input is unchanged)."""
    return hashlib.sha1("\n\n".join("\n".join(d) for d in docs).encode("utf-8", "surrogatepass")).hexdigest()


def _run_chunk(split: str, chunk_index: int, docs: list[list[str]], digest: str) -> dict:
    job = _JOB
    arrays, stats = build_chunk(chunk_index, docs, job, _BACKEND, split)
    info = {"chunk": chunk_index, "chunk_hash": digest, "config_hash": job.split_cfg(split).hash(),
            "tokenizer_hash": job.tokenizer_hash, **stats}
    write_shard(job.folder(split), shard_name(chunk_index), arrays, info)
    return info


# ---- the held-out split ----------------------------------------------------------------------------
def document_key(seed: int, doc: list[str]) -> int:
    """64-bit key of a document's text under the seed: the split holds out the smallest keys."""
    h = hashlib.blake2b("\n".join(doc).encode("utf-8", "surrogatepass"), digest_size=8,
                        key=str(seed).encode())
    return int.from_bytes(h.digest(), "big")


def held_out_documents(files: list[Path], cfg: PrepareConfig, progress=None) -> tuple[np.ndarray | None, dict]:
    """A first pass over the input (read, no tokenizing): which documents, by position, form the
    evaluation split. Returns (True per held-out document, or None for no split; a summary)."""
    if not cfg.eval_requested:
        return None, {"documents": 0, "note": "no split requested (--eval-fraction 0 / --eval-documents 0)"}
    docs = read_documents(files, TextCounts(), sentence_split=cfg.sentence_split, strict=cfg.strict,
                          max_line_bytes=cfg.max_line_bytes, max_document_bytes=int(cfg.chunk_mb * 8e6),
                          progress=progress, warn=False)
    keys = array("Q", (document_key(cfg.seed, doc) for doc in docs))
    key = np.frombuffer(keys, dtype=np.uint64) if len(keys) else np.zeros(0, np.uint64)
    n = len(key)
    k = cfg.eval_documents
    if k is None:
        k = int(round(cfg.eval_fraction * n))
        if k < 2:
            k = 2 if n >= 20 else 0
    if k == 0:
        note = f"the input has {n} documents, too few to hold 2 out by default (--eval-documents N forces a split)"
        log.warning("no evaluation split: %s; pretrain will evaluate on training instances", note)
        return None, {"documents": 0, "note": note}
    keep = 2 if cfg.nsp else 1
    if k > n - keep:
        raise BertkitError(f"eval_documents {k}: the input has {n} documents and at least {keep} must stay "
                           "for training")
    held = key <= np.partition(key, k - 1)[k - 1]
    return held, {"documents": int(held.sum()), "requested": k, "of_documents": n,
                  "fraction": float(held.mean()), "selection": f"the {k} documents with the smallest "
                  f"blake2b(seed={cfg.seed}, text) keys (exact duplicates of them too)"}


def split_chunks(docs: Iterator[list[str]], chunk_bytes: int, held: np.ndarray | None
                 ) -> Iterator[tuple[str, list[list[str]]]]:
    """('train' | 'eval', chunk) pairs: the documents of each side chunked by a `Chunker`."""
    sides = {"train": Chunker(chunk_bytes), "eval": Chunker(chunk_bytes)}
    n = 0
    for doc in docs:
        if held is not None and n >= len(held):
            raise BertkitError("the input changed while prepare was reading it (more documents than before)")
        side = "eval" if held is not None and held[n] else "train"
        n += 1
        done = sides[side].add(doc)
        if done is not None:
            yield side, done
    if held is not None and n != len(held):
        raise BertkitError("the input changed while prepare was reading it (fewer documents than before)")
    for side in ("train", "eval"):
        for chunk in sides[side].finish():
            yield side, chunk


class _InProcess:
    """The executor interface, run in this process (--workers 1)."""

    def __init__(self, job: _Job):
        _init_worker(job, single_thread=False)

    def submit(self, fn, *args):
        f: Future = Future()
        f.set_result(fn(*args))
        return f

    def shutdown(self, **_):
        pass


@dataclass
class PrepareRunOptions(Checked):
    """How `prepare` runs, its keywords beside the PrepareConfig (`bertkit prepare`'s flags:
    `cliconfig.add_options`)."""
    workers: Annotated[int, AT_LEAST_1] = 1
    """Processes (output is identical for any number)."""
    num_shards: Annotated[int, AT_LEAST_1] = 1
    """Split the corpus over N machines ..."""
    shard_index: Annotated[int, NON_NEGATIVE] = 0
    """... and do part I of N here."""
    overwrite: bool = False
    """Delete shards already in --out."""
    progress: bool = True
    """Progress bars (--no-progress: none)."""


def prepare(inputs: list[str], tokenizer, out: str | Path, cfg: PrepareConfig, workers: int = 1,
            num_shards: int = 1, shard_index: int = 0, overwrite: bool = False, progress: bool = True,
            command: str | None = None, on_shard: Callable[[int], None] | None = None) -> dict:
    """Prepare the data; returns the meta dict written to OUT/meta.json (or meta-I-of-N.json).

    `on_shard(n)`, if given, is called each time a shard has been built and written, with the number
    of shards this call has built so far (kept shards do not count); a crash test kills the process there."""
    if num_shards < 1:
        raise BertkitError(f"num_shards {num_shards}: expected >= 1")
    if not 0 <= shard_index < num_shards:
        raise BertkitError(f"shard_index {shard_index}: expected 0..{num_shards - 1}")
    files = expand_inputs(inputs)
    out = Path(out)
    info = TokenInfo.from_vocab(tokenizer.vocab)
    tok_hash = tokenizer.fingerprint()
    created = not out.exists()
    check_existing(out, tok_hash, overwrite)
    try:
        return _prepare(files, inputs, tokenizer, info, tok_hash, out, cfg, workers, num_shards, shard_index,
                        progress, command, on_shard)
    except BertkitError:
        if created:                  # bad input: leave no half-made folder behind
            shutil.rmtree(out, ignore_errors=True)
        raise


def _prepare(files, inputs, tokenizer, info, tok_hash, out, cfg, workers, num_shards, shard_index, progress,
             command, on_shard) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    # From here until the new meta file is written the folder is visibly incomplete: the old meta
    # goes first, so a rerun killed midway never leaves it describing a mix of old and new shards.
    remove_meta(out, num_shards, shard_index)
    if (out / EVAL_DIR).is_dir():
        remove_meta(out / EVAL_DIR, num_shards, shard_index)
    save_tokenizer(tokenizer, out, tok_hash)
    token_dtype = "uint16" if info.vocab_size <= 65536 else "int32"
    eval_cfg = replace(cfg, dupe_factor=1, eval_fraction=0.0, eval_documents=0)
    job = _Job(cfg, eval_cfg, tokenizer.backend.to_str(), info, str(out), tok_hash, token_dtype, tokenizer.lowercase)
    counts = TextCounts()
    total_bytes = sum(f.stat().st_size for f in files) * (2 if cfg.eval_requested else 1)
    t0 = time.time()
    executor = _InProcess(job) if workers <= 1 else ProcessPoolExecutor(
        workers, mp_context=_mp_context(), initializer=_init_worker, initargs=(job, True, os.getpid()))
    executor.submit(os.getpid).result()       # start the workers now, before the progress bar starts its thread
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="prepare", disable=not progress, smoothing=0.1)
    try:
        held, held_info = held_out_documents(files, cfg, progress=bar.update)
        if held is None:
            shutil.rmtree(out / EVAL_DIR, ignore_errors=True)       # a split of an earlier run
        else:
            (out / EVAL_DIR).mkdir(exist_ok=True)
            save_tokenizer(tokenizer, out / EVAL_DIR, tok_hash)
        results, reused = _build_shards(executor, files, job, counts, held, workers, num_shards, shard_index,
                                        bar, on_shard)
    finally:
        executor.shutdown(cancel_futures=True)
        bar.close()
    seconds = time.time() - t0
    if counts.sentences == 0:
        raise BertkitError(f"{', '.join(map(str, inputs))}: no text in the input")
    if not results["train"]:
        raise BertkitError(f"no chunks for --shard-index {shard_index} of {num_shards} (the corpus has fewer chunks)")
    if cfg.nsp and cfg.pair_mode == "nsp" and counts.documents < 2:
        raise BertkitError("NSP needs at least 2 documents (blank lines separate documents); use --no-nsp")
    meta = build_meta(cfg, tokenizer, info, tok_hash, token_dtype, counts, results["train"], files, command,
                 num_shards, shard_index, seconds, reused)
    meta["counts"]["held_out_documents"] = held_info["documents"]
    meta["eval"] = None
    if held is not None:          # the split's own meta first: the parent's, written last, vouches for both
        ev = build_meta(eval_cfg, tokenizer, info, tok_hash, token_dtype, counts, results["eval"], files, command,
                   num_shards, shard_index, seconds, 0)
        ev["split"] = "eval"
        ev["counts"]["documents"] = held_info["documents"]
        write_meta(out / EVAL_DIR, ev, num_shards, shard_index)
        meta["eval"] = {"path": EVAL_DIR, "config_hash": eval_cfg.hash(), **held_info,
                        "instances": ev["counts"]["instances"], "tokens": ev["counts"]["tokens"]}
    write_meta(out, meta, num_shards, shard_index)
    log.info("prepared %d instances (%d tokens) in %d shards from %.1f MB in %.1f s (%.2f MB/s)%s -> %s",
             meta["counts"]["instances"], meta["counts"]["tokens"], len(results["train"]), counts.bytes / 1e6, seconds,
             counts.bytes / 1e6 / max(seconds, 1e-9), f", {reused} shards kept from before" if reused else "", out)
    c = meta["counts"]
    if c["tokens_truncated"]:
        log.info("truncated %d of %d sentence pairs to %d tokens (%d tokens cut, from the longer segment, as "
                 "Google's truncate_seq_pair)", c["pairs_truncated"], c["instances"], cfg.max_length,
                 c["tokens_truncated"])
    if held is not None:
        log.info("held out %d of %d documents for evaluation: %d instances -> %s", held_info["documents"],
                 held_info["of_documents"], meta["eval"]["instances"], out / EVAL_DIR)
    return meta


def _build_shards(executor, files, job: _Job, counts: TextCounts, held, workers, num_shards, shard_index, bar,
                  on_shard: Callable[[int], None] | None = None) -> tuple[dict[str, dict[int, dict]], int]:
    """Read, split and chunk the input; build (or keep) this machine's shards of both splits."""
    cfg = job.cfg
    results: dict[str, dict[int, dict]] = {"train": {}, "eval": {}}
    inflight: dict[tuple[str, int], object] = {}         # in submission order
    reused, built, seen = 0, 0, {"train": 0, "eval": 0}
    try:
        docs = read_documents(files, counts, sentence_split=cfg.sentence_split, strict=cfg.strict,
                              max_line_bytes=cfg.max_line_bytes, max_document_bytes=int(cfg.chunk_mb * 8e6),
                              progress=bar.update)
        for split, chunk in split_chunks(docs, int(cfg.chunk_mb * 1e6), held):
            c = seen[split]
            seen[split] += 1
            if c % num_shards != shard_index:
                continue
            digest = chunk_hash(chunk)
            old = read_shard_info(job.folder(split) / shard_name(c))
            if old and (old.get("chunk_hash"), old.get("config_hash"), old.get("tokenizer_hash")) == \
                    (digest, job.split_cfg(split).hash(), job.tokenizer_hash):
                results[split][c] = old
                reused += 1
                continue
            inflight[(split, c)] = executor.submit(_run_chunk, split, c, chunk, digest)
            while len(inflight) >= 2 * max(workers, 1):           # bounded: a few chunks in memory
                key = next(iter(inflight))
                results[key[0]][key[1]] = inflight.pop(key).result()
                built += 1
                if on_shard is not None:
                    on_shard(built)
        for key in list(inflight):
            results[key[0]][key[1]] = inflight.pop(key).result()
            built += 1
            if on_shard is not None:
                on_shard(built)
    finally:
        for f in inflight.values():
            f.cancel()
    return results, reused


def _mp_context():
    return mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
