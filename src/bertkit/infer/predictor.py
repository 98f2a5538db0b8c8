"""Predictor: load a checkpoint once, then embed, classify, fill masks, tag entities, answer questions.

The one object the CLI (`bertkit embed`, `fill-mask`, `predict`, `evaluate`), fine-tuning's
evaluation, the HTTP server and the Python API use. Inputs are tokenized, sorted by length and cut
into batches of similar length (bucketing); each packed batch (no FLOP spent on padding) runs on the
Predictor's engine (`engines.py`: PyTorch, an exported file on onnxruntime, or the encoder's graph
on OpenVINO), short batches on the engine of short batches where one was chosen at load; what a
head computes from the encoder's states is the head's own `outputs` (model.py); results come back
in input order.

    p = Predictor.from_dir("path/to/checkpoint")                          # PredictorOptions: options.py
    p.embed(["a sentence", "another"], pooling="mean", normalize=True)   # (2, C) float32
    p.fill_mask(["paris is the [MASK] of france."])                       # top-k per [MASK]

What runs is decided at load (`choose.py`: precision, int8, the engine of short batches, each
checked against fp32 on a fixed sample); `precision`, `precision_reason`, `precision_check`,
`small_reason` (or `describe()`) say what and why.
"""
from __future__ import annotations

import dataclasses
import logging
from itertools import accumulate
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checkpoint import check_inputs_fit, length_limit, load_model
from ..config import BertConfig
from ..hardware import cpu_flags, cpu_model, pick_device
from ..model import BertModel, pool_tokens
from ..packing import segment_ids
from ..st_files import max_seq_length
from ..tasks.metrics import get_entities
from ..tasks.ner import TaggedExample, featurize_tokens, postprocess_tokens
from ..tasks.squad import QAExample, featurize_qa, postprocess_qa, qa_settings
from ..tokenizer import Encoding, Tokenizer
from . import choose
from .engines import (Batch, ExportedEngine, GraphEngine, TorchEngine, encoder_of, load_session, make_batches, packed_to,
                      split_packed, torch_threads)
from .options import PredictorError, PredictorOptions

log = logging.getLogger("bertkit")

POOLINGS = ("mean", "cls", "pooler", "none")
DTYPES = {"auto": None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CPU = torch.device("cpu")
DEFAULT_OPTIONS = PredictorOptions()   # what from_dir starts from (the test suite turns short batches off here)


class Predictor:
    """A loaded checkpoint (model + tokenizer) answering batched requests."""

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, device: str | torch.device = "cpu",
                 max_length: int | None = None, labels: dict[int, str] | None = None):
        self.engine: TorchEngine | ExportedEngine | GraphEngine = TorchEngine(model)   # runs every batch
        self.model, self.tokenizer = model, tokenizer
        self.device = torch.device(device)
        self.config = cfg = model.config
        self.max_length = length_limit(cfg, max_length)   # ALiBi: any length asked for (no position table)
        self.head = getattr(model, "head", "encoder")
        self.output_names: tuple[str, ...] = tuple(getattr(model, "output_names", ()))   # the head's contract
        self.per_token = bool(getattr(model, "per_token", False))
        # config.json's keys beyond the architecture (id2label, bertkit_stride, ...) are in cfg.extra
        self.labels = labels or {int(k): v for k, v in (cfg.extra.get("id2label") or {}).items()}
        self.int8 = self.compiled = self.prepacked = False
        self.precision = self.engine.precision
        self.precision_reason = "as loaded"
        self.precision_check: dict | None = None        # agreement with fp32 on the sample (bf16, int8)
        # int8 vs a separately loaded fp32 model on the bundled sample sentences (`agreement`); set by
        # `bertkit serve --int8` (commands.serve.report_int8), shown by its /v1/model
        self.int8_agreement: dict | None = None
        self.null_threshold: float | None = None      # SQuAD v2.0: overrides the checkpoint's (serve --null-threshold)
        self.small: GraphEngine | None = None           # the engine of short batches (onnxruntime / OpenVINO)
        self.small_reason = "not asked for"
        self.attention_kernel, self.attention_reason = "sdpa", "as loaded"   # packing.attention's (choose_attention)
        self.source: Path | None = None                 # the checkpoint folder (from_dir): /v1/inspect reloads it

    @property
    def model(self) -> nn.Module:
        return self._model

    @model.setter
    def model(self, model: nn.Module) -> None:          # the PyTorch engine runs the model as chosen
        self._model = model
        if isinstance(self.engine, TorchEngine):
            self.engine.model = model

    @property
    def backend(self) -> str:
        return self.engine.name

    # ---- loading -------------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: str | Path, options: PredictorOptions | None = None, *, head: str | None = None,
                 config_json: tuple[BertConfig, dict] | None = None, **changes) -> "Predictor":
        """Load a checkpoint folder (HF format + tokenizer files) to run as `options` say
        (`PredictorOptions`; keyword arguments of its fields change single options).

        head: which head to load (default: the one config.json names); config_json: the folder's
        config.json as `checkpoint.read_config` returns it, when the caller has read it already."""
        try:
            o = dataclasses.replace(options or DEFAULT_OPTIONS, **changes)
        except TypeError as e:
            raise PredictorError(f"Predictor.from_dir: {e}") from None
        path, dt = Path(path), DTYPES[o.precision]
        if o.threads:
            torch.set_num_threads(int(o.threads))
        device = pick_device(o.device)
        if o.int8 and str(device).startswith("cuda"):
            raise PredictorError("int8 dynamic quantisation runs on the CPU only; use --device cpu")
        model = load_model(path, head=head, config_json=config_json, random_init=False).eval()
        tokenizer = Tokenizer.from_dir(path)
        check_inputs_fit(model.config, tokenizer.vocab_size, o.max_length, where=path)
        max_len = o.max_length or max_seq_length(path, model.config.max_position_embeddings)
        p = cls(model.to(device) if o.backend == "torch" else model, tokenizer,
                device=device if o.backend == "torch" else "cpu", max_length=max_len)
        p.source = path
        if o.backend == "onnx":
            onnx_path = Path(o.onnx_file) if o.onnx_file else path / "model.onnx"
            p.engine = ExportedEngine(load_session(onnx_path, threads=o.threads, device=device), p.per_token)
            p.precision, p.precision_reason = "float32", f"onnxruntime on {onnx_path.name}"
        elif o.backend == "openvino":
            choose.openvino(p, o.threads, dt)
        else:
            p._choose(o, dt)
        log.info("%s backend, precision %s: %s", p.backend, p.precision, p.precision_reason)
        return p

    def _choose(self, o: PredictorOptions, dt: torch.dtype | None) -> None:
        """backend torch: precision, prepacking, the engine of short batches, compile."""
        small = (o.small_batch_tokens or True) if o.small_batches else False
        off = ("small_batches=False" if not small else "compile=True" if o.compile
               else f"on {self.device.type}" if self.device.type != "cpu"
               else f"precision {o.precision} asked for (the engines start from fp32 weights)"
               if dt not in (None, torch.float32) else None)
        if off:
            self.small_reason, small = f"off: {off}", False
        choose.choose_precision(self, dt, o.int8, prepack=o.prepack and not o.compile, small=small,
                                attention=not o.compile)
        if small:
            log.info("short batches: %s", self.small_reason)
        if o.compile:
            self.compile()

    def describe(self) -> dict:
        """What runs and why: backend, device, precision (and the reason, and the agreement with
        fp32 measured at load), prepacked / compiled, threads, and the CPU's bf16 summary."""
        info = {"backend": self.backend, "device": str(self.device), "precision": self.precision,
                "precision_reason": self.precision_reason, "precision_check": self.precision_check,
                "prepacked": self.prepacked, "compiled": self.compiled, "threads": torch.get_num_threads(),
                "attention": {"kernel": self.attention_kernel, "reason": self.attention_reason},
                "small_batches": {**(self.small.describe() if self.small is not None else {"engine": None}),
                                  "reason": self.small_reason}}
        if self.device.type == "cpu":
            info["cpu"] = f"{cpu_model()} ({' '.join(cpu_flags())}; torch {torch.backends.cpu.get_cpu_capability()})"
        return info

    def compile(self) -> "Predictor":
        """torch.compile the encoder (dynamic shapes: packed batches change size every call).

        Compiled with inductor's `freezing`: a Predictor never changes its weights, so they are
        folded in as constants and pre-packed for the CPU GEMM kernels. On the CPU that is about
        what the eager `prepack` path already does, so compile=True replaces prepacking.
        The option is set around each call, not globally, so a training model compiled in the
        same process is not frozen."""
        import torch._inductor.config as inductor_config

        if self.prepacked:
            raise PredictorError("compile() needs the plain Linear layers: load with prepack=False "
                                 "(or from_dir(..., compile=True))")
        enc = self.encoder
        compiled = torch.compile(enc.forward, dynamic=True)

        def forward(*args, **kwargs):
            with inductor_config.patch(freezing=True):
                return compiled(*args, **kwargs)

        enc.forward = forward
        self.compiled = True
        return self

    @property
    def encoder(self) -> BertModel:
        return encoder_of(self.model)

    # ---- the shared batch loop -----------------------------------------------------------------
    def encode(self, texts: Sequence[str], pairs: Sequence[str | None] | None = None,
               max_length: int | None = None) -> list[Encoding]:
        if isinstance(texts, str):
            raise PredictorError("texts must be a list of strings, not one string")
        if pairs is not None and len(pairs) != len(texts):
            raise PredictorError(f"{len(texts)} texts but {len(pairs)} pairs")
        limit = min(max_length or self.max_length, self.max_length)
        return self.tokenizer.encode_batch(list(texts), list(pairs) if pairs is not None else None, limit)

    def batches(self, rows: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = 32) -> list[Batch]:
        """Length-sorted, packed batches of (input_ids, token_type_ids) rows (not yet run)."""
        return make_batches(rows, batch_size, self.device)

    def hidden(self, b: Batch, dtype: torch.dtype | None = None) -> Tensor:
        """(N, C) last-layer states of a packed batch, in `dtype` (default: the encoder's, what its heads
        read). A graph engine computes them in float32: pooling asks for float32 and skips a round trip."""
        h = None
        if self.small is not None and self.small.takes(b.packed):
            try:
                h = self.small.run(b)["last_hidden_state"]
            except Exception as e:           # an engine that fails at run time: off for good, PyTorch answers
                log.warning("the %s engine of short batches failed (%s: %s); PyTorch runs them from now on",
                            self.small.name, type(e).__name__, str(e)[:200])
                self.small, self.small_reason = None, f"off: {self.small.name} failed at run time ({type(e).__name__})"
        if h is None:
            h = self.engine.run(b)["last_hidden_state"]
        want = dtype or self.encoder.embeddings.word.weight.dtype
        return h if h.dtype == want else h.to(want)

    def head_outputs(self, b: Batch) -> dict[str, Tensor]:
        """The loaded head's `outputs` on a packed batch, by its `output_names`: per token (N, ...)
        where the head's outputs are (`per_token`), else per sequence (B, ...); on any engine."""
        if not self.output_names:
            raise PredictorError(f"the {self.head} head has no outputs")
        if self.engine.heads:                                  # computed in the exported file
            if missing := [n for n in self.output_names if n not in self.engine.outputs]:
                raise PredictorError(f"this ONNX file has no {missing[0]} output; export the {self.head} "
                                     f"checkpoint again")
            return self.engine.run(b)
        m = self.model
        h = self.encoder(b.tensors["input_ids"], b.tensors["token_type_ids"], None, b.tensors["position_ids"],
                         packed=b.packed, all_layers=True) if m.all_layers else self.hidden(b)
        return m.outputs(h, b.packed)

    def per_input(self, b: Batch, out: dict[str, Tensor]) -> list[tuple[np.ndarray, ...]]:
        """Each input's share of a batch's head outputs: one float32 array per output name, (T, ...)
        per token or (...) per sequence."""
        if self.per_token:
            p = packed_to(b.packed, CPU)
            cols = [[x.numpy() for x in split_packed(out[n].float().cpu(), p)] for n in self.output_names]
        else:
            cols = [list(out[n].float().cpu().numpy()) for n in self.output_names]
        return list(zip(*cols))

    def _run(self, rows: Sequence[tuple[Sequence[int], Sequence[int]]], fn: Callable[[Batch], list],
             batch_size: int = 32, desc: str | None = None) -> list:
        """fn(batch) -> one result per row of the batch; returns results in input order (`desc`:
        a progress bar of that name on a terminal)."""
        results: list = [None] * len(rows)
        batches = self.batches(rows, batch_size)
        if desc:
            from tqdm.auto import tqdm
            batches = tqdm(batches, desc=desc, disable=None, leave=False)
        for b in batches:
            engine = self.small if self.small is not None and self.small.takes(b.packed) else self.engine
            with torch.inference_mode(), torch_threads(getattr(engine, "threads", None)):   # pooling, head: its threads
                for i, r in zip(b.index, fn(b)):
                    results[i] = r
        return results

    def _require(self, head: str, what: str) -> None:
        if self.head != head:
            raise PredictorError(f"{what} needs a {head} checkpoint; this one was loaded as {self.head}")

    # ---- tasks ---------------------------------------------------------------------------------
    def embed(self, texts: Sequence[str], pairs: Sequence[str | None] | None = None, pooling: str = "mean",
              normalize: bool = False, max_length: int | None = None, batch_size: int = 32):
        """Sentence embeddings (n, C) float32 for pooling 'mean', 'cls' or 'pooler' (the pre-trained
        pooler, tanh(W h + b) over what config.classifier_pooling reads: [CLS] for BERT; needs its
        weights); for 'none' a list of (T_i, C) token-embedding arrays. normalize: unit L2 norm per vector."""
        if pooling not in POOLINGS:
            raise PredictorError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")
        if pooling == "pooler" and (self.engine.heads or self.encoder.pooler is None):
            raise PredictorError("pooling 'pooler' needs a checkpoint with pooler weights, not an exported file")
        encs = self.encode(texts, pairs, max_length)

        def fn(b: Batch) -> list:
            h = self.hidden(b, torch.float32)
            if pooling == "none":
                vecs = split_packed(F.normalize(h, dim=-1) if normalize else h, b.packed)
                return [v.cpu().numpy() for v in vecs]
            if pooling == "pooler":
                v = self.encoder.pool(h.to(self.encoder.pooler.weight.dtype), b.packed).float()
            else:
                v = pool_tokens(h, pooling, b.packed)
            if normalize:
                v = F.normalize(v, dim=-1)
            return list(v.cpu().numpy())

        out = self._run(_rows(encs), fn, batch_size)
        if pooling == "none":
            return out
        return np.stack(out).astype(np.float32) if out else np.zeros((0, self.config.hidden_size), np.float32)

    def fill_mask(self, texts: Sequence[str], top_k: int = 5, max_length: int | None = None,
                  batch_size: int = 32) -> list[list[list[dict]]]:
        """For each text, for each [MASK] in it: the top_k [{"token", "id", "score"}] (softmax)."""
        if "mlm_logits" not in self.output_names:
            raise PredictorError(f"this checkpoint has no masked-LM head (loaded as {self.head}); "
                                 "fill-mask needs a BertForMaskedLM / BertForPreTraining checkpoint")
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
            if self.engine.heads:
                logits = self.head_outputs(b)["mlm_logits"][where]            # (M, V)
            else:                                                             # the head on the [MASK] positions
                masked = ids.where(ids == mask_id, -100)
                logits = self.model.outputs(self.hidden(b), b.packed, mlm_labels=masked)["mlm_logits"]   # (M, V)
            probs = logits.float().softmax(-1)
            scores, top = probs.topk(k, dim=-1)
            seg = segment_ids(b.packed)[where].tolist()
            res: list[list] = [[] for _ in b.index]
            for m, s in enumerate(seg):
                toks = self.tokenizer.convert_ids_to_tokens(top[m].tolist())
                res[s].append([{"token": t, "id": int(i), "score": float(sc)}
                               for t, i, sc in zip(toks, top[m].tolist(), scores[m].tolist())])
            return res

        return self._run(_rows(encs), fn, batch_size)

    def outputs(self, features: Sequence[dict], batch_size: int = 32, desc: str | None = None) -> list:
        """Head outputs for task features (`bertkit.tasks` contract: dicts with input_ids and
        token_type_ids), one numpy array per feature trimmed to its length: (num_labels,) for
        sequence classification, (T, num_labels) for tokens, (start (T,), end (T,)) for QA, (K,)
        for multiple choice (one score per choice; batch_size counts features). The one engine
        for `bertkit predict` / `evaluate` and fine-tuning's evaluation, on any backend."""
        if not self.output_names:
            raise PredictorError(f"no head outputs for a {self.head} checkpoint")
        if self.head == "multiple_choice":                   # K sequences per feature
            return self._choice_outputs(features, batch_size, desc)

        def fn(b: Batch) -> list:
            return [row[0] if len(row) == 1 else row for row in self.per_input(b, self.head_outputs(b))]

        return self._run([(f["input_ids"], f["token_type_ids"]) for f in features], fn, batch_size, desc=desc)

    def _choice_outputs(self, features: Sequence[dict], batch_size: int, desc: str | None) -> list:
        """Multiple choice: each (context, choice) sequence scored on its own, then K per feature."""
        counts = [len(f["input_ids"]) for f in features]
        rows = [row for f in features for row in zip(f["input_ids"], f["token_type_ids"])]
        scores = self._run(rows, lambda b: list(self.head_outputs(b)["logits"][:, 0].float().cpu().numpy()),
                           batch_size * max(counts, default=1), desc=desc)
        ends = np.cumsum(counts).tolist()
        return [np.array(scores[e - k:e], dtype=np.float32) for k, e in zip(counts, ends)]

    def label_names(self) -> list[str]:
        n = getattr(self.model, "num_labels", len(self.labels))
        return [self.labels.get(i, f"LABEL_{i}") for i in range(n)]

    def classify(self, texts: Sequence[str], pairs: Sequence[str | None] | None = None,
                 max_length: int | None = None, batch_size: int = 32, raw: bool = False) -> list[dict]:
        """Per text (or pair): {"label", "score", "scores": {label: probability}} (softmax);
        regression heads: {"score": value}; multi-label heads: sigmoid scores and every label
        over 0.5 in "labels". raw=True adds the "logits"."""
        self._require("sequence_classification", "classify")
        encs = self.encode(texts, pairs, max_length)
        names = self.label_names()
        problem = getattr(self.model, "problem", "single_label")

        def fn(b: Batch) -> list:
            logits = self.head_outputs(b)["logits"].float().cpu()           # (B, L)
            out = []
            for row in logits:
                if problem == "regression":
                    r = {"score": float(row[0])}
                elif problem == "multi_label":
                    probs = row.sigmoid().tolist()
                    r = {"labels": [n for n, q in zip(names, probs) if q > 0.5],
                         "scores": dict(zip(names, probs))}
                else:
                    probs = row.softmax(-1).tolist()
                    k = int(row.argmax())
                    r = {"label": names[k], "score": probs[k], "scores": dict(zip(names, probs))}
                if raw:
                    r["logits"] = row.tolist()
                out.append(r)
            return out

        return self._run(_rows(encs), fn, batch_size)

    def ner(self, texts: Sequence[str | Sequence[str]], max_length: int | None = None,
            stride: int = 32, batch_size: int = 32) -> list[dict]:
        """Word-level entities. A text is a string (split into words the way BERT splits them:
        whitespace and punctuation) or a list of words. Per text: {"words", "tags", "entities":
        [{"type", "text", "start", "end", "first_word", "last_word"}]} with character offsets into
        the string (for word lists: into the words joined by single spaces). Long texts are cut
        into overlapping windows (`stride` pieces), each word read where it has most context."""
        self._require("token_classification", "ner")
        split = [self._words(t, i) for i, t in enumerate(texts)]           # (words, offsets) per text
        examples = [TaggedExample(str(i), words, None) for i, (words, _) in enumerate(split)]
        feats = featurize_tokens(examples, self.tokenizer, None, max_length=max_length or self.max_length,
                                 stride=stride)
        tags = postprocess_tokens(self.outputs(feats, batch_size), feats, examples, self.label_names())
        results = []
        for i, (ex, (_, offs)) in enumerate(zip(examples, split)):
            text = texts[i] if isinstance(texts[i], str) else " ".join(texts[i])
            ents = [{"type": typ, "text": text[offs[f][0]:offs[l][1]], "start": offs[f][0], "end": offs[l][1],
                     "first_word": f, "last_word": l} for typ, f, l in get_entities(tags[ex.id])]
            results.append({"words": ex.words, "tags": tags[ex.id], "entities": ents})
        return results

    def _words(self, text, i: int) -> tuple[list[str], list[tuple[int, int]]]:
        if isinstance(text, str):
            pieces = self.tokenizer.backend.pre_tokenizer.pre_tokenize_str(text)
            words, offs = [w for w, _ in pieces], [tuple(o) for _, o in pieces]
        elif isinstance(text, (list, tuple)) and all(isinstance(w, str) for w in text):
            words = list(text)
            starts = [0, *accumulate(len(w) + 1 for w in words)]          # words joined by single spaces
            offs = [(a, a + len(w)) for a, w in zip(starts, words)]
        else:
            raise PredictorError(f"text {i}: must be a string or a list of words")
        if not words:
            raise PredictorError(f"text {i} has no words")
        return words, offs

    def qa(self, questions: Sequence[str], contexts: Sequence[str], max_length: int | None = None,
           stride: int | None = None, max_answer_length: int = 30, batch_size: int = 32,
           null_threshold: float | None = None) -> list[dict]:
        """Extractive answers: per question {"answer", "score" (start + end logit)}, plus "null_odds"
        for a SQuAD v2.0 model (its answer is "" when they exceed the null threshold). Long contexts
        are read in windows `stride` pieces apart; the answer rules are run_squad.py's
        (`bertkit.tasks.squad`). max_length, stride and the null threshold default to what the
        checkpoint was fine-tuned with (`self.null_threshold` overrides the saved threshold)."""
        self._require("question_answering", "qa")
        if len(questions) != len(contexts):
            raise PredictorError(f"{len(questions)} questions but {len(contexts)} contexts")
        for i, (q, c) in enumerate(zip(questions, contexts)):
            if not isinstance(q, str) or not isinstance(c, str) or not q.strip() or not c.strip():
                raise PredictorError(f"question {i}: question and context must be non-empty strings")
        saved = qa_settings(self.config.extra)
        if null_threshold is None:
            null_threshold = self.null_threshold if self.null_threshold is not None else saved["null_threshold"]
        examples = [QAExample(str(i), q, c) for i, (q, c) in enumerate(zip(questions, contexts))]
        feats = featurize_qa(examples, self.tokenizer, max_length=min(max_length or saved["max_length"], self.max_length),
                             stride=stride or saved["doc_stride"])
        preds = postprocess_qa(self.outputs(feats, batch_size), feats, examples, max_answer_length=max_answer_length,
                               version=saved["version"], null_threshold=null_threshold)
        return [{"answer": preds[ex.id], "score": preds.nbest[ex.id][0][1],
                 **({"null_odds": preds.null_odds[ex.id]} if ex.id in preds.null_odds else {})} for ex in examples]


def _rows(encodings: Sequence[Encoding]) -> list[tuple[list[int], list[int]]]:
    return [(e.input_ids, e.token_type_ids) for e in encodings]
