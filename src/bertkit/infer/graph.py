"""The encoder written out as an ONNX graph from its weights, for onnxruntime's small batches.

Why a second spelling of the forward pass: on a CPU without fast bf16 (AVX2 only), one short
request is mostly 24 small GEMMs (16 rows each for a 16-token text), and onnxruntime's GEMM
(MLAS) runs them faster than oneDNN (docs/serve-measurements.md); at 1,000 rows and more the two tie, and bertkit's
padding-free batches win. So `Predictor` sends batches of few tokens here (`SmallBatches`) when
an engine is installed (onnxruntime, or OpenVINO, which runs bf16 where the CPU has it), follows
the fp32 model and measures faster at load; everything else stays on `model.py`.

The graph is built node by node from the loaded weights in well under a second; no tracer and no
exporter are involved (`torch.onnx.export`'s TorchScript path freezes shapes and masks it saw,
its dynamo path takes ~20 s for a 6-layer model). It mirrors `model.py`'s blocks exactly: attention
with Q, K, V from one MatMul, the padding mask (and ALiBi's distance penalty) added to the scores,
post-LN or pre-LN (with the final LayerNorm), the feed-forward with the checkpoint's GELU or ReLU.
Inputs: the embedding layer's output (B, T, C) float32 `embeddings` (computed by `model.py`: a
table lookup, and no second copy of the vocabulary's rows) and the (B, T) int64 `attention_mask`;
output: `last_hidden_state` (B, T, C). Heads stay in PyTorch: they read these states. Causal
encoders and other activations are not written here (`supported` says why); the Predictor then
keeps its PyTorch path. Every graph is checked against the PyTorch model at load
(`Predictor._small_batches`); a disagreement discards it.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .model import BertModel
from .packing import Packed

MAX_GRAPH_BYTES = 1_900_000_000  # the weights inside one ONNX protobuf (2 GB limit, with room for the rest)
OPSET = 20                      # LayerNormalization (17), Gelu with its tanh approximation (20)
_GELU = {"gelu": "none", "gelu_python": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh",
         "gelu_python_tanh": "tanh", "gelu_fast": "tanh", "gelu_accurate": "tanh"}


def supported(bert: BertModel) -> str | None:
    """None if `encoder_graph` can write this encoder, else why not."""
    cfg = bert.config
    if cfg.causal:
        return "a causal encoder"
    if cfg.hidden_act not in _GELU and cfg.hidden_act != "relu":
        return f"hidden_act {cfg.hidden_act}"
    if any(p.dtype != torch.float32 for p in bert.parameters()):
        return "weights not in float32"
    return None


class _Builder:
    """Nodes and initializers of one graph, each value given a fresh name."""

    def __init__(self):
        from onnx import helper, numpy_helper
        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def const(self, value: Tensor | np.ndarray | float | list, dtype=np.float32) -> str:
        arr = value.detach().float().numpy() if isinstance(value, Tensor) else value
        name = f"c{len(self.inits)}"
        self.inits.append(self.numpy_helper.from_array(np.array(arr, dtype=dtype, order="C"), name))   # 0-d stays 0-d
        return name

    def op(self, kind: str, *inputs: str, outputs: int = 1, **attrs: Any) -> Any:
        names = [f"v{self.count + i}" for i in range(outputs)]
        self.count += outputs
        self.nodes.append(self.helper.make_node(kind, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names

    def linear(self, x: str, weight: Tensor, bias: Tensor) -> str:
        """x W^T + b, the weight stored as (in, out) for MatMul."""
        return self.op("Add", self.op("MatMul", x, self.const(weight.t())), self.const(bias))

    def norm(self, x: str, ln: torch.nn.LayerNorm) -> str:
        return self.op("LayerNormalization", x, self.const(ln.weight), self.const(ln.bias),
                       axis=-1, epsilon=float(ln.eps))


def encoder_graph(bert: BertModel) -> bytes:
    """The serialized ONNX model of `bert`'s forward pass on padded inputs (see the module doc)."""
    from onnx import TensorProto, helper

    why = supported(bert)
    if why:
        raise ValueError(f"no ONNX graph for {why}")
    size = 4 * sum(p.numel() for p in bert.blocks.parameters())
    if size > MAX_GRAPH_BYTES:
        raise ValueError(f"no ONNX graph for {size / 2**30:.1f} GB of weights (one protobuf holds at most 2 GB)")
    cfg, g = bert.config, _Builder()
    H, C = cfg.num_heads, cfg.hidden_size
    D = C // H
    x = "embeddings"                              # (B, T, C): the embedding layer's output, from PyTorch
    # scores bias: 0 for real keys, the lowest float for padding                   (B, 1, 1, T)
    keep = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    bias = g.op("Mul", g.op("Sub", g.const(1.0), keep), g.const(float(np.finfo(np.float32).min)))
    bias = g.op("Unsqueeze", bias, g.const([1, 2], np.int64))
    slopes = bert.blocks[0].attn.slopes
    if slopes is not None:                       # ALiBi: - slope_h |i - j|                     (1, H, T, T)
        T = g.op("Squeeze", g.op("Shape", "attention_mask", start=1, end=2), g.const([0], np.int64))
        i = g.op("Cast", g.op("Range", g.const(0, np.int64), T, g.const(1, np.int64)), to=TensorProto.FLOAT)
        dist = g.op("Abs", g.op("Sub", g.op("Unsqueeze", i, g.const([1], np.int64)),
                                g.op("Unsqueeze", i, g.const([0], np.int64))))          # (T, T)
        bias = g.op("Add", bias, g.op("Mul", dist, g.const(-slopes.float().reshape(1, H, 1, 1))))
    scale = g.const(1.0 / math.sqrt(D))
    for block in bert.blocks:
        a = block.attn
        h = g.norm(x, block.norm1) if block.pre_norm else x
        qkv = g.linear(h, *(torch.cat([getattr(lin, p) for lin in (a.query, a.key, a.value)])
                            for p in ("weight", "bias")))                           # one MatMul: (B, T, 3C)
        y = g.op("Reshape", qkv, g.const([0, 0, 3, H, D], np.int64))                # (B, T, 3, H, D)
        y = g.op("Transpose", y, perm=[2, 0, 3, 1, 4])                                  # (3, B, H, T, D)
        q, k, v = (g.op("Gather", y, g.const(n, np.int64), axis=0) for n in range(3))  # (B, H, T, D)
        s = g.op("MatMul", g.op("Mul", q, scale), g.op("Transpose", k, perm=[0, 1, 3, 2]))   # (B, H, T, T)
        p = g.op("Softmax", g.op("Add", s, bias), axis=-1)
        ctx = g.op("Transpose", g.op("MatMul", p, v), perm=[0, 2, 1, 3])               # (B, T, H, D)
        att = g.linear(g.op("Reshape", ctx, g.const([0, 0, C], np.int64)), a.out.weight, a.out.bias)   # (B, T, C)
        if block.pre_norm:
            x = g.op("Add", x, att)
            x = g.op("Add", x, _ffn(g, g.norm(x, block.norm2), block.mlp, cfg.hidden_act))
        else:
            x = g.norm(g.op("Add", x, att), block.norm1)
            x = g.norm(g.op("Add", x, _ffn(g, x, block.mlp, cfg.hidden_act)), block.norm2)
    if bert.final_norm is not None:
        x = g.norm(x, bert.final_norm)
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    ins = [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", "sequence", C]),
           helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", C])
    graph = helper.make_graph(g.nodes, "bertkit_encoder_blocks", ins, [out], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="bertkit")
    return model.SerializeToString()


def _ffn(g: _Builder, x: str, mlp, act: str) -> str:
    up = g.linear(x, mlp.up.weight, mlp.up.bias)
    up = g.op("Relu", up) if act == "relu" else g.op("Gelu", up, approximate=_GELU[act])
    return g.linear(up, mlp.down.weight, mlp.down.bias)


@dataclass
class SmallBatches:
    """An engine (`load_engine`) for batches of at most `max_tokens` padded positions (B x T); the
    rest stay on PyTorch. The embedding layer runs in PyTorch (a table lookup), the blocks here.
    `latency_ms` holds what was timed at load (per sequence length: PyTorch and the engines),
    `agreement` how closely it follows the fp32 model on the sample texts."""
    engine: Any
    name: str
    max_tokens: int = 0
    latency_ms: dict = field(default_factory=dict)
    agreement: dict = field(default_factory=dict)

    def takes(self, p: Packed) -> bool:
        return p.batch_size * p.max_seqlen <= self.max_tokens

    def hidden(self, bert: BertModel, tensors: dict[str, Tensor], p: Packed) -> Tensor:
        """(N, C) last hidden states of a packed batch, as `bert(..., packed=p)` returns them (in
        the model's dtype)."""
        x = bert.embeddings(tensors["input_ids"], tensors["token_type_ids"], tensors["position_ids"])   # (N, C)
        dtype, x = x.dtype, x.detach().float()
        if p.batch_size == 1:                                             # one sequence: nothing to pad
            h = self.engine.run(x[None].numpy(), np.ones((1, x.shape[0]), np.int64))[0]
            return torch.from_numpy(h).to(dtype)
        buf = x.new_zeros(p.batch_size * p.max_seqlen, x.shape[-1])
        buf[p.pad_indices] = x                                            # (B * T, C), T the longest here
        h = self.engine.run(buf.view(p.batch_size, p.max_seqlen, -1).numpy(), p.key_mask.long().numpy())
        return torch.from_numpy(h).flatten(0, 1)[p.pad_indices].to(dtype)                  # (B, T, C) -> (N, C)

    def describe(self) -> dict:
        return {"engine": self.name, "precision": self.engine.precision, "max_tokens": self.max_tokens,
                "latency_ms": self.latency_ms, "agreement": self.agreement}


ENGINES = ("onnxruntime", "openvino")


def installed_engines() -> list[str]:
    """Which of ENGINES import here."""
    from importlib.util import find_spec

    return [name for name in ENGINES if find_spec(name) is not None]


class OnnxRuntimeEngine:
    """The graph on onnxruntime's CPU provider, fp32: all graph optimisations, `threads` intra-op
    threads, no spinning between runs (spinning threads would take the cores from the PyTorch
    batches that follow)."""

    precision = "float32"

    def __init__(self, graph: bytes, threads: int):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads, so.inter_op_num_threads = max(1, threads), 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(graph, so, providers=["CPUExecutionProvider"])

    def run(self, embeddings: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.session.run(None, {"embeddings": embeddings, "attention_mask": mask})[0]


class OpenVINOEngine:
    """The graph compiled by OpenVINO for the CPU with its latency hint, in OpenVINO's own precision
    (bf16 where the CPU has AMX or AVX512_BF16; the agreement check at load decides whether it may
    serve)."""

    def __init__(self, graph: bytes, threads: int):
        import io

        import openvino as ov

        from .onnx_export import openvino_precision

        core = ov.Core()
        config: dict = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": max(1, threads)}
        self.compiled = core.compile_model(core.read_model(io.BytesIO(graph)), "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.lock = threading.Lock()                     # one request object: one call at a time
        self.precision = openvino_precision(self.compiled)

    def run(self, embeddings: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with self.lock:
            out = self.request.infer([embeddings, mask])
            return np.array(out[self.compiled.outputs[0]])      # a copy: the request reuses its buffers


def load_engine(name: str, graph: bytes, threads: int):
    """One of ENGINES on the graph."""
    return {"onnxruntime": OnnxRuntimeEngine, "openvino": OpenVINOEngine}[name](graph, threads)


# ---- which engine, if any, the Predictor keeps: measured at load --------------------------------
SMALL_LENGTHS = (16, 32, 64, 128, 256)   # one-sequence lengths timed at load
TIMING_ROUNDS = 7                        # interleaved rounds per length; the fastest of each counts


def load_engines(fp32_encoder: BertModel, threads: int) -> tuple[dict[str, Any], str]:
    """Every installed engine on the encoder's graph, by name, and a reason when there is none (no
    engine installed, no graph for this encoder, or none could load it)."""
    why = supported(fp32_encoder)
    installed = installed_engines()
    if why or not installed:
        return {}, (f"no ONNX graph for {why}" if why else
                    "neither onnxruntime nor openvino is installed (pip install 'bertkit[onnx]')")
    try:
        graph = encoder_graph(fp32_encoder)
    except ValueError as e:                      # over protobuf's 2 GB
        return {}, str(e)
    engines, failed = {}, []
    for name in installed:
        try:
            engines[name] = load_engine(name, graph, threads)
        except Exception as e:            # a build that cannot take the graph: say so, keep the others
            failed.append(f"{name} could not load the graph ({type(e).__name__}: {str(e)[:100]})")
    return engines, "; ".join(failed)


def choose_engine(predictor, engines: dict[str, Any], small: bool | int, rows: list, bf16_min_cosine: float,
                  reference: BertModel | None = None) -> tuple[SmallBatches | None, str]:
    """The engine a Predictor keeps for short batches, and why (or why none). Each must follow the
    fp32 model on the sample `rows` (`reference`, default the Predictor's own encoder: an fp32
    engine of an fp32 Predictor within max abs diff 1e-3 and token cosine 0.9999; with bf16 in
    either, token cosine `bf16_min_cosine`); of those the fastest on one sequence of 16 tokens, if 5% ahead of
    PyTorch, takes batches up to the longest length (16, 32, ... 256 tokens) at which it stays
    ahead, each timed here. `small` a number: the first engine that agrees, up to that many
    tokens, untimed."""
    notes, agreeing = [], {}
    with torch.inference_mode():
        for name, engine in engines.items():
            candidate = SmallBatches(engine, name)
            candidate.agreement = _agreement(predictor, candidate, rows, reference, bf16_min_cosine)
            if candidate.agreement["ok"]:
                agreeing[name] = candidate
                if small is not True:            # a number of tokens: the first that agrees, untimed
                    break
            else:
                notes.append(f"{name} ({engine.precision}) disagrees with PyTorch on the sample (token cosine "
                             f"{candidate.agreement['token_cosine_min']:.5f}, max abs diff "
                             f"{candidate.agreement['max_abs_diff']:.3g})")
        if agreeing and small is not True:
            chosen = next(iter(agreeing.values()))
            chosen.max_tokens = int(small)
            return chosen, f"{chosen.name} for batches of up to {small} tokens, as asked (not timed)"
        if agreeing:
            chosen, note = _fastest_once(predictor, agreeing, rows)
            if chosen is not None:
                return chosen, note
            notes.append(note)
    return None, "; ".join(notes)


def _fastest_once(predictor, agreeing: dict[str, SmallBatches], rows: list) -> tuple[SmallBatches | None, str]:
    """`_fastest`, timed once per machine for a model of this shape and precision and these engines
    (`hardware.decided_once`): every later start on the machine keeps the same engine, so two
    servers of one model answer short requests alike."""
    from .hardware import decided_once

    c = predictor.config
    name = (f"short-input engine L{c.num_layers} C{c.hidden_size} H{c.num_heads} F{c.intermediate_size} "
            f"{c.hidden_act} {c.norm_position}-LN {c.position_embedding_type} {predictor.precision} "
            f"[{' '.join(f'{k}:{v.engine.precision}' for k, v in agreeing.items())}]")
    timed: dict = {}

    def decide() -> dict:
        chosen, note = _fastest(predictor, agreeing, rows)
        timed["chosen"] = chosen
        return {"engine": chosen.name if chosen else None, "max_tokens": chosen.max_tokens if chosen else 0,
                "note": note}
    d = decided_once(name, decide, lambda v: isinstance(v, dict) and (v.get("engine") in agreeing or
                                                                      v.get("engine") is None))
    if "chosen" in timed:                                # timed in this process
        return timed["chosen"], d["note"]
    if d["engine"] is None:
        return None, d["note"] + " (timed once on this machine)"
    chosen = agreeing[d["engine"]]
    chosen.max_tokens = int(d["max_tokens"])
    return chosen, d["note"] + " (timed once on this machine)"


def _fastest(predictor, agreeing: dict[str, SmallBatches], rows: list) -> tuple[SmallBatches | None, str]:
    """Time PyTorch and each engine, interleaved (`hardware.best_times`), on one sequence of each
    SMALL_LENGTHS; the fastest engine if it wins at the first length, with its reason, else None and
    why not."""
    from .hardware import best_times

    p, tok = predictor, predictor.tokenizer
    stream = [i for r in rows for i in r[0][1:-1]]
    lengths = [n for n in SMALL_LENGTHS if n <= min(p.max_length, len(stream) + 2)]
    if not lengths:
        return None, f"the model takes fewer than {SMALL_LENGTHS[0]} tokens: nothing to time"
    batch = {n: p.batches([([tok.cls_id, *stream[:n - 2], tok.sep_id], [0] * n)])[0] for n in lengths}
    run = lambda c, b: (lambda: c.hidden(p.encoder, b.tensors, b.packed))    # noqa: E731

    def ms(fns: list) -> list[float]:
        return [1e3 * t for t in best_times(fns, TIMING_ROUNDS)]

    b = batch[lengths[0]]
    ms_torch, *ms_engines = ms([lambda: p.hidden(b), *(run(c, b) for c in agreeing.values())])
    timed = dict(zip(agreeing, ms_engines))
    times = ", ".join(f"{k} {v:.2f} ms" for k, v in timed.items())
    best = min(timed, key=timed.get)
    if timed[best] > 0.95 * ms_torch:
        return None, f"not faster than PyTorch on {lengths[0]} tokens here ({times} vs {ms_torch:.2f} ms)"
    chosen = agreeing[best]
    chosen.latency_ms[lengths[0]] = {"torch": round(ms_torch, 3), **{k: round(v, 3) for k, v in timed.items()}}
    chosen.max_tokens = lengths[0]
    for n in lengths[1:]:
        t_torch, t = ms([lambda: p.hidden(batch[n]), run(chosen, batch[n])])
        chosen.latency_ms[n] = {"torch": round(t_torch, 3), best: round(t, 3)}
        if t > 0.95 * t_torch:
            break
        chosen.max_tokens = n
    return chosen, (f"{best} ({chosen.engine.precision}) faster up to {chosen.max_tokens} tokens here "
                    f"({times} vs PyTorch {ms_torch:.2f} ms at {lengths[0]})")


def _agreement(predictor, candidate: SmallBatches, rows: list, reference: BertModel | None,
               bf16_min_cosine: float) -> dict:
    """How closely an engine follows the fp32 model on the sample rows."""
    ref_encoder = reference if reference is not None else predictor.encoder
    diff, cos = 0.0, 1.0
    for b in predictor.batches(rows, batch_size=8):
        t = b.tensors
        ref = ref_encoder(t["input_ids"], t["token_type_ids"], None, t["position_ids"], packed=b.packed).float()
        got = candidate.hidden(predictor.encoder, t, b.packed).float()
        diff = max(diff, float((ref - got).abs().max()))
        cos = min(cos, float(torch.nn.functional.cosine_similarity(ref, got, dim=-1).min()))
    fp32 = candidate.engine.precision == "float32" and predictor.precision == "float32"   # bf16 anywhere: bf16's bar
    ok = (diff <= 1e-3 and cos >= 0.9999) if fp32 else cos >= bf16_min_cosine
    return {"texts": len(rows), "max_abs_diff": diff, "token_cosine_min": cos, "ok": ok}
