"""The grid's shared inputs, made once and cached in OUT/shared: the document-level split of the corpus
(train.txt + heldout.txt), one WordPiece vocabulary, the prepared data of each distinct prepare setting."""
from __future__ import annotations

import gzip
import hashlib
import itertools
import logging
import os
import shutil
from pathlib import Path

from ..data.prepare import PrepareConfig, prepare as run_prepare
from ..errors import BertkitError
from ..outdir import write_whole
from ..runconfig import from_dict
from ..tokenizer import Tokenizer
from .config import AblateConfig, _key, _read_json, _write_json, flatten

log = logging.getLogger("bertkit")

# ---- shared inputs: split, tokenizer, prepared data ---------------------------------------------
class Shared:
    """The grid's shared inputs, made on first use and cached in OUT/shared (atomic renames)."""

    def __init__(self, cfg: AblateConfig):
        self.cfg = cfg
        self.root = Path(cfg.out) / "shared"
        self.data_dir = Path(cfg.data_dir)
        self._tokenizer = None
        self._split: dict | None = None

    def split(self) -> dict:
        """Training and held-out documents (held out: the eval_documents with the smallest seeded
        hash of their text, so the choice does not depend on file order)."""
        if self._split is not None:
            return self._split
        d = self.root / "corpus"
        files = [self._path(f) for f in self.cfg.corpus]
        key = _key({"files": [(str(f), f.stat().st_size) for f in files], "eval": self.cfg.eval_documents,
                    "seed": self.cfg.split_seed})
        info = _read_json(d / "split.json")
        if not (info and info.get("key") == key):
            docs = [doc for f in files for doc in read_documents(f)]
            if len(docs) < self.cfg.eval_documents + 2:
                raise BertkitError(f"corpus: {len(docs)} documents, fewer than eval_documents + 2")
            ranked = sorted(range(len(docs)), key=lambda i: doc_hash(docs[i], self.cfg.split_seed))
            held = set(ranked[:self.cfg.eval_documents])
            tmp = self.root / f".corpus.{os.getpid()}.tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            train = [doc for i, doc in enumerate(docs) if i not in held]
            _write_docs(tmp / "train.txt", train)
            _write_docs(tmp / "heldout.txt", [docs[i] for i in sorted(held)])
            info = {"key": key, "files": [str(f) for f in files], "documents": len(docs),
                    "train_documents": len(train), "heldout_documents": len(held)}
            _write_json(tmp / "split.json", info)
            _install(tmp, d, key, "split.json")
            info = _read_json(d / "split.json")
        self._split = info
        return info

    def train_text(self, fraction: float) -> Path:
        """train.txt, or a nested random subset of its documents (fraction < 1)."""
        self.split()
        full = self.root / "corpus" / "train.txt"
        if fraction >= 1:
            return full
        path = self.root / "corpus" / f"train-{fraction:g}.txt"
        if not path.is_file():
            docs = [d for d in read_documents(full) if doc_hash(d, self.cfg.split_seed + 1) / 2 ** 64 < fraction]
            if len(docs) < 2:
                raise BertkitError(f"corpus_fraction {fraction:g} leaves {len(docs)} documents")
            _write_docs(path, docs)
        return path

    def tokenizer(self):
        if self._tokenizer is not None:
            return self._tokenizer
        split = self.split()
        d = self.root / "tokenizer"
        opts = {"vocab_size": 8000, **self.cfg.tokenizer}
        key = _key({"split": split["key"], **opts})
        if (_read_json(d / "ablate_key.json") or {}).get("key") != key:
            log.info("ablate: training the shared WordPiece vocabulary (%s) on %d documents", opts,
                     split["train_documents"])
            try:
                tok = Tokenizer.train([str(self.root / "corpus" / "train.txt")], **opts)
            except TypeError as e:
                raise BertkitError(f"{self.cfg.source}: tokenizer: {e}") from None
            tmp = self.root / f".tokenizer.{os.getpid()}.tmp"
            tok.save(tmp)
            _write_json(tmp / "ablate_key.json", {"key": key, **opts})
            _install(tmp, d, key)
        self._tokenizer = Tokenizer.from_dir(d)       # whoever renamed first, everyone uses that one
        return self._tokenizer

    def prepared(self, prepare: dict, fraction: float = 1.0) -> tuple[Path, Path, dict]:
        """(train data, held-out data, key info) prepared with these PrepareConfig keys."""
        tok = self.tokenizer()
        # the grid holds out its own documents (see split)
        pcfg = from_dict(PrepareConfig, {**prepare, "eval_documents": 0}, "prepare")
        info = {"prepare": pcfg.to_dict(), "fraction": fraction, "split": self.split()["key"],
                "tokenizer": tok.fingerprint()}
        key = _key(info)
        d = self.root / "data" / key
        if (_read_json(d / "ablate_key.json") or {}).get("key") != key:
            log.info("ablate: preparing data %s (%s)", key,
                     ", ".join(f"{k}={v}" for k, v in flatten(prepare).items()) or "the base settings")
            tmp = self.root / "data" / f".{key}.{os.getpid()}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            text = self.train_text(fraction)
            meta = run_prepare([str(text)], tok, tmp / "train", pcfg, progress=False, command="bertkit ablate")
            held = run_prepare([str(self.root / "corpus" / "heldout.txt")], tok, tmp / "heldout", pcfg,
                               progress=False, command="bertkit ablate")
            _write_json(tmp / "ablate_key.json", {"key": key, **info, "train_tokens": meta["counts"]["tokens"],
                                                  "train_instances": meta["counts"]["instances"],
                                                  "heldout_instances": held["counts"]["instances"]})
            _install(tmp, d, key)
        return d / "train", d / "heldout", _read_json(d / "ablate_key.json")

    def _path(self, name: str) -> Path:
        p = self.data_dir / name                      # an absolute path stays as it is
        if not p.exists():
            raise BertkitError(f"{self.cfg.source}: {p}: no such file (data_dir {self.cfg.data_dir}; "
                               f"set data_dir in the config or --data-dir)")
        return p


def _install(tmp: Path, final: Path, key: str, marker: str = "ablate_key.json") -> None:
    """Rename a finished folder into place. If another process installed the same thing meanwhile,
    keep theirs (it may be in use); a stale entry (another key) is replaced."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if (_read_json(final / marker) or {}).get("key") == key:
        shutil.rmtree(tmp, ignore_errors=True)
        return
    if final.exists():
        old = final.with_name(f".{final.name}.old.{os.getpid()}")
        os.replace(final, old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.replace(tmp, final)
    except OSError:                                # another process installed it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)


def read_documents(path: Path) -> list[list[str]]:
    """Documents (lists of lines) of a text file, plain or .gz, blank lines between documents."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        lines = (line.strip() for line in f)
        return [list(doc) for nonblank, doc in itertools.groupby(lines, key=bool) if nonblank]   # non-blank runs


def _write_docs(path: Path, docs: list[list[str]]) -> None:
    write_whole(path, "\n\n".join("\n".join(d) for d in docs) + "\n")


def doc_hash(doc: list[str], seed: int) -> int:
    h = hashlib.blake2b("\n".join(doc).encode("utf-8"), digest_size=8, key=f"ablate-{seed}".encode())
    return int.from_bytes(h.digest(), "big")
