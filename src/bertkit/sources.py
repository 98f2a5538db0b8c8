"""Data that is not a plain text file: dataset names and tables on disk.

Fine-tuning (`bertkit.tasks.tables`) and pre-training text (`bertkit.data.text`) both accept:

* a dataset name, spelled as the three arguments of ``datasets.load_dataset(NAME, CONFIG,
  split=SPLIT)`` joined by colons: ``NAME[:CONFIG[:SPLIT]]``::

      nyu-mll/glue:sst2:train        load_dataset("nyu-mll/glue", "sst2", split="train")
      nyu-mll/glue:sst2              both splits a command needs (train / validation)
      rajpurkar/squad::validation    load_dataset("rajpurkar/squad", split="validation")
      nyu-mll/glue:sst2:train[:1000] a slice, in the library's own split syntax

  It needs the optional `datasets` library (``pip install 'bertkit[datasets]'``); without it
  the error is a one-line hint. A string that names an existing file or folder is always that
  file or folder, as in `load_dataset`.
* Parquet (``.parquet``), Arrow (``.arrow`` / ``.feather``: IPC file or stream, as the
  `datasets` cache writes them), JSON Lines (``.jsonl``, ``.json``) and CSV (``.csv``) files,
  plain or ``.gz`` for the text formats, and folders written by ``Dataset.save_to_disk``.

`open_table(source)` gives the rows of one split as dicts, plus the class names of
``ClassLabel`` columns (read from the dataset's features, or from the ``huggingface`` schema
metadata that `datasets` writes into Parquet and Arrow files). `table_documents` reads one
text column as pre-training documents: a row is a document, its lines are its sentences.
"""
from __future__ import annotations

import csv
import glob
import gzip
import io
import json
import logging
import os
import re
import socket
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import urlparse

from .errors import BertkitError, DataError, first_line

ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
TABLE_SUFFIXES = (".parquet", *ARROW_SUFFIXES, ".jsonl", ".jsonl.gz", ".json", ".json.gz", ".csv", ".csv.gz")
"""File names read as tables (for pre-training text, and for tasks whose own format differs)."""
HINT = "pip install 'bertkit[datasets]'"
_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_FILE_LIKE = re.compile(r"\.(txt|gz|tsv|csv|jsonl?|parquet|arrow|feather|ipc|conll|zip|bz2|xz)$", re.I)


class SourceError(BertkitError):
    """A dataset name or table that cannot be read; the message names it."""


# ---- dataset names -----------------------------------------------------------------------------
@dataclass(frozen=True)
class DatasetName:
    """``NAME[:CONFIG[:SPLIT]]``: the arguments of ``datasets.load_dataset``."""
    path: str
    config: str | None = None
    split: str | None = None

    def __str__(self) -> str:
        s = self.path
        if self.config or self.split:
            s += ":" + (self.config or "")
        if self.split:
            s += ":" + self.split
        return s

    def with_split(self, split: str) -> "DatasetName":
        return DatasetName(self.path, self.config, split)


def dataset_name(text: str | Path) -> DatasetName | None:
    """The dataset `text` names, or None when it is (or looks like) a local path.

    Local: an existing file or folder; an absolute, ``./``, ``../`` or ``~`` path; a glob; a
    name ending like a file (``.tsv``, ``.parquet``, ...); a path whose first folder exists here."""
    s = str(text)
    if not s or Path(s).exists() or s.startswith(("/", ".", "~")) or any(c in s for c in "*?\\"):
        return None
    head, _, rest = s.partition(":")
    if not _NAME.match(head) or _FILE_LIKE.search(head):
        return None
    if "/" in head and Path(head.split("/", 1)[0]).is_dir():
        return None                       # runs/mrpc with runs/ here: a missing local path, not a dataset
    config, _, split = rest.partition(":")
    return DatasetName(head, config or None, split or None)


def load_split(name: DatasetName, default_split: str | None = None):
    """``datasets.load_dataset(name.path, name.config, split=...)``; errors are one line."""
    try:
        import datasets
    except ImportError:
        raise SourceError(f"{name}: no such file or folder; to read it as a dataset name (NAME:CONFIG:SPLIT, "
                          f"as datasets.load_dataset spells it) install the datasets library: {HINT}") from None
    split = name.split or default_split
    if split is None:
        raise SourceError(f"{name}: name a split, e.g. {name.path}:{name.config or ''}:train")
    host = _unreachable_hub(datasets, name)
    if host:
        raise SourceError(f"{name.with_split(split)}: not a local file or folder, and as a dataset name it needs "
                          f"the Hub ({host}), which this machine cannot reach (no copy cached here)")
    quiet = [logging.getLogger(n) for n in ("huggingface_hub", "datasets")]
    levels = [q.level for q in quiet]
    for q in quiet:                            # the hub's retry warnings: the one line below says what failed
        q.setLevel(logging.ERROR)
    try:
        ds = datasets.load_dataset(name.path, name.config, split=split)
    except Exception as e:                     # noqa: BLE001 - the library raises many kinds; one line each
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SourceError(f"{name.with_split(split)}: not a local file or folder, and datasets.load_dataset "
                          f"could not load it: {first}") from None
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    return ds


def _unreachable_hub(datasets, name: DatasetName) -> str | None:
    """The Hub's host when it does not resolve and nothing of `name` is cached here: then
    load_dataset would spend ~25 s on retries to fail (a mistyped local folder usually); None when
    it may work (offline mode, a cached copy, a host that resolves)."""
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        HF_HUB_CACHE = str(Path.home() / ".cache" / "huggingface" / "hub")
    if any(os.environ.get(k, "0") not in ("", "0") for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return None
    caches = [Path(datasets.config.HF_DATASETS_CACHE) / name.path.replace("/", "___"),
              Path(HF_HUB_CACHE) / f"datasets--{name.path.replace('/', '--')}"]
    if any(p.exists() for p in caches):
        return None
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return host
    return None


# ---- tables --------------------------------------------------------------------------------------
def is_table_file(path: str | Path) -> bool:
    return str(path).lower().endswith(TABLE_SUFFIXES)


def is_saved_dataset(path: str | Path) -> bool:
    """A folder written by ``Dataset.save_to_disk`` (one split)."""
    p = Path(path)
    return p.is_dir() and (p / "state.json").is_file()


@dataclass
class Table:
    """The rows of one split. `label_names`: class names of ClassLabel columns (also lists of them)."""
    name: str
    columns: list[str]
    label_names: dict[str, list[str]]
    _batches: Callable[[list[str] | None], Iterator[list[dict]]]
    num_rows: int | None = None

    def batches(self, columns: list[str] | None = None) -> Iterator[list[dict]]:
        """Lists of row dicts (only `columns`, when given)."""
        return self._batches(columns)

    def rows(self) -> Iterator[tuple[str, dict]]:
        """(where, row) for each row; `where` is ``row N`` (0-based, as the library numbers them)."""
        for n, row in enumerate(chain.from_iterable(self._batches(None))):
            yield f"row {n}", row


def open_table(source: str | Path, default_split: str | None = None) -> Table:
    """A dataset name, a save_to_disk folder, or Parquet / Arrow / JSONL / CSV file(s) (a glob works)."""
    s = str(source)
    name = dataset_name(s)
    if name is not None:
        return _dataset_table(load_split(name, default_split), str(name.with_split(name.split or default_split or "")))
    p = Path(s)
    if p.is_dir():
        if is_saved_dataset(p):
            return _saved_table(p)
        if (p / "dataset_dict.json").is_file():
            splits = json.loads((p / "dataset_dict.json").read_text(encoding="utf-8")).get("splits", [])
            raise SourceError(f"{p}: a DatasetDict folder; name one split: {', '.join(str(p / x) for x in splits)}")
        raise SourceError(f"{p}: a folder, not a table (expected .parquet, .arrow, .jsonl or .csv files, "
                          f"or a save_to_disk folder)")
    files = sorted(Path(f) for f in glob.glob(s)) if any(c in s for c in "*?[") else [p]
    if not files:
        raise SourceError(f"{s}: no file matches this pattern")
    for f in files:
        if not f.is_file():
            raise SourceError(f"{f}: no such file" if not f.exists() else f"{f}: not a file")
    kinds = {_kind(f) for f in files}
    if len(kinds) > 1:
        raise SourceError(f"{s}: mixes file types ({', '.join(sorted(kinds))}); give one kind at a time")
    kind = kinds.pop()
    if kind == "parquet":
        return _parquet_table(files, s)
    if kind == "arrow":
        return _arrow_table(files, s)
    return _text_table(files, kind, s)


_KINDS = {".parquet": "parquet", **dict.fromkeys(ARROW_SUFFIXES, "arrow"), ".jsonl": "jsonl", ".json": "jsonl",
          ".csv": "csv", ".tsv": "tsv"}


def _kind(f: Path) -> str:
    n = f.name.lower().removesuffix(".gz")
    for suffix, kind in _KINDS.items():
        if n.endswith(suffix):
            return kind
    raise SourceError(f"{f}: not a table file (expected .parquet, .arrow, .feather, .jsonl, .json or .csv)")


def _pyarrow(what: str):
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise SourceError(f"{what}: reading Parquet and Arrow files needs pyarrow: {HINT} (or pip install "
                          f"pyarrow)") from None
    return pyarrow


def _names_from_features(features: dict) -> dict[str, list[str]]:
    """ClassLabel names from `datasets`' features JSON ({col: {"_type": "ClassLabel", "names": ...}})."""
    out = {}
    for col, feat in (features or {}).items():
        if not isinstance(feat, dict):
            continue
        if feat.get("_type") == "ClassLabel" and "names" in feat:
            out[col] = list(feat["names"])
        elif isinstance(feat.get("feature"), dict) and feat["feature"].get("_type") == "ClassLabel":
            out[col] = list(feat["feature"].get("names", []))
    return out


def _names_from_schema(schema) -> dict[str, list[str]]:
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return {}
    try:
        return _names_from_features(json.loads(raw).get("info", {}).get("features", {}))
    except (ValueError, AttributeError):
        return {}


def _dataset_table(ds, name: str) -> Table:
    names = {}
    for col, feat in ds.features.items():
        label = feat if type(feat).__name__ == "ClassLabel" else getattr(feat, "feature", None)
        if type(label).__name__ == "ClassLabel":
            names[col] = list(label.names)

    def batches(columns):
        part = ds.select_columns(columns) if columns else ds
        for b in part.iter(batch_size=1000):
            keys = list(b)
            yield [dict(zip(keys, vals)) for vals in zip(*(b[k] for k in keys))]
    return Table(name, list(ds.column_names), names, batches, len(ds))


def _parquet_table(files: list[Path], name: str) -> Table:
    pa = _pyarrow(name)
    try:
        pfs = [pa.parquet.ParquetFile(f) for f in files]
    except (pa.ArrowInvalid, OSError) as e:
        raise SourceError(f"{name}: not a readable Parquet file ({first_line(e)})") from None
    schema = pfs[0].schema_arrow

    def batches(columns):
        for f, pf in zip(files, pfs):
            try:
                for b in pf.iter_batches(batch_size=1000, columns=columns):
                    yield b.to_pylist()
            except (pa.ArrowInvalid, OSError) as e:
                raise SourceError(f"{f}: cannot read ({first_line(e)})") from None
    return Table(name, list(schema.names), _names_from_schema(schema), batches,
                 sum(pf.metadata.num_rows for pf in pfs))


def _arrow_reader(f: Path):
    """(schema, record batches) of an Arrow IPC file or stream."""
    pa = _pyarrow(str(f))
    source = pa.memory_map(str(f))
    try:
        reader = pa.ipc.open_file(source)
        return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))
    except pa.ArrowInvalid:
        source.seek(0)
        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid as e:
            raise SourceError(f"{f}: not an Arrow IPC file or stream ({first_line(e)})") from None
        return reader.schema, reader


def _arrow_table(files: list[Path], name: str, names: dict | None = None) -> Table:
    schema = _arrow_reader(files[0])[0]

    def batches(columns):
        for f in files:
            for b in _arrow_reader(f)[1]:
                yield (b.select(columns) if columns else b).to_pylist()
    return Table(name, list(schema.names), names if names is not None else _names_from_schema(schema), batches)


def saved_dataset_files(p: Path) -> list[Path]:
    state = json.loads((p / "state.json").read_text(encoding="utf-8"))
    files = [p / d["filename"] for d in state.get("_data_files", [])]
    if not files:
        raise SourceError(f"{p}: state.json lists no data files")
    return files


def _saved_table(p: Path) -> Table:
    files = saved_dataset_files(p)
    info = p / "dataset_info.json"
    names = (_names_from_features(json.loads(info.read_text(encoding="utf-8")).get("features", {}))
             if info.is_file() else None)
    return _arrow_table(files, str(p), names)


def open_text(path: str | Path) -> io.TextIOBase:
    """Open a plain or .gz text file as UTF-8; a leading byte-order mark is dropped."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _text_rows(f: Path, kind: str) -> Iterator[dict]:
    with open_text(f) as fh:
        if kind == "jsonl":
            first = fh.read(1)
            while first and first.isspace():
                first = fh.read(1)
            if first == "[":                       # a JSON array of objects
                for k, obj in enumerate(parse_json(first + fh.read(), f, SourceError)):
                    if not isinstance(obj, dict):
                        raise SourceError(f"{f}: item {k} of the array is not an object")
                    yield obj
                return
            yield from (obj for _, obj in jsonl_objects(chain([first + fh.readline()], fh), f, error=SourceError))
            return
        reader = csv.DictReader(fh, delimiter="\t" if kind == "tsv" else ",")
        for row in reader:
            if None in row or any(v is None for v in row.values()):
                raise SourceError(f"{f}:{reader.line_num}: expected {len(reader.fieldnames or [])} columns "
                                  f"({', '.join(reader.fieldnames or [])})")
            yield row


def parse_json(text: str, where: str | Path, error: type[BertkitError] = DataError) -> Any:
    """`json.loads(text)`; text that is not JSON is one `error` naming `where` (and the line)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{where}:{e.lineno}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise error(f"{where}: not valid JSON (nested too deeply)") from None


def read_json_object(path: Path, error: type[BertkitError] = DataError) -> dict:
    """The JSON object in the file `path`; anything else is one `error` naming the file."""
    try:
        obj = parse_json(path.read_text(encoding="utf-8-sig"), path, error)
    except UnicodeDecodeError as e:
        raise error(f"{path}: not valid UTF-8 (byte {e.start})") from None
    if not isinstance(obj, dict):
        raise error(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def jsonl_objects(lines: Iterable[str], where: str | Path, bad: Callable[[int, str], None] | None = None,
                  error: type[BertkitError] = DataError) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of JSON Lines. A line that is not a JSON object is
    one error naming `where` and the line, or, given `bad`, reported as `bad(line number, message)`
    and skipped (unless `bad` raises)."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            message = f"not valid JSON ({getattr(e, 'msg', 'nested too deeply')})"
        else:
            if isinstance(obj, dict):
                yield lineno, obj
                continue
            message = "expected a JSON object"
        if bad is None:
            raise error(f"{where}:{lineno}: {message}")
        bad(lineno, message)


def read_jsonl(path: str | Path) -> list[dict]:
    """The objects of a JSON Lines file such as a run's metrics.jsonl ([] where there is no file yet)."""
    path = Path(path)
    if not path.is_file():
        return []
    with path.open(encoding="utf-8") as f:
        return [obj for _, obj in jsonl_objects(f, path)]


def _text_table(files: list[Path], kind: str, name: str) -> Table:
    def batches(columns):
        for f in files:
            batch = []
            for row in _text_rows(f, kind):
                batch.append({c: row.get(c) for c in columns} if columns else row)
                if len(batch) == 1000:
                    yield batch
                    batch = []
            if batch:
                yield batch
    first = next(iter(_text_rows(files[0], kind)), None)
    return Table(name, list(first) if first else [], {}, batches)


# ---- pre-training text ---------------------------------------------------------------------------
TEXT_COLUMNS = ("text", "content", "document", "sentence")


def text_column(table: Table) -> str:
    """The column holding the text: 'text' (or content / document / sentence), else the only string column."""
    for c in TEXT_COLUMNS:
        if c in table.columns:
            return c
    sample = next(table.batches(), [])
    strings = [c for c in table.columns if sample and all(isinstance(r.get(c), str) for r in sample[:20])]
    if len(strings) == 1:
        return strings[0]
    raise SourceError(f"{table.name}: which column is the text? no column is called 'text' and "
                      f"{'several hold strings: ' + ', '.join(strings) if strings else 'none holds strings'} "
                      f"(rename one, e.g. ds.rename_column('body', 'text').to_parquet('corpus.parquet'))")


def text_source_files(p: str) -> list[Path] | None:
    """Pre-training input that is not plain text: the files that hold it, or None for ordinary paths.

    A dataset name -> the Arrow files of its split in the `datasets` cache (split 'train' unless
    named); a save_to_disk folder -> its Arrow files; a folder without .txt files -> its tables."""
    name = dataset_name(p)
    if name is not None:
        if name.split and "[" in name.split:
            raise SourceError(f"{name}: a slice of a split cannot be pre-training input (the corpus is read from "
                              f"the library's cache files); save the slice first: ds.to_parquet('part.parquet')")
        files = [Path(d["filename"]) for d in load_split(name, "train").cache_files]
        if not files:
            raise SourceError(f"{name}: the dataset is held in memory, not in cache files; save it first: "
                              f"ds.to_parquet('corpus.parquet')")
        return files
    path = Path(p)
    if path.is_dir():
        if is_saved_dataset(path):
            return saved_dataset_files(path)
        if not any(path.rglob("*.txt")) and not any(path.rglob("*.txt.gz")):
            found = sorted(f for f in path.rglob("*") if f.is_file() and is_table_file(f)
                           and f.name not in ("state.json", "dataset_info.json", "dataset_dict.json"))
            return found or None
    return None


def table_documents(f: Path, counts, *, split: Callable[[str], list[str]] | None = None,
                    progress: Callable[[int], None] | None = None) -> Iterator[list[str]]:
    """Documents of one table file: each row's text column, its non-empty lines as sentences
    (each split further by `split`, e.g. `bertkit.data.text.split_sentences`). `counts` is a
    `bertkit.data.text.TextCounts`."""
    table = open_table(f)
    col = text_column(table)
    size = f.stat().st_size if f.is_file() else 0
    total, done, reported = table.num_rows, 0, 0
    counts.files += 1
    before = counts.documents
    for batch in table.batches([col]):
        for row in batch:
            text = row.get(col)
            if not isinstance(text, str):
                continue
            lines = [ln.strip() for ln in text.split("\n")]
            counts.lines += len(lines)
            counts.bytes += len(text.encode("utf-8", "surrogatepass"))
            doc = [s for ln in lines if ln for s in (split(ln) if split else [ln])]
            if doc:
                counts.sentences += len(doc)
                counts.documents += 1
                yield doc
        done += len(batch)
        if progress is not None and total:
            now = int(size * min(done / total, 1.0))
            progress(now - reported)
            reported = now
    if progress is not None and size > reported:
        progress(size - reported)
    if counts.documents == before:
        counts.empty_files += 1


def table_lines(f: Path, batch: int = 1000) -> Iterator[list[str]]:
    """Batches of text lines of a table file's text column (tokenizer training)."""
    table = open_table(f)
    col = text_column(table)
    buf: list[str] = []
    for rows in table.batches([col]):
        for row in rows:
            text = row.get(col)
            if isinstance(text, str):
                buf.extend(ln for ln in text.split("\n") if ln.strip())
            if len(buf) >= batch:
                yield buf
                buf = []
    if buf:
        yield buf


__all__ = ["DatasetName", "dataset_name", "load_split", "open_table", "Table", "is_table_file", "is_saved_dataset",
           "text_column", "text_source_files", "table_documents", "table_lines", "SourceError", "HINT"]
