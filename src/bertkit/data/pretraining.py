"""Prepared pre-training data on disk, read with zero copies.

On-disk format (written by `bertkit prepare`, see `bertkit.data.prepare`):

  OUT/meta.json               max_length, nsp (bool), masking ('static'|'dynamic'), masking_config,
                              vocab_size, special_ids, tokenizer_hash, token_dtype, counts, shards
                              (names, in order), shard_instances, seed, command line, ...
                              (a cluster run with --num-shards N writes meta-IIIII-of-NNNNN.json per
                              machine instead; copy the folders together and they read as one)
  OUT/tokenizer/              the tokenizer the data was made with (vocab.txt, tokenizer.json, ...)
  OUT/eval/                   the held-out documents (`meta.json` "eval" says how many and how
                              chosen), prepared the same way in a folder of the same format;
                              written before OUT/meta.json, which vouches for both
  OUT/shard-CCCCC/            one per input chunk C, written to a temporary folder then renamed
                              (a partial shard never looks complete):
      input_ids.npy           all instances' ids concatenated, incl. [CLS]/[SEP] (uint16 when the
                              vocabulary fits, else int32); static masking: ids *after* masking
      offsets.npy             int64 (n + 1): instance i is input_ids[offsets[i]:offsets[i+1]]
      b_start.npy             int32 (n): index of the first token of segment B (token type 1 from
                              there on); equal to the length for a single segment
      nsp_labels.npy          int8 (n): 0 is-next, 1 random next, -1 no NSP
      short.npy               uint8 (n): 1 when the instance came from a short target length
      masked_lm_offsets.npy   static only: int64 (n + 1) into the next two arrays
      masked_lm_positions.npy static only: int32, positions within the instance (sorted)
      masked_lm_ids.npy       static only: the original ids at those positions
      shard.json              this shard's counts and the hashes resume checks

API:
  open_dataset(path) -> PretrainingData
  eval_split(ds) -> PretrainingData | None     the held-out split of a prepared folder, checked
  len(ds); ds.meta; ds.shard_paths
  ds[i] -> {"index": i, "input_ids": int64 (L,), "token_type_ids": int64 (L,), "nsp_label": int,
            + static: "masked_lm_positions": int64 (M,), "masked_lm_ids": int64 (M,)}
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..errors import DataError, first_line
from ..sources import read_json_object
from ..tokenizer import Tokenizer
from .masking import MaskingConfig, TokenInfo

ARRAYS = ("input_ids", "offsets", "b_start", "nsp_labels", "short")
STATIC_ARRAYS = ("masked_lm_offsets", "masked_lm_positions", "masked_lm_ids")
FORMAT_VERSION = 1
SUMMED_COUNTS = ("instances", "tokens", "random_next", "short", "one_sentence_documents", "sentences_split",
                 "sentences_cut", "tokens_truncated", "pairs_truncated", "lone_segments_next",
                 "empty_documents_dropped")


def shard_name(chunk_index: int) -> str:
    return f"shard-{chunk_index:05d}"


def write_shard(out_dir: Path, name: str, arrays: dict[str, np.ndarray], info: dict) -> Path:
    """Write a shard atomically: into a temporary folder, then one rename."""
    final = Path(out_dir) / name
    tmp = Path(out_dir) / f".{name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for key, arr in arrays.items():
        np.save(tmp / f"{key}.npy", arr, allow_pickle=False)
    (tmp / "shard.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    if final.exists():                       # an older shard being replaced (resume with new input)
        shutil.rmtree(final)
    os.rename(tmp, final)
    return final


def sum_counts(parts: list[dict]) -> dict:
    """The instance counts of shards (or of machines) added up, the longest instance, the shares."""
    total = {k: sum(p.get(k, 0) for p in parts) for k in SUMMED_COUNTS}
    n = max(total["instances"], 1)
    return {**total, "max_length": max((p.get("max_length", 0) for p in parts), default=0),
            "random_next_fraction": total["random_next"] / n, "short_fraction": total["short"] / n}


def read_shard_info(path: Path) -> dict | None:
    """The shard's info, or None when the shard is absent or incomplete."""
    f = Path(path) / "shard.json"
    if not f.is_file():
        return None
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError:
        return None


def load_meta(path: Path) -> dict:
    """meta.json, or the per-machine metas of a --num-shards run merged into one."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"{path}: not a prepared data folder (run `bertkit prepare --out {path}`)")
    f = path / "meta.json"
    if f.is_file():
        return _checked_meta(f)
    parts = sorted(path.glob("meta-*-of-*.json"))
    if not parts:
        partial = sorted(p.name for p in path.glob("shard-*"))
        hint = f" ({len(partial)} shards so far: rerun the same prepare command to finish)" if partial else ""
        raise DataError(f"{path}: no meta.json, the data is not complete{hint}")
    metas = [_checked_meta(p) for p in parts]
    n = metas[0].get("num_shards", 1)
    have = {m.get("shard_index") for m in metas}
    if len(have) != n:
        raise DataError(f"{path}: parts {sorted(set(range(n)) - have)} of {n} are missing (meta-*-of-{n:05d}.json)")
    for m, p in zip(metas, parts):
        if m["tokenizer_hash"] != metas[0]["tokenizer_hash"] or m["config_hash"] != metas[0]["config_hash"]:
            raise DataError(f"{p}: made with a different tokenizer or configuration than {parts[0].name}")
    meta = dict(metas[0])
    pairs = sorted((s, c) for m in metas for s, c in zip(m["shards"], m["shard_instances"]))
    meta["shards"], meta["shard_instances"] = [s for s, _ in pairs], [c for _, c in pairs]
    # every machine reads the whole input (text counts are equal); instance counts add up
    meta["counts"] = {**metas[0].get("counts", {}), **sum_counts([m.get("counts", {}) for m in metas])}
    meta["num_shards"], meta["shard_index"] = 1, 0
    return meta


def _load_array(f: Path) -> np.ndarray:
    """A shard array as a read-only memory map; never unpickles (object arrays are refused)."""
    try:
        a = np.load(f, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f"{f}: not a numeric .npy array ({first_line(e, 120)})") from None
    if a.dtype.kind not in "iub":
        raise DataError(f"{f}: holds {a.dtype} values, expected integers")
    return a


def _checked_meta(f: Path) -> dict:
    """A meta file, with the fields readers rely on checked (a one-line DataError naming the field)."""
    meta = read_json_object(f)
    shards, counts = meta.get("shards"), meta.get("shard_instances")
    if not isinstance(shards, list) or not all(isinstance(x, str) and x.startswith("shard-") and "/" not in x
                                               for x in shards):
        raise DataError(f"{f}: 'shards' must be a list of shard-NNNNN folder names")
    if not isinstance(counts, list) or len(counts) != len(shards) or \
            not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        raise DataError(f"{f}: 'shard_instances' must hold one instance count (>= 0) per shard")
    if "max_seq_length" in meta:                                      # an older bertkit's name
        raise DataError(f"{f}: max_seq_length is now max_length (data of an older bertkit: prepare it again)")
    for key, kind in (("max_length", int), ("vocab_size", int)):
        if key in meta and (not isinstance(meta[key], kind) or isinstance(meta[key], bool) or meta[key] < 1):
            raise DataError(f"{f}: '{key}' must be a positive integer, got {meta[key]!r}")
    if meta.get("masking", "dynamic") not in ("dynamic", "static"):
        raise DataError(f"{f}: 'masking' must be dynamic or static, got {meta.get('masking')!r}")
    if "masking_config" in meta:
        try:
            MaskingConfig(**meta["masking_config"])
        except (TypeError, ValueError) as e:
            raise DataError(f"{f}: 'masking_config': {first_line(e)}") from None
    return meta


class PretrainingData:
    """All instances of a prepared folder. Arrays are numpy memmaps, opened when first read."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.meta = load_meta(self.path)
        self.shard_paths = [self.path / s for s in self.meta["shards"]]
        for p in self.shard_paths:
            if read_shard_info(p) is None:
                raise DataError(f"{p}: shard missing or incomplete (rerun prepare with the same options)")
        self.static = self.meta.get("masking") == "static"
        self._starts = np.concatenate([[0], np.cumsum(self.meta["shard_instances"], dtype=np.int64)])
        self._open: dict[int, dict[str, np.ndarray]] = {}

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getstate__(self) -> dict:      # data-loader workers / spawn: reopen the memmaps, never copy
        state = dict(self.__dict__)
        state["_open"] = {}
        return state

    def _shard(self, s: int) -> dict[str, np.ndarray]:
        arrays = self._open.get(s)
        if arrays is None:
            names = ARRAYS + (STATIC_ARRAYS if self.static else ())
            arrays = {k: _load_array(self.shard_paths[s] / f"{k}.npy") for k in names}
            self._open[s] = arrays
        return arrays

    def __getitem__(self, i: int) -> dict:
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"instance {i} out of range ({len(self)} instances)")
        s = int(np.searchsorted(self._starts, i, side="right") - 1)
        a, j = self._shard(s), i - int(self._starts[s])
        lo, hi = int(a["offsets"][j]), int(a["offsets"][j + 1])
        ids = np.asarray(a["input_ids"][lo:hi], dtype=np.int64)
        types = np.zeros(hi - lo, dtype=np.int64)
        types[int(a["b_start"][j]):] = 1
        out = {"index": i, "input_ids": ids, "token_type_ids": types, "nsp_label": int(a["nsp_labels"][j])}
        if self.static:
            mlo, mhi = int(a["masked_lm_offsets"][j]), int(a["masked_lm_offsets"][j + 1])
            out["masked_lm_positions"] = np.asarray(a["masked_lm_positions"][mlo:mhi], dtype=np.int64)
            out["masked_lm_ids"] = np.asarray(a["masked_lm_ids"][mlo:mhi], dtype=np.int64)
        return out

    def lengths(self) -> np.ndarray:
        """Length of every instance (int64, from the offsets only)."""
        return np.concatenate([np.diff(np.asarray(self._shard(s)["offsets"])) for s in range(len(self.shard_paths))]) \
            if self.shard_paths else np.zeros(0, dtype=np.int64)

    def token_info(self):
        """Ids the masker needs, from the tokenizer saved with the data (falls back on meta.json)."""
        vocab = self.path / "tokenizer" / "vocab.txt"
        if vocab.is_file():
            tokens = vocab.read_text(encoding="utf-8").split("\n")
            return TokenInfo.from_vocab({t: i for i, t in enumerate(tokens[:self.meta["vocab_size"]])})
        return TokenInfo.of(self.meta)

    def tokenizer(self):
        """The bertkit Tokenizer the data was made with."""
        return Tokenizer.from_dir(self.path / "tokenizer")


def open_dataset(path: str | Path) -> PretrainingData:
    """Open a folder written by `bertkit prepare` (meta.json + shards) without copying it."""
    return PretrainingData(path)


def eval_split(ds: PretrainingData) -> PretrainingData | None:
    """The held-out documents `prepare` split off from `ds` (None when it made no split), checked
    to be that split: same tokenizer, and the configuration the parent's meta.json recorded."""
    info = ds.meta.get("eval")
    if not info:
        return None
    path = ds.path / info.get("path", "eval")
    held = PretrainingData(path)
    if held.meta.get("tokenizer_hash") != ds.meta.get("tokenizer_hash") or \
            held.meta.get("config_hash") != info.get("config_hash"):
        raise DataError(f"{path}: not the held-out split recorded in {ds.path}/meta.json (another tokenizer or "
                        "configuration); rerun the prepare command")
    return held
