"""Predictor: load a checkpoint once, then embed, classify, fill masks, tag entities, answer questions.

The one object the CLI (`bertkit embed`, `fill-mask`, `predict`), the HTTP server and the Python
API use. Inputs are tokenized, sorted by length and cut into batches of similar length (bucketing);
each batch runs the padding-free encoder path (`fast.pack` -> `model(..., packed=...)`) under
`torch.inference_mode`, so no FLOP is spent on padding; results come back in input order.

    p = Predictor.from_dir("path/to/checkpoint")
    p.embed(["a sentence", "another"], pooling="mean", normalize=True)   # (2, C) float32
    p.fill_mask(["paris is the [MASK] of france."])                       # top-k per [MASK]

Options: `threads` (torch intra-op threads), `int8` (dynamic int8 quantisation of the Linear
layers, per output channel; `agreement()` reports cosine / max abs diff / accuracy against fp32),
`compile` (torch.compile of the encoder), `backend="onnx"` (an exported graph on onnxruntime,
see `onnx_export.py`).
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .errors import BertkitError
from .fast import Packed, pack
from .model import BertModel
from .tokenizer import Encoding, Tokenizer

log = logging.getLogger("bertkit")

POOLINGS = ("mean", "cls", "none")


class PredictorError(BertkitError, ValueError):
    """A request the loaded checkpoint cannot answer (wrong head, no [MASK], bad option)."""


@dataclass
class Batch:
    """One length bucket, packed: which inputs it holds and the model's outputs for them."""
    index: list[int]              # positions of these inputs in the caller's list
    encodings: list[Encoding]
    packed: Packed
    tensors: dict[str, Tensor]    # packed (N,) input_ids, position_ids, token_type_ids


def length_buckets(lengths: Sequence[int], batch_size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Indices sorted by length (longest first), cut into batches of <= batch_size items and,
    when given, <= max_tokens real tokens (a single longer input still gets its own batch)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, cur, tokens = [], [], 0
    for i in order:
        if cur and (len(cur) >= batch_size or (max_tokens and tokens + lengths[i] > max_tokens)):
            batches.append(cur)
            cur, tokens = [], 0
        cur.append(i)
        tokens += lengths[i]
    if cur:
        batches.append(cur)
    return batches


def segment_ids(p: Packed) -> Tensor:
    """(N,) index of the sequence each packed token belongs to."""
    lengths = (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).long()
    return torch.repeat_interleave(torch.arange(p.batch_size, device=lengths.device), lengths)


def pool(hidden: Tensor, p: Packed, pooling: str) -> Tensor:
    """(N, C) packed states -> (B, C): mean over each sequence's tokens ([CLS]/[SEP] included,
    as sentence-transformers does) or the [CLS] state."""
    if pooling == "cls":
        return hidden[p.cu_seqlens[:-1].long()]
    lengths = (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).to(hidden.dtype)
    sums = hidden.new_zeros(p.batch_size, hidden.shape[-1]).index_add_(0, segment_ids(p), hidden)
    return sums / lengths[:, None]


def split_packed(x: Tensor, p: Packed) -> list[Tensor]:
    """(N, ...) -> one (T_b, ...) tensor per sequence."""
    return list(torch.split(x, (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).tolist()))


def quantize_int8(model: nn.Module) -> nn.Module:
    """Dynamic int8 quantisation of every nn.Linear (weights int8 per output channel, activations
    quantised per batch at run time). Per-channel scales keep the output close to fp32 where one
    scale per tensor does not (see BASELINES.md)."""
    from torch.ao.quantization import quantize_dynamic
    from torch.ao.quantization.qconfig import per_channel_dynamic_qconfig
    return quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, inplace=False)


def _read_max_length(path: Path, model_max: int) -> int:
    """The checkpoint's own limit: sentence-transformers' max_seq_length when present, else the
    number of position embeddings."""
    sb = path / "sentence_bert_config.json"
    if sb.is_file():
        try:
            return min(int(json.loads(sb.read_text())["max_seq_length"]), model_max)
        except (ValueError, KeyError, TypeError):
            pass
    return model_max


class Predictor:
    """A loaded checkpoint (model + tokenizer) answering batched requests."""

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, device: str | torch.device = "cpu",
                 max_length: int | None = None, session: Any = None, labels: dict[int, str] | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.device = torch.device(device)
        self.session = session                          # onnxruntime.InferenceSession (backend onnx)
        self.backend = "onnx" if session is not None else "torch"
        cfg = model.config
        self.config = cfg
        self.max_length = min(max_length or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self.head = getattr(model, "head", "encoder")
        hf = getattr(model, "hf_config", {}) or {}
        self.labels = labels or {int(k): v for k, v in (hf.get("id2label") or {}).items()}
        self.int8 = False
        self.compiled = False

    # ---- loading -------------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: str | Path, head: str | None = None, device: str | None = None,
                 threads: int | None = None, int8: bool = False, compile: bool = False,
                 backend: str = "torch", max_length: int | None = None,
                 onnx_file: str | Path | None = None) -> "Predictor":
        """Load a checkpoint folder (HF format + tokenizer files).

        head: which head to load (default: the one config.json names); device: 'cpu', 'cuda', ...
        (default cuda when available); threads: torch intra-op threads; int8: quantise the Linear
        layers; compile: torch.compile the encoder; backend 'onnx': run `onnx_file` (default
        DIR/model.onnx) on onnxruntime, tokenization and post-processing stay here.
        """
        from .checkpoint import load_model

        path = Path(path)
        if backend not in ("torch", "onnx"):
            raise PredictorError(f"backend must be 'torch' or 'onnx', not {backend!r}")
        if threads:
            torch.set_num_threads(int(threads))
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = load_model(path, head=head)
        model.eval()
        tokenizer = Tokenizer.from_dir(path)
        max_len = max_length or _read_max_length(path, model.config.max_position_embeddings)
        session = None
        if backend == "onnx":
            from .onnx_export import load_session
            session = load_session(Path(onnx_file) if onnx_file else path / "model.onnx", threads=threads,
                                   device=device)
            device = "cpu"
        else:
            if int8:
                if str(device).startswith("cuda"):
                    raise PredictorError("int8 dynamic quantisation runs on the CPU only; use --device cpu")
                model = quantize_int8(model)
            model.to(device)
        p = cls(model, tokenizer, device=device, max_length=max_len, session=session)
        p.int8 = bool(int8) and backend == "torch"
        if compile and backend == "torch":
            p.compile()
        return p

    def compile(self) -> "Predictor":
        """torch.compile the encoder (dynamic shapes: packed batches change size every call)."""
        enc = self.encoder
        enc.forward = torch.compile(enc.forward, dynamic=True)
        self.compiled = True
        return self

    @property
    def encoder(self) -> BertModel:
        return self.model if isinstance(self.model, BertModel) else self.model.bert

    # ---- the shared batch loop -----------------------------------------------------------------
    def encode(self, texts: Sequence[str], pairs: Sequence[str | None] | None = None,
               max_length: int | None = None) -> list[Encoding]:
        if isinstance(texts, str):
            raise PredictorError("texts must be a list of strings, not one string")
        if pairs is not None and len(pairs) != len(texts):
            raise PredictorError(f"{len(texts)} texts but {len(pairs)} pairs")
        limit = min(max_length or self.max_length, self.max_length)
        return self.tokenizer.encode_batch(list(texts), list(pairs) if pairs is not None else None, limit)

    def batches(self, encodings: Sequence[Encoding], batch_size: int = 32,
                max_tokens: int | None = None) -> list[Batch]:
        """Length-sorted, packed batches of `encodings` (not yet run)."""
        out = []
        for idx in length_buckets([len(e) for e in encodings], batch_size, max_tokens):
            encs = [encodings[i] for i in idx]
            padded = self.tokenizer.pad(encs)
            tensors, p = pack(padded["input_ids"], padded["attention_mask"], padded["token_type_ids"])
            if self.backend == "torch":
                tensors = {k: v.to(self.device) for k, v in tensors.items()}
                p = _packed_to(p, self.device)
            out.append(Batch(idx, encs, p, tensors))
        return out

    def hidden(self, b: Batch) -> Tensor:
        """(N, C) last-layer states of a packed batch (float32 on the CPU)."""
        if self.session is not None:
            return self._onnx(b)["hidden"]
        with torch.inference_mode():
            return self.encoder(b.tensors["input_ids"], b.tensors["token_type_ids"], None,
                                b.tensors["position_ids"], packed=b.packed)

    def _run(self, encodings: Sequence[Encoding], fn: Callable[[Batch], list], batch_size: int,
             max_tokens: int | None = None) -> list:
        """fn(batch) -> one result per input of the batch; returns results in input order."""
        results: list = [None] * len(encodings)
        for b in self.batches(encodings, batch_size, max_tokens):
            with torch.inference_mode():
                for i, r in zip(b.index, fn(b)):
                    results[i] = r
        return results

    # ---- tasks ---------------------------------------------------------------------------------
    def embed(self, texts: Sequence[str], pairs: Sequence[str | None] | None = None, pooling: str = "mean",
              normalize: bool = False, max_length: int | None = None, batch_size: int = 32):
        """Sentence embeddings (n, C) float32 for pooling 'mean' or 'cls'; for 'none' a list of
        (T_i, C) token-embedding arrays. normalize: unit L2 norm per vector."""
        if pooling not in POOLINGS:
            raise PredictorError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")
        encs = self.encode(texts, pairs, max_length)

        def fn(b: Batch) -> list:
            h = self.hidden(b).float()
            if pooling == "none":
                vecs = split_packed(F.normalize(h, dim=-1) if normalize else h, b.packed)
                return [v.cpu().numpy() for v in vecs]
            v = pool(h, b.packed, pooling)
            if normalize:
                v = F.normalize(v, dim=-1)
            return list(v.cpu().numpy())

        out = self._run(encs, fn, batch_size)
        if pooling == "none":
            return out
        return np.stack(out).astype(np.float32) if out else np.zeros((0, self.config.hidden_size), np.float32)

    def fill_mask(self, texts: Sequence[str], top_k: int = 5, max_length: int | None = None,
                  batch_size: int = 32) -> list[list[list[dict]]]:
        """For each text, for each [MASK] in it: the top_k [{"token", "id", "score"}] (softmax)."""
        if self.session is None and not hasattr(self.model, "mlm"):
            raise PredictorError(f"this checkpoint has no masked-LM head (loaded as {self.head}); "
                                 "fill-mask needs a BertForMaskedLM / BertForPreTraining checkpoint")
        if self.session is not None and "mlm_logits" not in self._onnx_outputs():
            raise PredictorError("this ONNX file has no masked-LM output; export a masked_lm checkpoint")
        if top_k < 1:
            raise PredictorError(f"top_k must be >= 1, not {top_k}")
        encs = self.encode(texts, None, max_length)
        mask_id = self.tokenizer.mask_id
        for i, e in enumerate(encs):
            if mask_id not in e.input_ids:
                raise PredictorError(f"text {i} has no [MASK] token" +
                                     (" (it was cut by truncation)" if e.truncated else ""))
        k = min(top_k, self.config.vocab_size)

        def fn(b: Batch) -> list:
            ids = b.tensors["input_ids"]
            where = (ids == mask_id).nonzero().flatten()                      # (M,) packed positions
            if self.session is not None:
                logits = self._onnx(b)["mlm_logits"][where]                   # (M, V)
            else:
                logits, _ = self.model.mlm(self.hidden(b)[where])               # (M, V)
            probs = logits.float().softmax(-1)
            scores, top = probs.topk(k, dim=-1)
            seg = segment_ids(b.packed)[where].tolist()
            res: list[list] = [[] for _ in b.index]
            for m, s in enumerate(seg):
                toks = self.tokenizer.convert_ids_to_tokens(top[m].tolist())
                res[s].append([{"token": t, "id": int(i), "score": float(sc)}
                               for t, i, sc in zip(toks, top[m].tolist(), scores[m].tolist())])
            return res

        return self._run(encs, fn, batch_size)

    # ---- onnx backend --------------------------------------------------------------------------
    def _onnx_outputs(self) -> list[str]:
        return [o.name for o in self.session.get_outputs()]

    def _onnx(self, b: Batch) -> dict[str, Tensor]:
        """Run the padded batch through onnxruntime; outputs repacked to (N, ...) / (B, ...)."""
        from .onnx_export import run_session
        return run_session(self.session, b.encodings, self.tokenizer, b.packed)


def _packed_to(p: Packed, device: torch.device) -> Packed:
    if device.type == "cpu":
        return p
    return Packed(p.cu_seqlens.to(device), p.max_seqlen, p.indices.to(device), p.batch_size, p.padded_len,
                  p.pad_indices.to(device), p.key_mask.to(device))
