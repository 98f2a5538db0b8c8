"""Predictor: load a checkpoint once, then embed, classify, fill masks, tag entities, answer questions.

Why one file of ~790 lines: it is the one inference engine (every backend, precision choice,
batching); what a head computes from the encoder's states is the head's own `outputs` (model.py),
and the engines of short batches (graph, agreement, timing) are onnx_graph.py's.

The one object the CLI (`bertkit embed`, `fill-mask`, `predict`, `evaluate`), fine-tuning's
evaluation, the HTTP server and the Python API use. Inputs are tokenized, sorted by length and cut
into batches of similar length (bucketing); each batch runs the padding-free encoder path
(`packing.pack` -> `model(..., packed=...)`) under `torch.inference_mode`, so no FLOP is spent on
padding; results come back in input order.

    p = Predictor.from_dir("path/to/checkpoint")
    p.embed(["a sentence", "another"], pooling="mean", normalize=True)   # (2, C) float32
    p.fill_mask(["paris is the [MASK] of france."])                       # top-k per [MASK]

Precision (`dtype`, default "auto"): on a CPU whose bf16 matrix multiplies are measurably faster
than fp32 (`hardware.capabilities`: AMX, AVX512_BF16; not AVX2-only CPUs, where bf16 is emulated
and 10-40x slower) the model runs in bf16 if, on a fixed sample of texts at load, its sentence
embeddings, token states and head outputs keep cosine >= 0.999 to fp32; otherwise, and on GPUs,
fp32. `precision`, `precision_reason` and `precision_check` (or `describe()`) say what runs and
why; `BERTKIT_BF16=0/1` overrides the measurement. On the CPU the encoder's Linear weights are
prepacked for oneDNN with GELU fused into the FFN (`prepack.prepack_linears`, fp32: same outputs to
fp32 rounding; `prepack=False` or `BERTKIT_PREPACK=0` keeps plain layers).
Options: `threads` (torch intra-op threads), `int8` (dynamic int8 quantisation of the Linear
layers, per output channel; its agreement with fp32 on the sample is measured at load, and
`agreement()` reports cosine / max abs diff / accuracy on any texts), `compile` (torch.compile of
the encoder), `backend="onnx"` (an exported graph on onnxruntime, see `onnx_export.py`),
`backend="openvino"` (the model converted by OpenVINO at load: the fastest short requests).
The numerics live in packing.py, prepack.py, model.py and hardware.py.
"""
from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import BertConfig
from .errors import BertkitError
from .model import BertModel, pool_tokens
from .packing import Packed, pack_rows, segment_ids
from .prepack import prepack_linear, prepack_linears
from .tokenizer import Encoding, Tokenizer

log = logging.getLogger("bertkit")

POOLINGS = ("mean", "cls", "pooler", "none")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}   # (the commands' --precision names)
BF16_MIN_COSINE = 0.999     # the bf16 default keeps every sample sentence, token state and head output this close to fp32


class PredictorError(BertkitError, ValueError):
    """A request the loaded checkpoint cannot answer (wrong head, no [MASK], bad option)."""


@dataclass
class Batch:
    """One length bucket: which inputs it holds, padded and packed."""
    index: list[int]              # positions of these inputs in the caller's list
    padded: dict[str, Tensor] | None  # (B, T) input_ids, token_type_ids, attention_mask (onnx backend only)
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


def split_packed(x: Tensor, p: Packed) -> list[Tensor]:
    """(N, ...) -> one (T_b, ...) tensor per sequence."""
    return list(torch.split(x, (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).tolist()))


def quantize_int8(model: nn.Module, down_dtype: torch.dtype = torch.float32) -> nn.Module:
    """Dynamic int8 quantisation of the encoder blocks' nn.Linear layers: weights int8 with one
    scale per output channel, activations quantised per batch at run time to the full 8-bit range.

    torch's default (one weight scale per tensor, activations on 7 bits: `reduce_range`) drops
    all-MiniLM-L6-v2's sentence embeddings to cosine ~0.97 against fp32; per-channel weights and
    8-bit activations give min 0.982 on the benchmark's 64 sequences. The FFN's down projection,
    whose input (GELU outputs, heavy-tailed) loses most to one activation scale per batch, stays
    in `down_dtype` (bf16 where it is fast, else fp32; prepacked): min cosine 0.994 there (0.98
    on one-word texts), for a third of the GEMM work taken out of int8. The embeddings, the
    pooler and the task head stay fp32."""
    import warnings

    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
    from torch.ao.quantization import quantize_dynamic
    from torch.ao.quantization.qconfig import per_channel_dynamic_qconfig

    from .model import Block

    class Int8Linear(DynamicLinear):
        def forward(self, x: Tensor) -> Tensor:
            return torch.ops.quantized.linear_dynamic(x, self._packed_params._packed_params, reduce_range=False)

    spec = {name: per_channel_dynamic_qconfig for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and ".blocks." in f".{name}" and not name.endswith("mlp.down")}
    with warnings.catch_warnings():        # torch.ao.quantization is deprecated in favour of torchao
        warnings.simplefilter("ignore")
        model = quantize_dynamic(model, spec, inplace=False)
    for m in model.modules():
        if type(m) is DynamicLinear:
            m.__class__ = Int8Linear
        if isinstance(m, Block):
            m.mlp.down = prepack_linear(m.mlp.down.to(down_dtype), cast=True)
    return model


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
        self.session = session                          # onnxruntime.InferenceSession or OpenVINOSession
        self.backend = getattr(session, "backend", "onnx") if session is not None else "torch"
        cfg = model.config
        self.config = cfg
        from .checkpoint import length_limit
        self.max_length = length_limit(cfg, max_length)   # ALiBi: any length asked for (no position table)
        self.head = getattr(model, "head", "encoder")
        self.output_names: tuple[str, ...] = tuple(getattr(model, "output_names", ()))   # the head's contract
        self.per_token = bool(getattr(model, "per_token", False))
        # config.json's keys beyond the architecture (id2label, bertkit_stride, ...) are in cfg.extra
        self.labels = labels or {int(k): v for k, v in (cfg.extra.get("id2label") or {}).items()}
        self.int8 = False
        self.compiled = False
        self.prepacked = False
        self.precision = str(next(model.parameters()).dtype).replace("torch.", "")
        self.precision_reason = "as loaded"
        self.precision_check: dict | None = None        # agreement with fp32 on the sample (bf16, int8)
        # int8 vs a separately loaded fp32 model on the bundled sample sentences (`agreement`); set by
        # `bertkit serve --int8` (commands.serve.report_int8), shown by its /v1/model
        self.int8_agreement: dict | None = None
        self.null_threshold: float | None = None      # SQuAD v2.0: overrides the checkpoint's (serve --null-threshold)
        self.small = None                               # onnx_graph.SmallBatches: short batches on onnxruntime / OpenVINO
        self.small_reason = "not asked for"
        self.source: Path | None = None                 # the checkpoint folder (from_dir): /v1/inspect reloads it

    # ---- loading -------------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: str | Path, head: str | None = None, device: str | None = None,
                 threads: int | None = None, int8: bool = False, compile: bool = False,
                 backend: str = "torch", max_length: int | None = None,
                 onnx_file: str | Path | None = None, dtype: str | torch.dtype | None = None,
                 prepack: bool = True, small_batches: bool | int = True,
                 config_json: tuple[BertConfig, dict] | None = None) -> "Predictor":
        """Load a checkpoint folder (HF format + tokenizer files).

        head: which head to load (default: the one config.json names); device: 'cpu', 'cuda', ...
        (default cuda when available); threads: torch intra-op threads; int8: quantise the Linear
        layers; compile: torch.compile the encoder; backend 'onnx': run `onnx_file` (default
        DIR/model.onnx) on onnxruntime, tokenization and post-processing stay here; backend
        'openvino': the model converted by OpenVINO at load (needs `openvino`; the lowest
        latency for short requests on the CPU); dtype: None
        or 'auto' (bf16 on a CPU where it is faster and accurate, else fp32; see the module
        docstring), 'float32', 'bfloat16' or 'float16' (GPU; the packed path then runs varlen
        flash attention); prepack: on the CPU in fp32 or bf16 (no int8, no compile), reorder the
        encoder's Linear weights for oneDNN and fuse the FFN's GELU (`prepack.prepack_linears`);
        small_batches: on the CPU, with onnxruntime or OpenVINO installed, run batches of few
        tokens on the engine that follows the fp32 model and times fastest at load, if ahead of
        PyTorch (`onnx_graph.py`: the lower latency of one short request; 1-3 s more at load, a
        second copy of the weights); an int N sends every batch of <= N padded tokens to the
        first engine that agrees, untimed; False none (`BERTKIT_SMALL_BATCHES=0|N|auto` decides
        for the default True); config_json: the folder's config.json as `checkpoint.read_config`
        returns it, when the caller has read it already (`bertkit predict` reads it once).
        """
        from .checkpoint import check_inputs_fit, load_model

        path = Path(path)
        if backend not in ("torch", "onnx", "openvino"):
            raise PredictorError(f"backend must be 'torch', 'onnx' or 'openvino', not {backend!r}")
        dt = _parse_dtype(dtype)
        if backend != "torch" and (int8 or compile):
            raise PredictorError(f"int8 and compile apply to backend torch, not {backend}")
        if int8 and dt not in (None, torch.float32):
            raise PredictorError("dtype and int8 are exclusive")
        if threads:
            torch.set_num_threads(int(threads))
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = load_model(path, head=head, config_json=config_json)
        model.eval()
        tokenizer = Tokenizer.from_dir(path)
        check_inputs_fit(model.config, tokenizer.vocab_size, max_length, where=path)
        max_len = max_length or _read_max_length(path, model.config.max_position_embeddings)
        if backend == "onnx":
            from .onnx_export import load_session
            onnx_path = Path(onnx_file) if onnx_file else path / "model.onnx"
            session = load_session(onnx_path, threads=threads, device=device)
            p = cls(model, tokenizer, device="cpu", max_length=max_len, session=session)
            p.precision, p.precision_reason = "float32", f"onnxruntime on {onnx_path.name}"
            p.source = path
            return p
        if backend == "openvino":
            p = cls._openvino(model, tokenizer, max_len, threads, dt)
            p.source = path
            return p
        if int8 and str(device).startswith("cuda"):
            raise PredictorError("int8 dynamic quantisation runs on the CPU only; use --device cpu")
        p = cls(model.to(device), tokenizer, device=device, max_length=max_len)
        p.source = path
        small = _small_batches_setting(small_batches)
        off = ("small_batches=False" if not small_batches else "BERTKIT_SMALL_BATCHES=0" if not small
               else "compile=True" if compile else "int8 runs on PyTorch" if int8
               else f"on {p.device.type}" if p.device.type != "cpu"
               else f"dtype={_dtype_name(dt)} asked for (the engines start from fp32 weights)"
               if dt not in (None, torch.float32) else None)
        if off:
            p.small_reason, small = f"off: {off}", False
        p._choose_precision(dt, bool(int8), prepack=prepack and not compile, small=small)
        log.info("precision %s: %s", p.precision, p.precision_reason)
        if small:
            log.info("short batches: %s", p.small_reason)
        if compile:
            p.compile()
        return p

    @classmethod
    def _openvino(cls, model: nn.Module, tokenizer: Tokenizer, max_len: int, threads: int | None,
                  dtype: torch.dtype | None) -> "Predictor":
        """The model converted and compiled by OpenVINO for the CPU (onnx_export.load_openvino).
        dtype None: OpenVINO's own precision (bf16 where the CPU has it) if the sample keeps
        cosine >= 0.999 to fp32 (torch), else fp32."""
        from .onnx_export import load_openvino

        if dtype not in (None, torch.float32, torch.bfloat16):
            raise PredictorError("backend openvino runs float32 or bfloat16")
        name = _dtype_name(dtype) if dtype is not None else None
        p = cls(model, tokenizer, device="cpu", max_length=max_len, session=load_openvino(model, threads, name))
        p.precision, p.precision_reason = p.session.precision, "OpenVINO " + ("asked for" if name else "default")
        if p.precision != "float32":
            p.precision_check = p._check_against(model)
            cos = min(p.precision_check["cosine_min"], p.precision_check["token_cosine_min"],
                      p.precision_check.get("head_cosine_min", 1.0))
            p.precision_reason += f"; cosine {cos:.5f} to fp32 on the sample"
            if cos < BF16_MIN_COSINE and name is None:
                p.session = load_openvino(model, threads, "float32")
                p.precision, p.precision_check = "float32", None
                p.precision_reason = f"OpenVINO's default lost too much (cosine {cos:.5f} < {BF16_MIN_COSINE}): float32"
        log.info("OpenVINO backend, %s: %s", p.precision, p.precision_reason)
        return p

    def _choose_precision(self, dtype: torch.dtype | None, int8: bool, prepack: bool, small: bool | int = False) -> None:
        """Set self.model to the int8 / bf16 / fp32 model that will run, and say why (and, on the
        CPU when `small`, the engine of short batches: `_small_batches`)."""
        from . import hardware

        fp32 = self.model
        if int8:
            cfg = self.config
            down = torch.bfloat16 if hardware.bf16_fast(cfg.hidden_size, cfg.intermediate_size) else torch.float32
            self.model, self.int8, self.precision = quantize_int8(fp32, down), True, "int8"
            self.precision_check = self._check_against(fp32)
            self.precision_reason = (f"int8=True (dynamic, per output channel; FFN down projection in "
                                     f"{_dtype_name(down)}); cosine {self.precision_check['cosine_min']:.4f} "
                                     "to fp32 on the sample")
            return
        if dtype is not None:
            self.model, self.precision = fp32.to(dtype), _dtype_name(dtype)
            self.precision_reason = f"dtype={self.precision} asked for"
        elif self.device.type != "cpu":
            self.precision, self.precision_reason = "float32", (
                f"default on {self.device.type} (dtype='bfloat16' or 'float16' for the tensor cores)")
        else:
            cfg = self.config
            caps = hardware.capabilities(cfg.hidden_size, cfg.intermediate_size)
            self.precision, self.precision_reason = "float32", caps.reason
            if caps.bf16_fast:
                bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
                packed = prepack and prepack_linears(bf16)
                self.model = bf16
                check = self._check_against(fp32)
                cos = min(check["cosine_min"], check["token_cosine_min"], check.get("head_cosine_min", 1.0))
                if cos >= BF16_MIN_COSINE:
                    self.precision, self.prepacked, self.precision_check = "bfloat16", packed, check
                    self.precision_reason = f"{caps.reason}; cosine {cos:.5f} to fp32 on the sample"
                    engines = self._small_engines(_encoder_of(fp32)) if small else None
                    if engines:
                        self._small_batches(engines, small, _encoder_of(fp32))
                    return
                self.model = fp32
                self.precision_reason = (f"{caps.reason}, but bf16 cosine {cos:.5f} < {BF16_MIN_COSINE} to fp32 "
                                         "on the sample")
        engines = self._small_engines(self.encoder) if small else None   # from the plain weights, before prepacking
        if prepack and self.device.type == "cpu":
            self.prepacked = prepack_linears(self.model)
        if engines:
            self._small_batches(engines, small)

    def _small_engines(self, fp32_encoder: BertModel) -> dict[str, Any]:
        """The installed engines of short batches on the encoder's graph (onnx_graph.load_engines)."""
        from .onnx_graph import load_engines

        engines, why = load_engines(fp32_encoder, torch.get_num_threads())
        if not engines:
            self.small_reason = why
        return engines

    def _small_batches(self, engines: dict[str, Any], small: bool | int, reference: BertModel | None = None) -> None:
        """Keep the engine of short batches that follows the fp32 model and times fastest here, if
        any (onnx_graph.choose_engine), and say why."""
        from .onnx_graph import choose_engine

        self.small, self.small_reason = choose_engine(self, engines, small, sample_rows(self.tokenizer, self.max_length),
                                                      BF16_MIN_COSINE, reference)

    def _check_against(self, reference: nn.Module) -> dict[str, float]:
        """How closely this model follows `reference` (fp32) on the sample texts: cosine of the
        last hidden states per sentence (mean-pooled: `cosine_min`, `cosine_mean`) and per token,
        and for a task head the cosine of each text's outputs (logits, token logits or span
        logits, flattened: `head_cosine_min`; a masked-LM head's vocabulary logits are left out, the
        states they are computed from are compared)."""
        rows = sample_rows(self.tokenizer, self.max_length)
        task = bool(self.output_names) and "mlm_logits" not in self.output_names

        def run(p: "Predictor") -> list[tuple[np.ndarray, np.ndarray | None]]:
            def fn(b: Batch) -> list:
                h = split_packed(p.hidden(b).float().cpu(), _cpu(b.packed))
                if not task:
                    return [(x.numpy(), None) for x in h]
                per_text = p.per_input(b, p.head_outputs(b))
                return [(x.numpy(), np.concatenate([y.flatten() for y in ys])) for x, ys in zip(h, per_text)]
            return p._run(rows, fn)

        a, b = run(self), run(Predictor(reference, self.tokenizer, self.device, self.max_length))
        sent = np.array([_cosine(x.mean(0), y.mean(0)) for (x, _), (y, _) in zip(a, b)])
        tok = np.concatenate([_cosine(x, y) for (x, _), (y, _) in zip(a, b)])
        report = {"texts": len(rows), "tokens": int(tok.size), "cosine_min": float(sent.min()),
                  "cosine_mean": float(sent.mean()), "token_cosine_min": float(tok.min()),
                  "max_abs_diff": float(max(np.abs(x - y).max() for (x, _), (y, _) in zip(a, b)))}
        if task:
            report["head_cosine_min"] = float(min(_cosine(x, y) for (_, x), (_, y) in zip(a, b)))
        return report

    def describe(self) -> dict:
        """What runs and why: backend, device, precision (and the reason, and the agreement with
        fp32 measured at load), prepacked / compiled, threads, and the CPU's bf16 summary."""
        info = {"backend": self.backend, "device": str(self.device), "precision": self.precision,
                "precision_reason": self.precision_reason, "precision_check": self.precision_check,
                "prepacked": self.prepacked, "compiled": self.compiled, "threads": torch.get_num_threads(),
                "small_batches": {**(self.small.describe() if self.small is not None else {"engine": None}),
                                  "reason": self.small_reason}}
        if self.device.type == "cpu":
            from .hardware import cpu_flags, cpu_model
            info["cpu"] = f"{cpu_model()} ({' '.join(cpu_flags())}; torch {torch.backends.cpu.get_cpu_capability()})"
        return info

    def compile(self) -> "Predictor":
        """torch.compile the encoder (dynamic shapes: packed batches change size every call).

        Compiled with inductor's `freezing`: a Predictor never changes its weights, so they are
        folded in as constants and pre-packed for the CPU GEMM kernels. On the CPU that is about
        what the eager `prepack` path already does (fixed 32x128 batch, one run: 1.39x eager
        transformers compiled, 1.37x prepacked, 1.04x plain), so compile=True replaces prepacking.
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
        return _encoder_of(self.model)

    # ---- the shared batch loop -----------------------------------------------------------------
    def encode(self, texts: Sequence[str], pairs: Sequence[str | None] | None = None,
               max_length: int | None = None) -> list[Encoding]:
        if isinstance(texts, str):
            raise PredictorError("texts must be a list of strings, not one string")
        if pairs is not None and len(pairs) != len(texts):
            raise PredictorError(f"{len(texts)} texts but {len(pairs)} pairs")
        limit = min(max_length or self.max_length, self.max_length)
        return self.tokenizer.encode_batch(list(texts), list(pairs) if pairs is not None else None, limit)

    def pad(self, rows: Sequence[tuple[Sequence[int], Sequence[int]]]) -> dict[str, Tensor]:
        """(input_ids, token_type_ids) lists -> right-padded (B, T) tensors with attention_mask."""
        T = max(len(r[0]) for r in rows)
        ids = torch.full((len(rows), T), self.tokenizer.pad_id, dtype=torch.long)
        types = torch.zeros((len(rows), T), dtype=torch.long)
        mask = torch.zeros((len(rows), T), dtype=torch.long)
        for i, (x, t) in enumerate(rows):
            ids[i, :len(x)] = torch.as_tensor(x)
            types[i, :len(x)] = torch.as_tensor(t)
            mask[i, :len(x)] = 1
        return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}

    def batches(self, rows: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = 32,
                max_tokens: int | None = None) -> list[Batch]:
        """Length-sorted, packed batches of (input_ids, token_type_ids) rows (not yet run)."""
        out = []
        for idx in length_buckets([len(r[0]) for r in rows], batch_size, max_tokens):
            bucket = [rows[i] for i in idx]
            padded = self.pad(bucket) if self.session is not None else None      # onnxruntime takes (B, T)
            tensors, p = pack_rows(bucket)
            if self.session is None and self.device.type != "cpu":
                tensors = {k: v.to(self.device) for k, v in tensors.items()}
                p = _packed_to(p, self.device)
            out.append(Batch(idx, padded, p, tensors))
        return out

    def hidden(self, b: Batch) -> Tensor:
        """(N, C) last-layer states of a packed batch."""
        if self.session is not None:
            return self._onnx(b)["last_hidden_state"]
        if self.small is not None and self.small.takes(b.packed):
            try:
                return self.small.hidden(self.encoder, b.tensors, b.packed)
            except Exception as e:           # an engine that fails at run time: off for good, PyTorch answers
                log.warning("the %s engine of short batches failed (%s: %s); PyTorch runs them from now on",
                            self.small.name, type(e).__name__, str(e)[:200])
                self.small, self.small_reason = None, f"off: {self.small.name} failed at run time ({type(e).__name__})"
        return self.encoder(b.tensors["input_ids"], b.tensors["token_type_ids"], None,
                            b.tensors["position_ids"], packed=b.packed)

    def head_outputs(self, b: Batch) -> dict[str, Tensor]:
        """The loaded head's `outputs` on a packed batch, by its `output_names`: per token (N, ...)
        where the head's outputs are (`per_token`), else per sequence (B, ...); on any backend."""
        if not self.output_names:
            raise PredictorError(f"the {self.head} head has no outputs")
        if self.session is not None:
            missing = [n for n in self.output_names if n not in self._onnx_outputs()]
            if missing:
                raise PredictorError(f"this ONNX file has no {missing[0]} output; export the {self.head} "
                                     f"checkpoint again")
            return self._onnx(b)
        m = self.model
        h = self.encoder(b.tensors["input_ids"], b.tensors["token_type_ids"], None, b.tensors["position_ids"],
                         packed=b.packed, all_layers=True) if m.all_layers else self.hidden(b)
        return m.outputs(h, b.packed)

    def per_input(self, b: Batch, out: dict[str, Tensor]) -> list[tuple[np.ndarray, ...]]:
        """Each input's share of a batch's head outputs: one float32 array per output name, (T, ...)
        per token or (...) per sequence."""
        if self.per_token:
            cols = [[x.numpy() for x in split_packed(out[n].float().cpu(), _cpu(b.packed))] for n in self.output_names]
        else:
            cols = [list(out[n].float().cpu().numpy()) for n in self.output_names]
        return list(zip(*cols))

    def _run(self, rows: Sequence[tuple[Sequence[int], Sequence[int]]], fn: Callable[[Batch], list],
             batch_size: int = 32, max_tokens: int | None = None, desc: str | None = None) -> list:
        """fn(batch) -> one result per row of the batch; returns results in input order (`desc`:
        a progress bar of that name on a terminal)."""
        results: list = [None] * len(rows)
        batches = self.batches(rows, batch_size, max_tokens)
        if desc:
            from tqdm.auto import tqdm
            batches = tqdm(batches, desc=desc, disable=None, leave=False)
        for b in batches:
            with torch.inference_mode():
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
        if pooling == "pooler" and (self.session is not None or self.encoder.pooler is None):
            raise PredictorError("pooling 'pooler' needs a checkpoint with pooler weights, run on PyTorch")
        encs = self.encode(texts, pairs, max_length)

        def fn(b: Batch) -> list:
            h = self.hidden(b)
            if pooling == "none":
                h = h.float()
                vecs = split_packed(F.normalize(h, dim=-1) if normalize else h, b.packed)
                return [v.cpu().numpy() for v in vecs]
            if pooling == "pooler":
                v = self.encoder.pool(h.to(self.encoder.pooler.weight.dtype), b.packed).float()
            else:
                v = pool_tokens(h.float(), pooling, b.packed)
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
            if self.session is not None:
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
        from .tasks.metrics import get_entities
        from .tasks.ner import TaggedExample, featurize_tokens, postprocess_tokens

        self._require("token_classification", "ner")
        examples, spans = [], []
        for i, t in enumerate(texts):
            words, offs = self._words(t, i)
            examples.append(TaggedExample(str(i), words, None))
            spans.append(offs)
        labels = self.label_names()
        feats = featurize_tokens(examples, self.tokenizer, None, max_length=max_length or self.max_length,
                                 stride=stride)
        tags = postprocess_tokens(self.outputs(feats, batch_size), feats, examples, labels)
        results = []
        for i, (ex, offs) in enumerate(zip(examples, spans)):
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
            words, offs, pos = list(text), [], 0
            for w in words:
                offs.append((pos, pos + len(w)))
                pos += len(w) + 1
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
        from .tasks.squad import QAExample, featurize_qa, postprocess_qa, qa_settings

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

    # ---- onnx backend --------------------------------------------------------------------------
    def _onnx_outputs(self) -> list[str]:
        return [o.name for o in self.session.get_outputs()]

    def _onnx(self, b: Batch) -> dict[str, Tensor]:
        """Run the padded batch through onnxruntime; outputs by name, repacked to (N, ...) / (B, ...)."""
        from .onnx_export import run_session
        return run_session(self.session, b.padded, b.packed, self.per_token)


def _rows(encodings: Sequence[Encoding]) -> list[tuple[list[int], list[int]]]:
    return [(e.input_ids, e.token_type_ids) for e in encodings]


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine along the last axis."""
    return (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)


def _small_batches_setting(value: bool | int) -> bool | int:
    """`small_batches` as given (False: none; N: batches of up to N tokens, untimed), or for True
    (measure at load) what BERTKIT_SMALL_BATCHES says instead: 0/off none, N untimed, auto measure."""
    import os

    if isinstance(value, bool) or value is None:
        if not value:
            return False
    elif int(value) < 1:
        raise PredictorError(f"small_batches must be True, False or a number of tokens >= 1, not {value!r}")
    else:
        return int(value)
    env = os.environ.get("BERTKIT_SMALL_BATCHES", "").strip().lower()
    if env in ("0", "off", "false", "no"):
        return False
    if env.isdigit():
        return int(env)
    if env not in ("", "auto", "on", "true", "yes"):
        raise PredictorError(f"BERTKIT_SMALL_BATCHES={env!r}: expected 0, auto or a number of tokens")
    return True


def _parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or dtype == "auto":
        return None
    dt = dtype if isinstance(dtype, torch.dtype) else DTYPES.get(str(dtype).replace("torch.", ""))
    if dt not in DTYPES.values():
        raise PredictorError(f"precision must be auto, fp32, bf16 or fp16, not {dtype!r}")
    return dt


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def sample_rows(tokenizer: Tokenizer, max_length: int) -> list[tuple[list[int], list[int]]]:
    """The fixed sample a precision is checked on: the 13 bundled sample sentences, 4 passages of
    three of them and 6 short queries (their first 1 to 8 words): 23 texts of 3 to ~100 word
    pieces, as [CLS] ... [SEP] rows cut to max_length."""
    lines = [l for l in (Path(__file__).parent / "sample" / "sample.txt").read_text(encoding="utf-8").splitlines()
             if l.strip()]
    texts = (lines + [" ".join(lines[i:i + 3]) for i in range(0, len(lines) - 1, 3)][:4]
             + [" ".join(l.split()[:n]) for l, n in zip(lines, (1, 2, 3, 4, 6, 8))])
    rows = []
    for ids in tokenizer.encode_ids(texts):
        ids = [tokenizer.cls_id, *ids[:max(max_length - 2, 0)], tokenizer.sep_id]
        rows.append((ids, [0] * len(ids)))
    return rows


def agreement(candidate: Predictor, reference: Predictor, texts: Sequence[str],
              pairs: Sequence[str | None] | None = None, labels: Sequence[Any] | None = None,
              batch_size: int = 32) -> dict[str, float]:
    """How closely `candidate` (int8, ONNX, compiled...) follows `reference` (fp32) on `texts`:
    cosine (mean and min over texts) and max abs diff of the mean-pooled embeddings - or of the
    logits for a classification head - and, when `labels` (names) are given, both accuracies
    and how often the two predict the same label."""
    def outputs(p: Predictor) -> np.ndarray:
        if p.head == "sequence_classification":
            return np.array([r["logits"] for r in p.classify(texts, pairs, raw=True, batch_size=batch_size)])
        return p.embed(texts, pairs, pooling="mean", batch_size=batch_size)

    a, b = outputs(candidate), outputs(reference)
    an, bn = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    cos = (a * b).sum(-1) / np.maximum(an * bn, 1e-12)
    report = {"n": len(texts), "cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()),
              "max_abs_diff": float(np.abs(a - b).max())}
    if reference.head == "sequence_classification" and getattr(reference.model, "problem", "") == "single_label":
        names = reference.label_names()
        pa, pb = [names[i] for i in a.argmax(-1)], [names[i] for i in b.argmax(-1)]
        report["same_label"] = float(np.mean([x == y for x, y in zip(pa, pb)]))
        if labels is not None:
            report["accuracy"] = float(np.mean([x == str(y) for x, y in zip(pa, labels)]))
            report["accuracy_reference"] = float(np.mean([x == str(y) for x, y in zip(pb, labels)]))
    return report


def _encoder_of(model: nn.Module) -> BertModel:
    return model if isinstance(model, BertModel) else model.bert


def _cpu(p: Packed) -> Packed:
    return _packed_to(p, torch.device("cpu")) if p.cu_seqlens.device.type != "cpu" else p


def _packed_to(p: Packed, device: torch.device) -> Packed:
    return Packed(p.cu_seqlens.to(device), p.max_seqlen, p.indices.to(device), p.batch_size, p.padded_len,
                  p.pad_indices.to(device), p.key_mask.to(device))
