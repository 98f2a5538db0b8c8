"""A prepared folder's bookkeeping, for `bertkit prepare` (`prepare.py`): what may be replaced, the
meta files that mark it complete, its tokenizer.

The meta file is the completion mark: a rerun deletes it first (`remove_meta`) and writes it last
(`write_meta`), so an interrupted run is visibly incomplete until the same command finishes it.
Data made with another tokenizer is refused (`check_existing`, unless --overwrite); the tokenizer
folder is written aside and renamed, never half-written (`save_tokenizer`).

    OUT/meta.json          (meta-I-of-N.json on machine I of N) settings, counts, shards; last written
    OUT/tokenizer/         the tokenizer the shards were made with
    OUT/shard-*/           the instances (`pretraining.write_shard`)
    OUT/eval/              the held-out documents, a prepared folder of its own (EVAL_DIR)
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import sys
from pathlib import Path

from ..errors import BertkitError, first_line
from ..outdir import write_whole
from ..tokenizer import Tokenizer
from .masking import TokenInfo
from .pretraining import FORMAT_VERSION, shard_name, sum_counts

log = logging.getLogger("bertkit")

EVAL_DIR = "eval"


def write_meta(out: Path, meta: dict, num_shards: int, shard_index: int) -> None:
    """The completion mark: meta.json (machine I of N: its own part), written aside and renamed."""
    name = "meta.json" if num_shards == 1 else f"meta-{shard_index:05d}-of-{num_shards:05d}.json"
    write_whole(out / name, json.dumps(meta, indent=1) + "\n")


def check_existing(out: Path, tok_hash: str, overwrite: bool) -> None:
    """Refuse to replace data made with another tokenizer (unless --overwrite). A tokenizer folder
    that does not load (left by a run killed while writing it) blocks nothing: shards are only
    reused when their key names this tokenizer."""
    if not out.exists():
        return
    if not out.is_dir():
        raise BertkitError(f"--out {out}: exists and is not a folder")
    if (out / "tokenizer").is_dir() and not overwrite:
        try:
            prev = Tokenizer.from_dir(out / "tokenizer")
            TokenInfo.from_vocab(prev.vocab)
            prev_hash = prev.fingerprint()
        except (BertkitError, OSError, KeyError, ValueError) as e:
            log.warning("%s: unreadable (%s), left by an interrupted run: replacing it", out / "tokenizer",
                        first_line(e))
        else:
            if prev_hash != tok_hash:
                raise BertkitError(f"--out {out}: holds shards made with another tokenizer (hash {prev_hash[:12]}, "
                                   f"this one {tok_hash[:12]}); use a new --out or --overwrite")
    if overwrite:
        for p in list(out.glob("shard-*")) + list(out.glob(".shard-*")) + list(out.glob("meta*.json")):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        shutil.rmtree(out / EVAL_DIR, ignore_errors=True)


def remove_meta(out: Path, num_shards: int, shard_index: int) -> None:
    """Delete the meta files this run replaces (all of them on one machine; on machine I of N its
    own part and parts of another N), before any shard is touched."""
    stale = [out / "meta.json"]
    for p in out.glob("meta-*-of-*.json"):
        if num_shards == 1 or p.name == f"meta-{shard_index:05d}-of-{num_shards:05d}.json" \
                or not p.name.endswith(f"-of-{num_shards:05d}.json"):
            stale.append(p)
    for p in stale:
        p.unlink(missing_ok=True)
    if num_shards == 1:            # shards half-written by a killed run (on a cluster, others may be writing)
        for p in out.glob(".shard-*.tmp-*"):
            shutil.rmtree(p, ignore_errors=True)


def save_tokenizer(tokenizer, out: Path, tok_hash: str) -> None:
    """OUT/tokenizer, written to a temporary sibling and renamed (never half-written)."""
    final = out / "tokenizer"
    for p in out.glob(".tokenizer.*"):                 # leftovers of killed runs
        shutil.rmtree(p, ignore_errors=True)
    if (final / "vocab.txt").is_file():
        try:
            if Tokenizer.from_dir(final).fingerprint() == tok_hash:
                return
        except (BertkitError, OSError, KeyError, ValueError):
            pass
    tmp, old = out / f".tokenizer.tmp-{os.getpid()}", out / f".tokenizer.old-{os.getpid()}"
    tokenizer.save(tmp)
    if final.exists():
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def build_meta(cfg, tokenizer, info, tok_hash, token_dtype, counts, results, files, command, num_shards, shard_index,
          seconds, reused) -> dict:
    """The meta file's contents: the settings, the tokenizer, the counts summed over the shards, the inputs."""
    order = sorted(results)
    return {
        "format_version": FORMAT_VERSION,
        "max_length": cfg.max_length, "nsp": cfg.nsp, "masking": cfg.masking,
        "masking_config": cfg.masking_config.to_dict(), "dupe_factor": cfg.dupe_factor, "seed": cfg.seed,
        "vocab_size": info.vocab_size, "lowercase": tokenizer.lowercase,
        "special_ids": {"pad": info.pad_id, "unk": tokenizer.unk_id, "cls": info.cls_id, "sep": info.sep_id,
                        "mask": info.mask_id},
        "tokenizer_hash": tok_hash, "config_hash": cfg.hash(), "token_dtype": token_dtype,
        "config": cfg.to_dict(),
        "counts": {**counts.to_dict(), **sum_counts([results[c] for c in order]), "shards_kept_from_before": reused},
        "shards": [shard_name(c) for c in order], "shard_instances": [results[c]["instances"] for c in order],
        "num_shards": num_shards, "shard_index": shard_index,
        "inputs": [str(f) for f in files],
        "command": command if command is not None else " ".join(shlex.quote(a) for a in sys.argv),
        "seconds": round(seconds, 3),
    }
