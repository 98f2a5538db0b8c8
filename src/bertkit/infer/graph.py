"""The encoder written out as an ONNX graph from its weights (for `engines.GraphEngine`, and with
its head for `bertkit export onnx`).

Why a second spelling of the forward pass: on a CPU without fast bf16 (AVX2 only), one short
request is mostly 24 small GEMMs (16 rows each for a 16-token text), and onnxruntime's GEMM
(MLAS) runs them faster than oneDNN (docs/serve-measurements.md); at 1,000 rows and more the two
tie, and bertkit's padding-free batches win. OpenVINO runs the graph in standard operators (bf16
where the CPU has it), onnxruntime in its own fused ones (`encoder_graph(fused=True)`).

The graph is built node by node from the loaded weights in a fraction of a second and written in
ONNX's protobuf format directly: no `onnx` package (whose import took longer than the graph,
docs/serve-measurements.md), no tracer and no exporter (`torch.onnx.export`'s TorchScript path
freezes shapes and masks it saw, its dynamo path is slow and needs onnxscript). It mirrors
`model.py`'s blocks exactly: attention with Q, K, V from one MatMul, the padding mask (and the
causal mask, ALiBi's distance penalty) added to the scores, post-LN or pre-LN (with the final
LayerNorm), the feed-forward with the checkpoint's activation.
Inputs: the (B, T) int64 `input_ids`, `attention_mask` and `token_type_ids`, right-padded; the graph
looks the embeddings up itself (word + segment + position rows, LayerNorm), so a short request is one
runtime call with no PyTorch op before it (measured in docs/serve-measurements.md; the price: a
second copy of the vocabulary's rows in the graph);
output: `last_hidden_state` (B, T, C), then the head's outputs where one is given (`_head`; the
Predictor's engines leave heads in PyTorch). Every graph is checked against the PyTorch model before
use (`choose.py` at load, `export.py` before the file is written); a disagreement discards it.
"""
from __future__ import annotations

import math
import struct
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ..model import (GELU_APPROXIMATE, BertForMultipleChoice, BertForPreTraining, BertForQuestionAnswering,
                     BertForSequenceClassification, BertForTokenClassification, BertModel)
from ..probe import ProbeModel
from .engines import INPUTS
from .prepack import qkv_linear

MAX_GRAPH_BYTES = 1_900_000_000  # the weights inside one ONNX protobuf (2 GB limit, with room for the rest)
MS = "com.microsoft"             # onnxruntime's operators (`encoder_graph(fused=True)`)
OPSET = 20                      # LayerNormalization (17), Gelu with its tanh approximation (20)
IR_VERSION = 10                 # the ONNX file format of opset 20 and 21
FLOAT, INT8, INT32, INT64 = 1, 3, 6, 7                        # onnx.TensorProto's element types
_ELEMENT = {np.dtype(np.float32): FLOAT, np.dtype(np.int8): INT8, np.dtype(np.int32): INT32,
            np.dtype(np.int64): INT64}


def supported(bert: BertModel) -> str | None:
    """None if `encoder_graph` can write this encoder, else why not."""
    if any(p.dtype != torch.float32 for p in bert.parameters()):
        return "weights not in float32"
    return None


class _Builder:
    """Nodes and initializers of one graph, each value given a fresh name."""

    def __init__(self, int8: bool = False, fused: bool = False, levels: int = 127, down_int8: bool = True):
        self.int8, self.fused, self.levels, self.down_int8 = int8, fused, levels, down_int8
        self.nodes, self.inits, self.count, self.params = [], [], 0, {}

    def const(self, value: Tensor | np.ndarray | float | list, dtype=np.float32) -> str:
        if isinstance(value, nn.Parameter) and id(value) in self.params:      # a tied weight: one copy
            return self.params[id(value)][1]
        arr = value.detach().float().numpy() if isinstance(value, Tensor) else value
        name = f"c{len(self.inits)}"
        self.inits.append(_tensor(name, np.asarray(arr, dtype=dtype, order="C")))      # 0-d stays 0-d
        if isinstance(value, nn.Parameter):       # held, so a freed temporary's id is never a new one's
            self.params[id(value)] = (value, name)
        return name

    def op(self, kind: str, *inputs: str, outputs: int = 1, domain: str = "", **attrs: Any) -> Any:
        names = [f"v{self.count + i}" for i in range(outputs)]
        self.count += outputs
        self.nodes.append(_node(kind, inputs, names, domain, **attrs))
        return names[0] if outputs == 1 else names

    def linear(self, x: str, weight: Tensor, bias: Tensor, int8: bool = True) -> str:
        """x W^T + b, the weight stored as (in, out) for MatMul. With `int8` (the builder's and this
        call's), the weight int8 with one scale per output channel (max |w| / `levels`): behind a
        DequantizeLinear, which OpenVINO runs as int8 weights; `fused` (onnxruntime), in its
        DynamicQuantizeMatMul, which quantizes the activations per tensor at run time."""
        w = weight.detach().float().t()                                    # (in, out)
        if self.int8 and int8:
            scale = w.abs().amax(0).clamp_min(1e-12) / self.levels
            q = self.const(torch.round(w / scale).clamp(-self.levels, self.levels).to(torch.int8).numpy(), np.int8)
            if self.fused:
                return self.op("DynamicQuantizeMatMul", x, q, self.const(scale), "", self.const(bias), domain=MS)
            w_in = self.op("DequantizeLinear", q, self.const(scale), axis=1)
        else:
            w_in = self.const(w)
        return self.op("Add", self.op("MatMul", x, w_in), self.const(bias))

    def norm(self, x: str, ln: torch.nn.LayerNorm) -> str:
        return self.op("LayerNormalization", x, self.const(ln.weight), self.const(ln.bias),
                       axis=-1, epsilon=float(ln.eps))


def encoder_graph(bert: BertModel, int8: bool = False, fused: bool = False, levels: int = 127,
                  ranges: Sequence[Tensor] | None = None, head: nn.Module | None = None,
                  fused_inputs: bool = True, down_int8: bool | None = None) -> bytes:
    """The serialized ONNX model of `bert`'s forward pass on padded inputs (see the module doc);
    with `head` (the model `bert` belongs to: `bertkit export onnx`), its `outputs` by its
    `output_names` after `last_hidden_state` (`_head`).
    `int8`: the blocks' Linear weights int8, one scale per output channel, |w| up to `levels`
    (`_Builder.linear`); `fused`: for onnxruntime only, in its own operators: the embeddings and
    each attention as one (EmbedLayerNormalization, Attention: 77 nodes a call instead of 170) where
    `fusable` allows, and with `int8` each Linear but attention's and the FFN's down projection as
    one DynamicQuantizeMatMul (the down projection in fp32, as in `int8.quantize_int8`). That
    operator quantizes its input per tensor, so a few channels with large values set the step of
    all; with `ranges` (`ffn_input_ranges`) the FFN's input is smoothed first (SmoothQuant, Xiao et
    al. 2023: x_j / s_j into the GEMM, row j of W^T times s_j, s_j = sqrt(range_j / max |W_:j|)),
    which keeps the int8 class's agreement where the plain graph lost it (docs/serve-measurements.md).
    `fused_inputs` False keeps the embeddings and attention in standard operators under `fused`
    (`bertkit export onnx --int8`: EmbedLayerNormalization reads each row's length from its mask, so
    it takes right padding only, and an exported file takes any mask); `down_int8` (default: not
    `fused`) whether the FFN's down projection is int8 too."""
    if why := supported(bert):
        raise ValueError(f"no ONNX graph for {why}")
    size = 4 * sum(p.numel() for p in (bert if head is None else head).parameters())   # tied weights once
    if size > MAX_GRAPH_BYTES:
        raise ValueError(f"no ONNX graph for {size / 2**30:.1f} GB of weights (one protobuf holds at most 2 GB)")
    g = _Builder(int8, fused, levels, down_int8=not fused if down_int8 is None else down_int8)
    x, attend = _fused_inputs(g, bert) if fused and fused_inputs and fusable(bert) else _inputs(g, bert)
    states = [x]                                                  # the embeddings' and each block's output
    for i, block in enumerate(bert.blocks):
        h = g.norm(x, block.norm1) if block.pre_norm else x
        att = g.linear(attend(h, block.attn), block.attn.out.weight, block.attn.out.bias)   # (B, T, C)
        if block.pre_norm:
            x = g.op("Add", x, att)
            x = g.op("Add", x, _ffn(g, g.norm(x, block.norm2), block.mlp, bert.config.hidden_act, ranges, i))
        else:
            x = g.norm(g.op("Add", x, att), block.norm1)
            x = g.norm(g.op("Add", x, _ffn(g, x, block.mlp, bert.config.hidden_act, ranges, i)), block.norm2)
        states.append(x)
    if bert.final_norm is not None:
        states[-1] = x = g.norm(x, bert.final_norm)
    outputs = {"last_hidden_state": (x, [bert.config.hidden_size]),
               **(_head(g, head, states) if head is not None else {})}
    g.nodes += [_node("Identity", [value], [name]) for name, (value, _) in outputs.items()]
    ins = [_value_info(name, INT64, ["batch", "sequence"]) for name in INPUTS]
    per_token = lambda name: name == "last_hidden_state" or getattr(head, "per_token", False)   # noqa: E731
    outs = [_value_info(name, FLOAT, ["batch", *["sequence"] * per_token(name), *dims])
            for name, (_, dims) in outputs.items()]
    graph = _message(*[_field(1, n) for n in g.nodes], _field(2, "bertkit_encoder"),
                     *[_field(5, t) for t in g.inits], *[_field(11, v) for v in ins], *[_field(12, v) for v in outs])
    opsets = [("", OPSET)] + ([(MS, 1)] if fused else [])
    model = _message(_field(1, IR_VERSION), _field(2, "bertkit"), _field(7, graph),
                     *[_field(8, _message(_field(1, domain), _field(2, version))) for domain, version in opsets])
    return b"".join(model)          # the weights' one copy into the model: views of them until here


# ---- ONNX's protobuf, written directly (the `onnx` package is not needed to run a graph) -------------
# A message is a list of byte chunks of its wire format, the weights' as views of their arrays, joined
# once at the end. Field numbers from onnx.proto: NodeProto input 1, output 2, op_type 4, attribute 5,
# domain 7; AttributeProto name 1, f 2, i 3, s 4, ints 8, type 20; TensorProto dims 1, data_type 2,
# name 8, raw_data 9 (little-endian); GraphProto node 1, name 2, initializer 5, input 11, output 12;
# ValueInfoProto name 1, type 2; TypeProto tensor_type 1 (elem_type 1, shape 2: dim 1: dim_value 1,
# dim_param 2); ModelProto ir_version 1, producer_name 2, graph 7, opset_import 8 (domain 1, version 2).
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1                                  # negative ints as 64-bit two's complement
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, value) -> list:
    """The chunks of field `number` holding `value`: an int as a varint, a float as 32 bits, a str,
    bytes, view or message (a list of chunks) length-delimited."""
    if isinstance(value, int):
        return [_varint(number << 3), _varint(value)]
    if isinstance(value, float):
        return [_varint(number << 3 | 5), struct.pack("<f", value)]
    chunks = value if isinstance(value, list) else [value.encode() if isinstance(value, str) else value]
    return [_varint(number << 3 | 2), _varint(sum(len(c) for c in chunks)), *chunks]


def _message(*fields: list) -> list:
    return [chunk for f in fields for chunk in f]


def _node(kind: str, inputs: Sequence[str], outputs: Sequence[str], domain: str = "", **attrs: Any) -> list:
    return _message(*[_field(1, i) for i in inputs], *[_field(2, o) for o in outputs], _field(4, kind),
                    *[_field(5, _attribute(k, v)) for k, v in attrs.items()], _field(7, domain) if domain else [])


def _attribute(name: str, value: int | float | str | Sequence[int]) -> list:
    if isinstance(value, (int, float, str)):      # type INT 2, FLOAT 1, STRING 3 in fields i 3, f 2, s 4
        number, kind = {int: (3, 2), float: (2, 1), str: (4, 3)}[type(value)]
        return _message(_field(1, name), _field(number, value), _field(20, kind))
    return _message(_field(1, name), *[_field(8, i) for i in value], _field(20, 7))   # INTS


def _tensor(name: str, arr: np.ndarray) -> list:
    """`arr` (C order, as `_Builder.const` makes it) as a TensorProto; its bytes a view, not a copy."""
    return _message(*[_field(1, d) for d in arr.shape], _field(2, _ELEMENT[arr.dtype]), _field(8, name),
                    _field(9, memoryview(arr.reshape(-1).view(np.uint8))))


def _value_info(name: str, element: int, dims: Sequence[int | str]) -> list:
    shape = _message(*[_field(1, _field(2, d) if isinstance(d, str) else _field(1, d)) for d in dims])
    tensor_type = _message(_field(1, element), _field(2, shape))
    return _message(_field(1, name), _field(2, _field(1, tensor_type)))


def _inputs(g: _Builder, bert: BertModel):
    """The embeddings (B, T, C), and attention in standard operators as a function of (h, the block's
    attention): the padding mask (and ALiBi's distance penalty) added to the scaled scores."""
    H, C = bert.config.num_heads, bert.config.hidden_size
    D = C // H
    x = _embeddings(g, bert.embeddings)
    # scores bias: 0 for real keys, the lowest float for padding                   (B, 1, 1, T)
    keep = g.op("Cast", "attention_mask", to=FLOAT)
    bias = g.op("Mul", g.op("Sub", g.const(1.0), keep), g.const(float(np.finfo(np.float32).min)))
    bias = g.op("Unsqueeze", bias, g.const([1, 2], np.int64))
    slopes = bert.blocks[0].attn.slopes
    if slopes is not None or bert.config.causal:
        i = g.op("Cast", _positions(g), to=FLOAT)
        query, key = g.op("Unsqueeze", i, g.const([1], np.int64)), g.op("Unsqueeze", i, g.const([0], np.int64))
    if slopes is not None:                       # ALiBi: - slope_h |i - j|                     (1, H, T, T)
        dist = g.op("Abs", g.op("Sub", query, key))                                      # (T, T)
        bias = g.op("Add", bias, g.op("Mul", dist, g.const(-slopes.float().reshape(1, H, 1, 1))))
    if bert.config.causal:                       # no key after the query                       (T, T)
        later = g.op("Cast", g.op("Greater", key, query), to=FLOAT)
        bias = g.op("Add", bias, g.op("Mul", later, g.const(float(np.finfo(np.float32).min))))
    scale = g.const(1.0 / math.sqrt(D))

    def attend(h: str, a) -> str:
        qkv = qkv_linear(a)                                                             # one GEMM
        y = g.op("Reshape", g.linear(h, qkv.weight, qkv.bias), g.const([0, 0, 3, H, D], np.int64))  # (B, T, 3, H, D)
        y = g.op("Transpose", y, perm=[2, 0, 3, 1, 4])                                  # (3, B, H, T, D)
        q, k, v = (g.op("Gather", y, g.const(n, np.int64), axis=0) for n in range(3))  # (B, H, T, D)
        s = g.op("MatMul", g.op("Mul", q, scale), g.op("Transpose", k, perm=[0, 1, 3, 2]))   # (B, H, T, T)
        p = g.op("Softmax", g.op("Add", s, bias), axis=-1)
        ctx = g.op("Transpose", g.op("MatMul", p, v), perm=[0, 2, 1, 3])               # (B, T, H, D)
        return g.op("Reshape", ctx, g.const([0, 0, C], np.int64))
    return x, attend


def ffn_input_ranges(bert: BertModel, batches: Iterable) -> list[Tensor]:
    """Per block, max |x_j| of each channel at the FFN's input over `batches` (engines.Batch, packed):
    what `encoder_graph` smooths the int8 graph for onnxruntime with."""
    out = [torch.zeros(bert.config.hidden_size) for _ in bert.blocks]

    def seen(i: int):
        def hook(module, args):
            out[i] = torch.maximum(out[i], args[0].detach().float().abs().reshape(-1, out[i].numel()).amax(0))
        return hook
    handles = [block.mlp.up.register_forward_pre_hook(seen(i)) for i, block in enumerate(bert.blocks)]
    try:
        with torch.inference_mode():
            for b in batches:
                t = b.tensors
                bert(t["input_ids"], t["token_type_ids"], None, t["position_ids"], packed=b.packed)
    finally:
        for h in handles:
            h.remove()
    return out


def fusable(bert: BertModel) -> bool:
    """Whether onnxruntime's fused operators express this encoder: a position table (no ALiBi)
    and a bidirectional mask."""
    return bert.embeddings.position is not None and bert.blocks[0].attn.slopes is None and not bert.config.causal


def _fused_inputs(g: _Builder, bert: BertModel):
    """As `_inputs`, in onnxruntime's own operators: EmbedLayerNormalization (word + segment +
    position rows, LayerNorm, and each row's length from the right-padded mask) and Attention (Q, K,
    V from one GEMM, scaled scores, the padding mask, softmax, context); onnxruntime's optimiser
    fuses the rest (bias + GELU, residual + LayerNorm). The same arithmetic in fewer, larger
    operators (docs/serve-measurements.md)."""
    emb, int32 = bert.embeddings, lambda name: g.op("Cast", name, to=INT32)   # noqa: E731
    x, lengths = g.op("EmbedLayerNormalization", int32("input_ids"), int32("token_type_ids"),
                      g.const(emb.word.weight), g.const(emb.position.weight), g.const(emb.segment.weight),
                      g.const(emb.norm.weight), g.const(emb.norm.bias), int32("attention_mask"),
                      outputs=2, domain=MS, epsilon=float(emb.norm.eps))

    def attend(h: str, a) -> str:
        qkv = qkv_linear(a)
        return g.op("Attention", h, g.const(qkv.weight.t()), g.const(qkv.bias), lengths, domain=MS,
                    num_heads=bert.config.num_heads)
    return x, attend


def _embeddings(g: _Builder, emb) -> str:
    """model.py's Embeddings on the padded ids: word + segment (+ position 0..T-1) rows, LayerNorm."""
    x = g.op("Add", g.op("Gather", g.const(emb.word.weight), "input_ids", axis=0),
             g.op("Gather", g.const(emb.segment.weight), "token_type_ids", axis=0))
    if emb.position is not None:                 # every padded row starts at position 0
        x = g.op("Add", x, g.op("Gather", g.const(emb.position.weight), _positions(g), axis=0))
    return g.norm(x, emb.norm)


def _positions(g: _Builder) -> str:
    """0, 1, ..., T - 1 (int64), T the padded length of the batch."""
    T = g.op("Squeeze", g.op("Shape", "attention_mask", start=1, end=2), g.const([0], np.int64))
    return g.op("Range", g.const(0, np.int64), T, g.const(1, np.int64))


def _ffn(g: _Builder, x: str, mlp, act: str, ranges: Sequence[Tensor] | None, i: int) -> str:
    w = mlp.up.weight.detach()
    if g.int8 and g.fused and ranges is not None:        # smoothed (`encoder_graph`)
        s = (ranges[i].clamp_min(1e-5) / w.abs().amax(0).clamp_min(1e-8)).sqrt()
        x, w = g.op("Mul", x, g.const(1 / s)), w * s
    up = _activation(g, g.linear(x, w, mlp.up.bias), act)
    return g.linear(up, mlp.down.weight, mlp.down.bias, int8=g.down_int8)


def _activation(g: _Builder, x: str, name: str) -> str:
    """model.activation's `name` in ONNX operators."""
    if name in GELU_APPROXIMATE:
        return g.op("Gelu", x, approximate=GELU_APPROXIMATE[name])
    times_sigmoid = lambda k: g.op("Mul", x, g.op("Sigmoid", g.op("Mul", x, g.const(k))))     # noqa: E731
    clip = lambda y, low, high: g.op("Clip", y, g.const(low), g.const(high))                 # noqa: E731
    if name == "laplace":                        # 0.5 (1 + erf((x - mu) / (sigma sqrt 2)))
        z = g.op("Div", g.op("Sub", x, g.const(0.707107)), g.const(0.282095 * math.sqrt(2.0)))
        return g.op("Mul", g.const(0.5), g.op("Add", g.const(1.0), g.op("Erf", z)))
    if name == "relu2":
        r = g.op("Relu", x)
        return g.op("Mul", r, r)
    return {"gelu_10": lambda: clip(g.op("Gelu", x), -10.0, 10.0), "quick_gelu": lambda: times_sigmoid(1.702),
            "relu": lambda: g.op("Relu", x), "relu6": lambda: clip(x, 0.0, 6.0),
            "leaky_relu": lambda: g.op("LeakyRelu", x, alpha=0.01), "silu": lambda: times_sigmoid(1.0),
            "swish": lambda: times_sigmoid(1.0), "mish": lambda: g.op("Mish", x),
            "hardswish": lambda: g.op("HardSwish", x), "tanh": lambda: g.op("Tanh", x),
            "sigmoid": lambda: g.op("Sigmoid", x), "linear": lambda: x}[name]()


def _head(g: _Builder, model: nn.Module, states: list[str]) -> dict[str, tuple[str, list[int]]]:
    """`model.outputs` (model.py's heads and probe.py's) on the graph's states, by its `output_names`,
    each with its size after (B, T) per token or (B,) per sequence. Dropout is off (eval)."""
    h, bert = states[-1], model.bert
    linear = lambda x, layer: g.linear(x, layer.weight, layer.bias, int8=False)     # noqa: E731
    if isinstance(model, ProbeModel):
        return {"logits": (_probe(g, model, states), [model.num_labels])}
    if isinstance(model, BertForPreTraining):                # and BertForMaskedLM: the tied decoder E
        m = model.mlm
        y = g.norm(_activation(g, linear(h, m.dense), bert.config.hidden_act), m.norm)
        decoder = g.op("Transpose", g.const(m.decoder.weight), perm=[1, 0])                 # (C, V)
        return {"mlm_logits": (g.op("Add", g.op("MatMul", y, decoder), g.const(m.bias)), [m.bias.numel()])}
    if isinstance(model, (BertForSequenceClassification, BertForMultipleChoice)):
        return {"logits": (linear(_pooler(g, bert, h), model.classifier), [model.classifier.out_features])}
    if isinstance(model, BertForTokenClassification):
        return {"logits": (linear(h, model.classifier), [model.classifier.out_features])}
    if isinstance(model, BertForQuestionAnswering):
        y = linear(h, model.qa)                                                              # (B, T, 2)
        return {name: (g.op("Gather", y, g.const(k, np.int64), axis=-1), [])
                for k, name in enumerate(("start_logits", "end_logits"))}
    raise ValueError(f"no ONNX graph for the head {type(model).__name__}")


def _pooler(g: _Builder, bert: BertModel, h: str) -> str:
    """BertModel.pool: tanh(W summary + b), the summary as `bert.pooling` says."""
    return g.op("Tanh", g.linear(_pool(g, h, bert.pooling), bert.pooler.weight, bert.pooler.bias, int8=False))


def _pool(g: _Builder, h: str, how: str) -> str:
    """model.pool_tokens on padded (B, T, C) states -> (B, C): the first token's ('cls'), the last
    real token's ('last') or the mean over the real tokens ('mean')."""
    if how == "cls":
        return g.op("Gather", h, g.const(0, np.int64), axis=1)
    axis = g.const([1], np.int64)
    weight = g.op("Cast", "attention_mask", to=FLOAT)                                       # (B, T)
    if how == "last":                            # 1 at position length - 1
        last = g.op("Sub", g.op("ReduceSum", "attention_mask", axis, keepdims=1), g.const([1], np.int64))
        weight = g.op("Cast", g.op("Equal", _positions(g), last), to=FLOAT)
    weight = g.op("Unsqueeze", weight, g.const([-1], np.int64))                            # (B, T, 1)
    total = g.op("ReduceSum", g.op("Mul", h, weight), axis, keepdims=0)
    if how == "last":
        return total
    return g.op("Div", total, g.op("Max", g.op("ReduceSum", weight, axis, keepdims=0), g.const(1.0)))


def _probe(g: _Builder, model: ProbeModel, states: list[str]) -> str:
    """ProbeModel.outputs: the chosen states (pooled for a sentence task), concatenated or mixed by
    softmax(layer_weights), then the linear layer."""
    if model.combine == "pooler":
        chosen = [_pooler(g, model.bert, states[-1])]
    else:
        chosen = [states[i] for i in model.layers]
        if model.head == "sequence_classification":
            chosen = [_pool(g, h, model.pooling) for h in chosen]
    c = model.classifier
    if c.layer_weights is None:
        x = g.op("Concat", *chosen, axis=-1)
    else:
        x = g.const(0.0)
        for w, state in zip(c.layer_weights.detach().softmax(0).tolist(), chosen):
            x = g.op("Add", x, g.op("Mul", g.const(w), state))
    return g.linear(x, c.weight, c.bias, int8=False)
