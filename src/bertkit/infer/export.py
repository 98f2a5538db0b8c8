"""ONNX export (`bertkit export onnx`): a file the Predictor runs with `backend="onnx"` (`engines.ExportedEngine`).

The graph takes padded (B, T) int64 `input_ids`, `attention_mask`, `token_type_ids` with both
axes dynamic and returns `last_hidden_state` (B, T, C) plus the head's outputs: `logits`
(sequence: (B, L), token: (B, T, L)), `start_logits`/`end_logits` (B, T) or `mlm_logits`
(B, T, V).

It is the graph the Predictor runs short batches on (`graph.encoder_graph`, ONNX opset 20), written
from the weights with the head's operators added, not traced: torch's TorchScript exporter bakes the
trace-time attention mask into some graphs (BASELINES.md), its dynamo exporter took twice as long
and needs onnxscript (docs/serve-measurements.md). Every export is then checked numerically on
onnxruntime against PyTorch, on batches of several sizes, lengths and paddings; over tolerance the
file is removed and the export fails.

`--int8` writes the same graph with every block's Linear as onnxruntime's DynamicQuantizeMatMul:
int8 weights with one scale per output channel, 7-bit (|w| <= 63: the file may run on a CPU
without VNNI, where onnxruntime's int8 kernel adds pairs of products in 16 bits that 8-bit weights
can overflow), activations quantized per tensor at run time, the FFN's input smoothed by its
ranges on the bundled sample texts first (`graph.encoder_graph`). all-MiniLM-L6-v2: cosine 0.9918 on
the parity batches against 0.9900 from onnxruntime's `quantize_dynamic` per channel (which this
replaces, and its Python loop over every channel), and faster to run (docs/serve-measurements.md).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ..checkpoint import check_inputs_fit, load_model
from ..errors import BertkitError, first_line
from ..runconfig import NON_NEGATIVE, THREADS, UNIT, Checked
from ..tokenizer import Tokenizer
from .choose import cosine, sample_lines, sample_rows
from .engines import INPUTS, encoder_of, load_session, make_batches
from .graph import encoder_graph, ffn_input_ranges


class ExportError(BertkitError):
    """The export failed or its output disagrees with PyTorch."""


@dataclass
class ExportOptions(Checked):
    """How `bertkit export onnx` writes and checks the file (its flags: `cliconfig.add_options`)."""
    optimize: bool = False
    """Save onnxruntime's fused graph (LayerNorm, GELU, ...)."""
    int8: bool = False
    """int8 MatMul weights (7-bit, one scale per output channel), activations quantized at run time."""
    max_abs_diff: Annotated[float | None, NON_NEGATIVE] = None
    """Tolerance on the largest output difference (default 1e-3; none for int8)."""
    min_cosine: Annotated[float | None, UNIT] = None
    """Tolerance on the sentence-embedding cosine (default 0.9999; 0.98 for int8)."""
    threads: Annotated[int | None, THREADS] = None
    """CPU threads for the export and the parity check (default: torch's choice)."""


class Exportable(nn.Module):
    """What the exported graph computes, in PyTorch (the parity check's reference): padded inputs ->
    last_hidden_state and the head's `outputs` by its `output_names`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.names = tuple(getattr(model, "output_names", ()))
        self.per_token = bool(getattr(model, "per_token", False))

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> tuple[Tensor, ...]:
        m = self.model
        if not self.names:                                 # a bare encoder: the states
            return (m(input_ids, token_type_ids, attention_mask),)          # (B, T, C)
        states = m.bert(input_ids, token_type_ids, attention_mask, all_layers=m.all_layers)
        out = m.outputs(states, None, attention_mask)                       # the head's own outputs
        h = states[-1] if m.all_layers else states                          # (B, T, C)
        return (h, *(out[n] for n in self.names))


@dataclass
class Parity:
    max_abs_diff: float            # over real tokens of every output
    cosine_min: float              # of mean-pooled embeddings (or logits) per input
    cosine_mean: float
    batches: int

    def line(self) -> str:
        return (f"parity vs PyTorch on {self.batches} batches: max abs diff {self.max_abs_diff:.3g}, "
                f"cosine min {self.cosine_min:.6f} (mean {self.cosine_mean:.6f})")


def export_onnx(model_dir: str | Path, out: str | Path, options: ExportOptions | None = None, *,
                head: str | None = None, **changes) -> Parity:
    """Export a checkpoint folder to `out` as `options` say (`ExportOptions`; keyword arguments of its
    fields change single options); returns the parity report (raises ExportError over tolerance:
    default max abs diff 1e-3 and cosine 0.9999 for fp32, cosine 0.98 for int8)."""
    o = dataclasses.replace(options or ExportOptions(), **changes)
    out = Path(out)
    if out.suffix != ".onnx":
        raise ExportError(f"{out}: the output file must end in .onnx")
    if o.threads:
        torch.set_num_threads(o.threads)
    model = load_model(model_dir, head=head, random_init=False).float().eval()
    try:
        tokenizer = Tokenizer.from_dir(Path(model_dir))
    except Exception:                      # noqa: BLE001 - a folder of weights only: parity is checked on random ids
        tokenizer = None
    else:                                  # its ids must index the embeddings (the parity sentences, and users)
        check_inputs_fit(model.config, tokenizer.vocab_size, where=model_dir)
    wrapper = Exportable(model).eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.stem + ".fp32.tmp.onnx")
    try:
        bert = encoder_of(model)
        int8 = _int8_graph(bert, tokenizer, model.config) if o.int8 else {}
        tmp.write_bytes(encoder_graph(bert, head=None if model is bert else model, **int8))
    except ValueError as e:                # weights over protobuf's 2 GB, a head with no graph
        raise ExportError(str(e)) from None
    temps = [tmp, out.with_name(out.stem + ".opt.tmp.onnx")]
    try:
        current = tmp
        if o.optimize:
            current = _optimize(current, temps[1])
        report = check_parity(wrapper, current, tokenizer, o.threads)            # checked before it is `out`
        tol_abs = o.max_abs_diff if o.max_abs_diff is not None else (None if o.int8 else 1e-3)
        tol_cos = o.min_cosine if o.min_cosine is not None else (0.98 if o.int8 else 0.9999)
        if (tol_abs is not None and report.max_abs_diff > tol_abs) or report.cosine_min < tol_cos:
            raise ExportError(f"{report.line()}; over tolerance (max abs diff {tol_abs}, cosine {tol_cos}): "
                              f"{out} not written")
        os.replace(current, out)
    finally:
        for f in temps:
            f.unlink(missing_ok=True)
    return report


def _example_batch(vocab: int, lengths: Sequence[int], seed: int, pairs: bool = False) -> dict[str, Tensor]:
    """Random ids right-padded to the longest length, [CLS] ... [SEP] like real inputs."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    mask, types = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(min(1000, vocab // 2), min(vocab, 29000), (n,), generator=g)   # small vocabularies too
        ids[i, 0], ids[i, n - 1] = min(101, vocab - 1), min(102, vocab - 1)
        mask[i, :n] = 1
        if pairs and n > 4:
            types[i, n // 2:n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def check_parity(wrapper: Exportable, path: Path, tokenizer: Tokenizer | None = None,
                 threads: int | None = None) -> Parity:
    """onnxruntime vs PyTorch on batches unlike the trace: other sizes, lengths, padding, segment
    ids; the cosine is taken on real sentences when the folder has a tokenizer (`tokenizer`)."""
    session = load_session(path, threads=threads)
    vocab = wrapper.model.config.vocab_size
    top = min(wrapper.model.config.max_position_embeddings, 128)
    random = [_example_batch(vocab, lengths, seed=100 + k, pairs=pairs) for k, (lengths, pairs) in enumerate(
        [([5], False), ([top, 3, 17, min(64, top)], True), ([33, 33, 33], False), ([3, min(71, top)] * 3, True)])]
    lines = sample_lines()       # real sentences (the bundled sample corpus) in two batches, one of them pairs
    text = [] if tokenizer is None else [tokenizer(lines[:9], max_length=top),
                                         tokenizer(lines[9:12], pairs=lines[:3], max_length=top)]
    diffs, cosines = [], []
    for k, feed in enumerate(random + text):
        with torch.no_grad():
            ref = [t.float().numpy() for t in wrapper(*(feed[n] for n in INPUTS))]
        try:
            got = session.run(None, {n: feed[n].numpy() for n in INPUTS})
        except Exception as e:             # noqa: BLE001 - onnxruntime's own error, as one line
            raise ExportError(f"onnxruntime fails on the exported graph: {first_line(e, 300)}") from None
        mask = feed["attention_mask"].numpy().astype(bool)
        for i, (r, g) in enumerate(zip(ref, got)):
            if i == 0 or wrapper.per_token:                                   # per token: real tokens only
                r, g = r[mask], g[mask]
            diffs.append(float(np.abs(r - g).max()))
        if text and k < len(random):
            continue
        m = mask[..., None]                    # cosine of the mean-pooled states (sentence embeddings)
        cosines += list(cosine((ref[0] * m).sum(1) / m.sum(1), (got[0] * m).sum(1) / m.sum(1)))
        if len(ref) > 1 and not wrapper.per_token:                          # per-sequence logits
            cosines += list(cosine(ref[1], got[1]))
    return Parity(max(diffs), float(min(cosines)), float(np.mean(cosines)), len(random) + len(text))


def _optimize(src: Path, dst: Path) -> Path:
    """onnxruntime's offline graph optimisations (constant folding, LayerNorm/GELU/MatMul+Add
    fusions), saved so every later session starts from the fused graph."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return dst


def _int8_graph(bert: nn.Module, tokenizer: Tokenizer | None, config) -> dict:
    """`encoder_graph`'s arguments for `--int8` (the module doc): DynamicQuantizeMatMul in standard
    attention (any padding), 7-bit weights, the FFN's input smoothed by its ranges on the bundled
    sample texts (none without a tokenizer: random ids would set wrong ranges)."""
    ranges = None
    if tokenizer is not None:
        rows = sample_rows(tokenizer, min(config.max_position_embeddings, 512))
        ranges = ffn_input_ranges(bert, make_batches(rows, 8, torch.device("cpu")))
    return {"int8": True, "fused": True, "fused_inputs": False, "down_int8": True, "levels": 63, "ranges": ranges}
