"""WordPiece tokenization with BERT's rules, as a `tokenizers` pipeline.

The pipeline and the checks of tokenizer files where they are read; the deterministic WordPiece
learner is `wordpiece.py`.

  normalizer     BertNormalizer: clean text (drop control chars, whitespace -> ' '), put spaces
                 around CJK characters, lower-case and strip accents when uncased
  pre-tokenizer  BertPreTokenizer: split on whitespace and on every punctuation character
  model          WordPiece: greedy longest-match-first, '##' continuation, [UNK] for words
                 over 100 characters or with no match
  post-processor done here in Python: [CLS] A [SEP] (B [SEP]) with segment ids, and a
                 longest-first truncation that counts every token it cuts

The same vocabulary and casing give the same ids as Hugging Face's BertTokenizer.
Training (`Tokenizer.train`) counts words with the same normalizer and pre-tokenizer and learns the
vocabulary with `learn_wordpiece`: the `tokenizers` WordPiece trainer's rules with ties broken by id,
so the same text and options give byte-identical files.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Iterable, Sequence

from tokenizers import AddedToken, Tokenizer as RustTokenizer, decoders, models, normalizers, pre_tokenizers, processors

from .errors import BertkitError
from .outdir import staged_dir
from .runconfig import NON_NEGATIVE, Checked, Rule
from .sources import read_json_object
from .wordpiece import count_words, learn_wordpiece

if TYPE_CHECKING:
    import torch

log = logging.getLogger("bertkit")

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class TokenizerError(BertkitError, ValueError):
    """The tokenizer files are missing or inconsistent; the message names the file."""


@dataclass
class Encoding:
    """One encoded text or text pair."""
    input_ids: list[int]
    token_type_ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]            # character span in its own text; (0, 0) for specials
    special_tokens_mask: list[int]            # 1 for [CLS]/[SEP]
    word_ids: list[int | None]                # index of the word (pre-token) each piece came from
    sequence_ids: list[int | None]            # 0 for A, 1 for B, None for specials
    truncated: int = 0                        # tokens cut by truncation

    @property
    def attention_mask(self) -> list[int]:
        return [1] * len(self.input_ids)

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class TruncationStats:
    inputs: int = 0
    truncated_inputs: int = 0
    tokens_cut: int = 0
    warned: bool = field(default=False, repr=False)

    def add(self, inputs: int, truncated: int = 0, cut: int = 0) -> None:
        self.inputs, self.truncated_inputs, self.tokens_cut = \
            self.inputs + inputs, self.truncated_inputs + truncated, self.tokens_cut + cut

    def counts(self) -> tuple[int, int, int]:
        """(inputs, truncated inputs, tokens cut) so far."""
        return self.inputs, self.truncated_inputs, self.tokens_cut

    def report(self, before: tuple[int, int, int] = (0, 0, 0), label: str = "") -> tuple[int, int]:
        """Log how many inputs truncation cut, and how many tokens, since `before` (an earlier
        `counts()`); returns (truncated inputs, tokens cut)."""
        n, cut, tokens = (a - b for a, b in zip(self.counts(), before))
        if cut:
            log.warning("%struncated %d of %d inputs (%d tokens cut)", f"{label}: " if label else "", cut, n, tokens)
        return cut, tokens


class Tokenizer:
    """A BERT WordPiece tokenizer. Build with `Tokenizer.from_dir`, `from_vocab` or `train`."""

    def __init__(self, vocab: dict[str, int], lowercase: bool = True, strip_accents: bool | None = None,
                 chinese_chars: bool = True, name: str = ""):
        missing = [t for t in SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise TokenizerError(f"{name or 'vocabulary'}: missing special tokens {missing}")
        self.vocab, self.lowercase, self.strip_accents, self.chinese_chars = vocab, lowercase, strip_accents, chinese_chars
        self.name = name
        backend = RustTokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
        backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese_chars,
                                                        strip_accents=strip_accents, lowercase=lowercase)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
        self.backend = backend
        self.inv_vocab = {i: t for t, i in vocab.items()}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (vocab[t] for t in SPECIAL_TOKENS)
        self.special_ids = {self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id}
        self.stats = TruncationStats()

    # ---- loading and saving ------------------------------------------------------------------
    @classmethod
    def from_vocab(cls, vocab_file: str | Path, lowercase: bool = True, **kw) -> "Tokenizer":
        return cls(read_vocab(Path(vocab_file)), lowercase=lowercase, name=str(vocab_file), **kw)

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        """Load from a folder with `vocab.txt` or `tokenizer.json` (casing from `tokenizer_config.json`)."""
        path = Path(path)
        if path.is_file() and path.name == "vocab.txt":
            return cls.from_vocab(path)
        if not path.is_dir():
            raise TokenizerError(f"{path}: not a directory with vocab.txt or tokenizer.json")
        settings: dict = {}
        tj = path / "tokenizer.json"
        vocab = read_vocab(path / "vocab.txt") if (path / "vocab.txt").is_file() else None
        if tj.is_file():
            d = read_json_object(tj, TokenizerError)
            model = d.get("model") or {}
            if not isinstance(model, dict):
                raise TokenizerError(f"{tj}: \"model\" must be an object, got {type(model).__name__}")
            if vocab is None:
                if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
                    raise TokenizerError(f"{tj}: not a WordPiece tokenizer")
                vocab = _check_vocab_ids(model["vocab"], tj)
            norm = d.get("normalizer") or {}
            if isinstance(norm, dict) and norm.get("type") == "BertNormalizer":
                settings = {"lowercase": norm.get("lowercase", True), "strip_accents": norm.get("strip_accents"),
                            "chinese_chars": norm.get("handle_chinese_chars", True)}
                _check_flags(settings, tj, {"lowercase": "normalizer.lowercase", "strip_accents": "normalizer.strip_accents",
                                            "chinese_chars": "normalizer.handle_chinese_chars"})
        if vocab is None:
            raise TokenizerError(f"{path}: no vocab.txt or tokenizer.json (not a tokenizer folder)")
        tc = path / "tokenizer_config.json"
        if tc.is_file():
            c = read_json_object(tc, TokenizerError)
            names = {"lowercase": "do_lower_case", "strip_accents": "strip_accents",
                     "chinese_chars": "tokenize_chinese_chars"}
            given = {ours: c[theirs] for ours, theirs in names.items() if theirs in c}
            _check_flags(given, tc, names)
            settings.update(given)
        return cls(vocab, name=str(path), **settings)

    @classmethod
    def train(cls, files: Sequence[str | Path], vocab_size: int = 30522, lowercase: bool = True,
              min_frequency: int = 2, limit_alphabet: int = 1000, show_progress: bool = False) -> "Tokenizer":
        """Learn a WordPiece vocabulary from text files (plain or .gz) with BERT's special tokens.

        Deterministic: the same text and options give the same vocabulary, ids included (see
        `learn_wordpiece`; the `tokenizers` trainer breaks ties in hash-map order, so its vocabularies
        differ from run to run)."""
        t0 = time.perf_counter()
        counts = count_words(files, lowercase)
        if not counts:                    # a vocabulary of the 5 special tokens would load and tokenize all as [UNK]
            raise TokenizerError(f"{', '.join(map(str, files))}: no words to learn a vocabulary from (empty, or only "
                                 "blank lines)")
        t1 = time.perf_counter()
        tokens = learn_wordpiece(counts, vocab_size, min_frequency, limit_alphabet, special_tokens=SPECIAL_TOKENS)
        log.log(logging.INFO if show_progress else logging.DEBUG,
                "counted %d words (%d distinct) in %.1f s; learnt %d tokens in %.1f s",
                sum(counts.values()), len(counts), t1 - t0, len(tokens), time.perf_counter() - t1)
        return cls({t: i for i, t in enumerate(tokens)}, lowercase=lowercase, name="trained")

    def save(self, path: str | Path) -> None:
        """Write vocab.txt, tokenizer.json, tokenizer_config.json and special_tokens_map.json, each
        file whole or not at all (written aside, then renamed; `train_to_folder` swaps whole folders)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        _write_atomic(path / "vocab.txt", "".join(t + "\n" for t in sorted(self.vocab, key=self.vocab.get)))
        self.backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", self.cls_id), ("[SEP]", self.sep_id)])
        try:
            self.backend.save(str(path / "tokenizer.json.tmp"))
            (path / "tokenizer.json.tmp").replace(path / "tokenizer.json")
        finally:
            self.backend.post_processor = None
        specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                    "mask_token": "[MASK]"}
        _write_atomic(path / "tokenizer_config.json", json.dumps({
            "tokenizer_class": "BertTokenizer", "do_lower_case": self.lowercase, "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.chinese_chars, **specials, "model_max_length": 512}, indent=2) + "\n")
        _write_atomic(path / "special_tokens_map.json", json.dumps(specials, indent=2) + "\n")

    @property
    def vocab_size(self) -> int:
        return max(self.vocab.values()) + 1

    def fingerprint(self) -> str:
        """sha256 of the vocabulary and the normalisation settings (to check data against a tokenizer)."""
        h = hashlib.sha256()
        for t, i in sorted(self.vocab.items(), key=lambda kv: kv[1]):
            h.update(f"{i}\t{t}\n".encode("utf-8"))
        h.update(f"lower={self.lowercase};accents={self.strip_accents};cjk={self.chinese_chars}".encode())
        return h.hexdigest()

    # ---- encoding ----------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[str]:
        return self.backend.encode(text, add_special_tokens=False).tokens

    def encode_ids(self, texts: list[str]) -> list[list[int]]:
        """Word-piece ids of many texts, no special tokens, no truncation (fast, multi-threaded)."""
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def encode(self, text: str, pair: str | None = None, max_length: int | None = None) -> Encoding:
        return self.encode_batch([text], [pair] if pair is not None else None, max_length)[0]

    def encode_batch(self, texts: Sequence[str], pairs: Sequence[str | None] | None = None,
                     max_length: int | None = None) -> list[Encoding]:
        """[CLS] A [SEP] (B [SEP]); longest-first truncation to max_length, counted in `self.stats`.

        With max_length, a text over LONG_TEXT_CHARS characters is read in pieces cut between words:
        the first max_length tokens are kept and the rest only counted, so a 50 MB line costs the
        memory of one piece, not of millions of Python tokens (the result is the same)."""
        a = self._encode_texts(list(texts), max_length)
        b = self._encode_texts([p or "" for p in pairs], max_length) if pairs is not None else None
        return [self._assemble(ea, b[i] if b is not None and pairs[i] is not None else None, max_length)
                for i, ea in enumerate(a)]

    def _encode_texts(self, texts: list[str], max_length: int | None) -> list:
        if max_length is None or all(len(t) <= LONG_TEXT_CHARS for t in texts):
            return self.backend.encode_batch(texts, add_special_tokens=False)
        short = iter(self.backend.encode_batch([t for t in texts if len(t) <= LONG_TEXT_CHARS],
                                               add_special_tokens=False))
        return [next(short) if len(t) <= LONG_TEXT_CHARS else self._encode_long(t, max_length) for t in texts]

    def _encode_long(self, text: str, keep: int) -> "_Prefix":
        """The first `keep` tokens of a long text (ids, tokens, offsets, word ids) and its length in tokens."""
        ids: list[int] = []
        tokens: list[str] = []
        offsets: list[tuple[int, int]] = []
        words: list[int | None] = []
        total, word_base, rest = 0, 0, []
        for start, piece in _pieces(text, LONG_TEXT_CHARS):
            if len(ids) >= keep:
                rest.append(piece)
                if len(rest) == 16:
                    total += self._count(rest)
                    rest = []
                continue
            e = self.backend.encode(piece, add_special_tokens=False)
            total += len(e)
            ids += e.ids
            tokens += e.tokens
            offsets += [(a + start, b + start) for a, b in e.offsets]
            wids = e.word_ids
            words += [w + word_base if w is not None else None for w in wids]
            word_base += max((w for w in wids if w is not None), default=-1) + 1
        total += self._count(rest) if rest else 0
        return _Prefix(ids[:keep], tokens[:keep], offsets[:keep], words[:keep], total)

    def _count(self, texts: list[str]) -> int:
        """Tokens in `texts` (no offsets built: encode_batch_fast where this tokenizers has it)."""
        fast = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return sum(len(e) for e in fast(texts, add_special_tokens=False))

    def _assemble(self, ea, eb, max_length: int | None) -> Encoding:
        na, nb = len(ea), len(eb) if eb is not None else 0
        keep_a, keep_b = na, nb
        if max_length is not None:
            budget = max_length - (3 if eb is not None else 2)
            if budget < 0:
                raise ValueError(f"max_length {max_length} leaves no room for the special tokens")
            keep_a, keep_b = longest_first(na, nb, budget)
        cut = na + nb - keep_a - keep_b
        self.stats.add(1, int(cut > 0), cut)
        if cut and not self.stats.warned:
            self.stats.warned = True
            log.warning("truncating inputs longer than %d tokens (first one lost %d tokens); "
                        "counts are in tokenizer.stats", max_length, cut)
        ids = [self.cls_id, *ea.ids[:keep_a], self.sep_id]
        tokens = ["[CLS]", *ea.tokens[:keep_a], "[SEP]"]
        offsets = [(0, 0), *ea.offsets[:keep_a], (0, 0)]
        words = [None, *ea.word_ids[:keep_a], None]
        seq = [None, *([0] * keep_a), None]
        types = [0] * (keep_a + 2)
        if eb is not None:
            ids += [*eb.ids[:keep_b], self.sep_id]
            tokens += [*eb.tokens[:keep_b], "[SEP]"]
            offsets += [*eb.offsets[:keep_b], (0, 0)]
            words += [*eb.word_ids[:keep_b], None]
            seq += [*([1] * keep_b), None]
            types += [1] * (keep_b + 1)
        special = [1 if s is None else 0 for s in seq]
        return Encoding(ids, types, tokens, [tuple(o) for o in offsets], special, words, seq, cut)

    def pad(self, encodings: Sequence[Encoding], pad_to_multiple_of: int | None = None,
            device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
        """Right-pad a list of encodings into (B, T) tensors: input_ids, token_type_ids, attention_mask."""
        import torch                       # here, so data commands start without torch
        T = max((len(e) for e in encodings), default=0)
        if pad_to_multiple_of:
            T = -(-T // pad_to_multiple_of) * pad_to_multiple_of
        B = len(encodings)
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        types = torch.zeros((B, T), dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        for i, e in enumerate(encodings):
            n = len(e)
            ids[i, :n] = torch.tensor(e.input_ids)
            types[i, :n] = torch.tensor(e.token_type_ids)
            mask[i, :n] = 1
        batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
        return {k: v.to(device) for k, v in batch.items()} if device is not None else batch

    def __call__(self, texts: Sequence[str] | str, pairs=None, max_length: int | None = 512) -> dict[str, torch.Tensor]:
        if isinstance(texts, str):
            texts, pairs = [texts], ([pairs] if isinstance(pairs, str) else pairs)
        return self.pad(self.encode_batch(texts, pairs, max_length))

    # ---- decoding ----------------------------------------------------------------------------
    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.inv_vocab.get(int(i), "[UNK]") for i in ids]

    def token_to_id(self, token: str) -> int | None:
        return self.vocab.get(token)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        ids = [int(i) for i in ids if not (skip_special_tokens and int(i) in self.special_ids - {self.unk_id})]
        return self.backend.decode(ids, skip_special_tokens=False)


def _write_atomic(f: Path, text: str) -> None:
    tmp = f.with_name(f.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(f)


TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass
class TokenizerTrainOptions(Checked):
    """The vocabulary `bertkit tokenizer train` learns (its flags: `cliconfig.add_options`)."""
    vocab_size: Annotated[int, Rule("at least 10", lambda v: v >= 10)] = 30522
    """Tokens in the vocabulary, the 5 special ones included."""
    cased: bool = False
    """Keep case and accents (default: uncased, like bert-base-uncased)."""
    min_frequency: Annotated[int, NON_NEGATIVE] = 2
    """Fewest occurrences of a pair of pieces to merge it."""


def train_to_folder(files: Sequence[str | Path], out: str | Path, options: TokenizerTrainOptions | None = None,
                    show_progress: bool = False) -> Tokenizer:
    """`Tokenizer.train(files)` as `options` say, saved as the folder `out`, which is at every moment
    either the previous tokenizer or the new one, complete (`kill -9` included): the files are written
    to `out.incomplete` and swapped in when all are there. An `out` holding anything but tokenizer
    files is an error, checked before training."""
    o = options or TokenizerTrainOptions()
    with staged_dir(out, owned=is_tokenizer_folder, what="tokenizer") as tmp:
        tok = Tokenizer.train(files, vocab_size=o.vocab_size, lowercase=not o.cased, min_frequency=o.min_frequency,
                              show_progress=show_progress)
        tok.save(tmp)
    return tok


def is_tokenizer_folder(path: Path) -> bool:
    """A folder of tokenizer files only (one `train_to_folder` may replace)."""
    names = {p.name.removesuffix(".tmp") for p in Path(path).iterdir()}     # .tmp: a save cut short
    return bool(names) and names <= set(TOKENIZER_FILES)


LONG_TEXT_CHARS = 1 << 16


@dataclass
class _Prefix:
    """The first tokens of a long text, as `Tokenizer._assemble` reads an encoding, and its full length."""
    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]
    n: int

    def __len__(self) -> int:
        return self.n


# after these no word goes on (whitespace, punctuation); never after '[', which may open [MASK]
_ASCII_BREAK = re.compile(r"[\s!-/:-@\\-`{-~\]]")


def _is_break(ch: str) -> bool:
    """A character no word runs across: whitespace, punctuation, a CJK ideograph (each its own word)."""
    return ch != "[" and (ch.isspace() or unicodedata.category(ch).startswith("P") or "\u4e00" <= ch <= "\u9fff")


def _pieces(text: str, size: int):
    """(start, piece) cuts of `text` of about `size` characters, each cut just after a character no word
    runs across: the pieces tokenize to exactly the tokens of the whole text."""
    start, n = 0, len(text)
    while start < n:
        end = min(start + size, n)
        if end < n:
            window = text[start:end]
            m = None
            for m in _ASCII_BREAK.finditer(window, max(0, len(window) - 4096)):
                pass
            if m is not None:
                end = start + m.end()
            else:
                back = next((k for k in range(end - 1, start, -1) if _is_break(text[k])), None)
                if back is not None:
                    end = back + 1
                else:                              # one giant word: its end, wherever that is
                    end = next((k + 1 for k in range(end, n) if _is_break(text[k])), n)
        yield start, text[start:end]
        start = end


def longest_first(na: int, nb: int, budget: int) -> tuple[int, int]:
    """Lengths of A and B kept by Hugging Face's longest-first truncation of a pair to `budget` tokens.

    The shorter side keeps min(its length, budget // 2) and the longer side the rest; on a tie A keeps
    budget // 2. (google-research/bert's run_classifier and transformers' BertTokenizerLegacy cut one
    token at a time from the longer side, B on ties: with an odd budget the two differ by one token.)
    """
    if na + nb <= budget:
        return na, nb
    if na <= nb:                                  # on a tie, min(na, budget // 2) is budget // 2
        keep_a = min(na, budget // 2)
        return keep_a, budget - keep_a
    keep_b = min(nb, budget // 2)
    return budget - keep_b, keep_b


def _check_flags(settings: dict, f: Path, names: dict[str, str]) -> None:
    """lowercase / chinese_chars are true or false; strip_accents also null (= follow lowercase)."""
    for key, value in settings.items():
        if not (isinstance(value, bool) or (key == "strip_accents" and value is None)):
            raise TokenizerError(f"{f}: {names[key]} must be true or false{' or null' if key == 'strip_accents' else ''}, "
                                 f"got {value!r:.40}")


def _check_vocab_ids(vocab: dict, f: Path) -> dict[str, int]:
    """A tokenizer.json vocabulary: distinct non-negative integer ids."""
    seen: dict[int, str] = {}
    for tok, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < (1 << 24):
            raise TokenizerError(f"{f}: model.vocab[{tok!r:.40}] must be an id in [0, 2^24), got {i!r:.40}")
        if i in seen:
            raise TokenizerError(f"{f}: model.vocab gives id {i} to both {seen[i]!r:.40} and {tok!r:.40}")
        seen[i] = tok
    return dict(vocab)


def read_vocab(path: Path) -> dict[str, int]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TokenizerError(f"{path}: no such file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerError(f"{path}: not valid UTF-8 at byte {e.start}") from None
    lines = [line.rstrip("\r") for line in text.split("\n")]
    if lines[-1] == "":                             # the newline that ends the last line
        lines.pop()
    vocab: dict[str, int] = {}
    for i, tok in enumerate(lines):
        if tok in vocab:  # HF keeps the last index for a repeated token; so do we
            log.warning("%s:%d: token %r repeated", path, i + 1, tok)
        vocab[tok] = i
    if not vocab:
        raise TokenizerError(f"{path}: empty vocabulary")
    return vocab
