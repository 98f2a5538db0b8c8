"""Raw text in: files, globs and folders -> documents -> chunks of documents.

Input format (google-research/bert's): UTF-8, one sentence per line, a blank line between
documents. With `sentence_split`, each line is a paragraph and is split into sentences here.
The end of a file also ends a document (Google's reader would run a document across files).

Every oddity is counted in `TextCounts` (written to meta.json), never dropped silently:
invalid UTF-8 (replaced by U+FFFD, or an error naming file:line with `strict`), lines longer
than `max_line_bytes` (cut at a space into several sentences), empty files, and documents longer
than `max_document_bytes` (cut into several documents, so memory stays bounded by a chunk).

Chunks are the unit of work and of output (one shard each): consecutive documents of at least
`chunk_bytes` of text and at least two documents. They depend only on the input and
`chunk_bytes`, never on the number of workers, which is what makes the output byte-identical.
"""
from __future__ import annotations

import glob
import gzip
import logging
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..errors import BertkitError
from ..sources import is_table_file, table_documents, text_source_files

log = logging.getLogger("bertkit")

SUFFIXES = (".txt", ".txt.gz")


class InputError(BertkitError):
    """A bad input path or file; the message names it."""


@dataclass
class TextCounts:
    files: int = 0
    empty_files: int = 0
    bytes: int = 0
    lines: int = 0
    documents: int = 0
    sentences: int = 0
    invalid_utf8_lines: int = 0
    long_lines_split: int = 0
    long_documents_split: int = 0

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def expand_inputs(paths: Iterable[str]) -> list[Path]:
    """Files named by paths, globs (`**` allowed) and folders (every .txt / .txt.gz inside, sorted)."""
    files: list[Path] = []
    for p in paths:
        path = Path(p)
        tables = text_source_files(p)          # a dataset name, save_to_disk folder or folder of tables
        if tables is not None:
            files += tables
        elif any(c in p for c in "*?["):
            found = sorted(Path(f) for f in glob.glob(p, recursive=True) if Path(f).is_file())
            if not found:
                raise InputError(f"{p}: no file matches this pattern")
            files += found
        elif path.is_dir():
            found = sorted(f for f in path.rglob("*") if f.is_file() and f.name.endswith(SUFFIXES))
            if not found:
                raise InputError(f"{p}: folder has no .txt or .txt.gz files")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"{p}: no such file or folder")
    unique: dict[Path, Path] = {}                # the first spelling of each file
    for f in files:
        unique.setdefault(f.resolve(), f)
    return list(unique.values())


_SENT_END = re.compile(r"""([.!?]["')\]]*)\s+(?=["'(\[]?[A-Z0-9])""")
_ABBREV = {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "no", "fig", "gen",
           "col", "lt", "sgt", "capt", "gov", "sen", "rep", "inc", "ltd", "co", "corp", "mt", "jan", "feb",
           "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "u.s", "u.k", "ca", "approx"}


def split_sentences(paragraph: str) -> list[str]:
    """A rule-based splitter: end at . ! ? (plus closing quotes/brackets) followed by space and a
    capital, digit or opening quote; not after common abbreviations or single-letter initials."""
    out, start = [], 0
    for m in _SENT_END.finditer(paragraph):
        head = paragraph[start:m.end(1)].rstrip("\"')]")
        word = head.rsplit(None, 1)[-1] if head.split() else ""
        stem = word.rstrip(".!?").lower()
        if word.endswith(".") and (stem in _ABBREV or (len(stem) == 1 and stem.isalpha())):
            continue
        out.append(paragraph[start:m.end(1)].strip())
        start = m.end()
    out.append(paragraph[start:].strip())
    return [s for s in out if s]


def _cut(line: bytes, limit: int) -> tuple[list[bytes], bytes]:
    """(pieces, rest of at most `limit` bytes) of a too-long line, cut at spaces, else at UTF-8 character boundaries."""
    pieces = []
    while len(line) > limit:
        cut = line.rfind(b" ", 0, limit)
        if cut <= 0:
            cut = limit
            while cut > 0 and (line[cut] & 0xC0) == 0x80:
                cut -= 1
        pieces.append(line[:cut])
        line = line[cut:].lstrip(b" ")
    return pieces, line


def _decode(body: bytes, name: Path, first_line: int, counts: TextCounts, strict: bool) -> list[str]:
    try:
        return body.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        pass
    lines = []
    for k, raw in enumerate(body.split(b"\n")):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            if strict:
                raise InputError(f"{name}:{first_line + k}: invalid UTF-8 at byte {e.start} (drop --strict "
                                 "to replace it)") from None
            counts.invalid_utf8_lines += 1
            lines.append(raw.decode("utf-8", errors="replace"))
    return lines


def _read_lines(fh, name: Path, limit: int, counts: TextCounts, strict: bool, block: int = 1 << 20
                ) -> Iterator[list[str]]:
    """Decoded lines, a block at a time. A line over `limit` bytes comes out in pieces cut at a
    space (counted once per line); memory stays bounded by the block even for a 1 GB line."""
    carry, lineno, in_long = b"", 1, False
    while True:
        data = fh.read(block)
        buf = carry + data if carry else data
        if not data:
            if buf:
                counts.bytes += len(buf)
                yield _decode(buf, name, lineno, counts, strict)
            return
        cut = buf.rfind(b"\n")
        if cut < 0:                                     # inside one long line
            n0 = len(buf)
            pieces, buf = _cut(buf, limit)
            if pieces:
                counts.bytes += n0 - len(buf)
                counts.long_lines_split += not in_long
                in_long = True
                yield _decode(b"\n".join(pieces), name, lineno, counts, strict)
            carry = buf
            continue
        body, carry = buf[:cut], buf[cut + 1:]
        counts.bytes += len(body) + 1
        lines = _decode(body, name, lineno, counts, strict)
        lineno += len(lines)
        if max(map(len, lines)) > limit:                # long lines (in characters: at most as many bytes)
            out = []
            for k, line in enumerate(lines):
                b = line.encode("utf-8")
                if len(b) <= limit:
                    out.append(line)
                    continue
                counts.long_lines_split += not (k == 0 and in_long)     # (the end of a line counted before)
                pieces, rest = _cut(b, limit)
                out.extend(x.decode("utf-8", errors="replace") for x in (*pieces, rest))
            lines = out
        in_long = False
        yield lines


def read_documents(files: list[Path], counts: TextCounts, *, sentence_split: bool = False, strict: bool = False,
                   max_line_bytes: int = 65536, max_document_bytes: int = 32 << 20,
                   progress: Callable[[int], None] | None = None, warn: bool = True) -> Iterator[list[str]]:
    """Yield documents (lists of sentence strings) from the files, in order (`warn`: log empty files)."""
    for f in files:
        if is_table_file(f):                   # Parquet / Arrow / JSONL / CSV: a row is a document
            yield from table_documents(f, counts, split=split_sentences if sentence_split else None,
                                       progress=progress)
            continue
        counts.files += 1
        before = counts.sentences
        with open(f, "rb") as raw:
            fh = gzip.GzipFile(fileobj=raw) if f.name.endswith(".gz") else raw
            doc: list[str] = []
            doc_bytes, pos = 0, 0
            try:
                for lines in _read_lines(fh, f, max_line_bytes, counts, strict):
                    counts.lines += len(lines)
                    for line in lines:
                        text = line.strip()
                        if not text:
                            if doc:
                                counts.documents += 1
                                yield doc
                            doc, doc_bytes = [], 0
                            continue
                        if sentence_split:
                            sents = split_sentences(text)
                            doc.extend(sents)
                            counts.sentences += len(sents)
                        else:
                            doc.append(text)
                            counts.sentences += 1
                        doc_bytes += len(line)
                        if doc_bytes > max_document_bytes:
                            counts.long_documents_split += 1
                            counts.documents += 1
                            yield doc
                            doc, doc_bytes = [], 0
                    if progress is not None:
                        now = raw.tell()
                        progress(now - pos)
                        pos = now
            except (OSError, EOFError) as e:
                raise InputError(f"{f}: cannot read ({e})") from None
            if doc:
                counts.documents += 1
                yield doc
        if counts.sentences == before:
            counts.empty_files += 1
            if warn:
                log.warning("%s: no text (empty file)", f)


class Chunker:
    """Documents grouped into chunks of >= chunk_bytes of text and >= 2 documents, one document at a
    time: `add(doc)` returns a finished chunk or None, `finish()` the last ones (a last chunk of a
    single document is merged into the one before). Two of them split one stream of documents into
    two streams of chunks."""

    def __init__(self, chunk_bytes: int):
        self.chunk_bytes = chunk_bytes
        self.pending: list[list[str]] | None = None      # a full chunk, held back in case the last is short
        self.cur: list[list[str]] = []
        self.size = 0

    def add(self, doc: list[str]) -> list[list[str]] | None:
        self.cur.append(doc)
        self.size += sum(len(s) for s in doc)
        if self.size >= self.chunk_bytes and len(self.cur) >= 2:
            done, self.pending = self.pending, self.cur
            self.cur, self.size = [], 0
            return done
        return None

    def finish(self) -> list[list[list[str]]]:
        """The chunks still held (the last chunk absorbs a final lone document)."""
        out = [c for c in (self.pending, self.cur) if c]
        if len(out) == 2 and len(self.cur) < 2:
            out = [out[0] + out[1]]
        self.pending, self.cur, self.size = None, [], 0
        return out
