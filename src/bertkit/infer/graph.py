"""The encoder written out as an ONNX graph from its weights (for `engines.GraphEngine`).

Why a second spelling of the forward pass: on a CPU without fast bf16 (AVX2 only), one short
request is mostly 24 small GEMMs (16 rows each for a 16-token text), and onnxruntime's GEMM
(MLAS) runs them faster than oneDNN (docs/serve-measurements.md); at 1,000 rows and more the two
tie, and bertkit's padding-free batches win. OpenVINO runs the same graph (bf16 where the CPU has it).

The graph is built node by node from the loaded weights in well under a second; no tracer and no
exporter are involved (`torch.onnx.export`'s TorchScript path freezes shapes and masks it saw,
its dynamo path takes ~20 s for a 6-layer model). It mirrors `model.py`'s blocks exactly: attention
with Q, K, V from one MatMul, the padding mask (and ALiBi's distance penalty) added to the scores,
post-LN or pre-LN (with the final LayerNorm), the feed-forward with the checkpoint's GELU or ReLU.
Inputs: the (B, T) int64 `input_ids`, `attention_mask` and `token_type_ids`, right-padded; the graph
looks the embeddings up itself (word + segment + position rows, LayerNorm), so a short request is one
runtime call with no PyTorch op before it (measured in docs/serve-measurements.md; the price: a
second copy of the vocabulary's rows in the graph);
output: `last_hidden_state` (B, T, C). Heads stay in PyTorch: they read these states. Causal
encoders and other activations are not written here (`supported` says why). Every graph is
checked against the PyTorch model at load (`choose.py`); a disagreement discards it.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..model import GELU_APPROXIMATE, BertModel
from .engines import INPUTS

MAX_GRAPH_BYTES = 1_900_000_000  # the weights inside one ONNX protobuf (2 GB limit, with room for the rest)
OPSET = 20                      # LayerNormalization (17), Gelu with its tanh approximation (20)


def supported(bert: BertModel) -> str | None:
    """None if `encoder_graph` can write this encoder, else why not."""
    cfg = bert.config
    if cfg.causal:
        return "a causal encoder"
    if cfg.hidden_act not in GELU_APPROXIMATE and cfg.hidden_act != "relu":
        return f"hidden_act {cfg.hidden_act}"
    if any(p.dtype != torch.float32 for p in bert.parameters()):
        return "weights not in float32"
    return None


class _Builder:
    """Nodes and initializers of one graph, each value given a fresh name."""

    def __init__(self, int8: bool = False):
        from onnx import helper, numpy_helper
        self.helper, self.numpy_helper, self.int8 = helper, numpy_helper, int8
        self.nodes, self.inits, self.count = [], [], 0

    def const(self, value: Tensor | np.ndarray | float | list, dtype=np.float32) -> str:
        arr = value.detach().float().numpy() if isinstance(value, Tensor) else value
        name = f"c{len(self.inits)}"
        self.inits.append(self.numpy_helper.from_array(np.asarray(arr, dtype=dtype, order="C"), name))   # 0-d stays 0-d
        return name

    def op(self, kind: str, *inputs: str, outputs: int = 1, **attrs: Any) -> Any:
        names = [f"v{self.count + i}" for i in range(outputs)]
        self.count += outputs
        self.nodes.append(self.helper.make_node(kind, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names

    def linear(self, x: str, weight: Tensor, bias: Tensor) -> str:
        """x W^T + b, the weight stored as (in, out) for MatMul; with `int8`, as int8 with one scale per
        output channel (max |w| / 127) behind a DequantizeLinear, which OpenVINO runs as int8 weights."""
        w = weight.detach().float().t()                                    # (in, out)
        if self.int8:
            scale = w.abs().amax(0).clamp_min(1e-12) / 127
            q = self.const(torch.round(w / scale).clamp(-127, 127).to(torch.int8).numpy(), np.int8)
            w_in = self.op("DequantizeLinear", q, self.const(scale), axis=1)
        else:
            w_in = self.const(w)
        return self.op("Add", self.op("MatMul", x, w_in), self.const(bias))

    def norm(self, x: str, ln: torch.nn.LayerNorm) -> str:
        return self.op("LayerNormalization", x, self.const(ln.weight), self.const(ln.bias),
                       axis=-1, epsilon=float(ln.eps))


def encoder_graph(bert: BertModel, int8: bool = False) -> bytes:
    """The serialized ONNX model of `bert`'s forward pass on padded inputs (see the module doc);
    `int8`: the blocks' Linear weights int8, one scale per output channel (`_Builder.linear`)."""
    from onnx import TensorProto, helper

    if why := supported(bert):
        raise ValueError(f"no ONNX graph for {why}")
    size = 4 * sum(p.numel() for p in [*bert.blocks.parameters(), *bert.embeddings.parameters()])
    if size > MAX_GRAPH_BYTES:
        raise ValueError(f"no ONNX graph for {size / 2**30:.1f} GB of weights (one protobuf holds at most 2 GB)")
    cfg, g = bert.config, _Builder(int8)
    H, C = cfg.num_heads, cfg.hidden_size
    D = C // H
    x = _embeddings(g, bert.embeddings)          # (B, T, C)
    # scores bias: 0 for real keys, the lowest float for padding                   (B, 1, 1, T)
    keep = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    bias = g.op("Mul", g.op("Sub", g.const(1.0), keep), g.const(float(np.finfo(np.float32).min)))
    bias = g.op("Unsqueeze", bias, g.const([1, 2], np.int64))
    slopes = bert.blocks[0].attn.slopes
    if slopes is not None:                       # ALiBi: - slope_h |i - j|                     (1, H, T, T)
        i = g.op("Cast", _positions(g), to=TensorProto.FLOAT)
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
    ins = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"]) for name in INPUTS]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", C])
    # the weights go into the model once (make_graph and make_model would each copy them): the peak of
    # a build is two copies of the weights, not four
    model = helper.make_model(helper.make_graph(g.nodes, "bertkit_encoder", ins, [out]),
                              opset_imports=[helper.make_opsetid("", OPSET)], producer_name="bertkit")
    model.graph.initializer.extend(g.inits)
    g.inits.clear()
    return model.SerializeToString()


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


def _ffn(g: _Builder, x: str, mlp, act: str) -> str:
    up = g.linear(x, mlp.up.weight, mlp.up.bias)
    up = g.op("Relu", up) if act == "relu" else g.op("Gelu", up, approximate=GELU_APPROXIMATE[act])
    return g.linear(up, mlp.down.weight, mlp.down.bias)
