"""Rebuild src/bertkit/sample/gutenberg.txt.gz from shared/data/pretrain/gutenberg_books.txt.gz.

The 11 public-domain Project Gutenberg books of NLTK's selection (one sentence per line, one book
per document) cut into passages of about 150 sentence lines, each passage a document, so held-out
*documents* can be whole passages from every book and NSP pairs never cross a passage boundary.
A passage starts at a chapter/act heading when one falls in its last 50 lines. gzip without a file
name and with mtime 0, so the bytes are reproducible:

    python benchmarks/make_gutenberg_sample.py ../shared/data/pretrain/gutenberg_books.txt.gz
"""
from __future__ import annotations

import gzip
import hashlib
import re
import sys
from pathlib import Path

HEADING = re.compile(r"^(CHAPTER|Chapter|BOOK|Book|Actus|Scoena|Scena|Scene|SCENE|VOLUME|[IVXL]+\.)\b")
TARGET, SLACK = 150, 50


def passages(book: str) -> list[str]:
    lines = [ln for ln in book.split("\n") if ln.strip()]
    out, start = [], 0
    while start < len(lines):
        end = min(start + TARGET, len(lines))
        if end < len(lines):                     # prefer to cut just before a heading near the target
            for j in range(end, min(end + SLACK, len(lines))):
                if HEADING.match(lines[j]):
                    end = j
                    break
        if len(lines) - end < SLACK:             # no stub passage at the end of a book
            end = len(lines)
        out.append("\n".join(lines[start:end]))
        start = end
    return out


def main() -> None:
    src = Path(sys.argv[1])
    books = [d.strip() for d in gzip.open(src, "rt", encoding="utf-8").read().split("\n\n") if d.strip()]
    docs = [p for b in books for p in passages(b)]
    text = "\n\n".join(docs) + "\n"
    dst = Path(__file__).resolve().parents[1] / "src" / "bertkit" / "sample" / "gutenberg.txt.gz"
    with open(dst, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
        gz.write(text.encode("utf-8"))
    print(f"{dst}: {len(books)} books -> {len(docs)} passages, {len(text.split()):,} words, "
          f"{dst.stat().st_size:,} bytes, sha256 {hashlib.sha256(dst.read_bytes()).hexdigest()}")


if __name__ == "__main__":
    main()
