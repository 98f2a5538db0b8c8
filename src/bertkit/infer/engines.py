"""What runs a batch: one interface (`Engine.run(batch) -> dict[str, Tensor]`), three engines.

- `TorchEngine`: model.py's padding-free path (`packed=`), in the precision and form the Predictor
  chose at load (fp32, bf16, int8, prepacked, compiled);
- `ExportedEngine`: a file from `bertkit export onnx` on onnxruntime (padded inputs, the head's
  outputs computed in the file);
- `GraphEngine`: the encoder (embedding lookup and blocks) written out as an ONNX graph from the
  weights (`graph.py`) on onnxruntime or OpenVINO; the head stays in PyTorch. It is
  the engine of short batches (`max_tokens`, chosen at load by `choose.py`) and, on OpenVINO, the
  whole `backend="openvino"`.

Every engine returns `last_hidden_state` packed (N, C) like model.py; an engine with `heads` also
returns the head's outputs by name, per token (N, ...) or per sequence (B, ...).
"""
from __future__ import annotations

import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import BertkitError, first_line
from ..hardware import dtype_name
from ..model import BertModel
from ..packing import Packed, pack_rows, packing, unpack

INPUTS = ("input_ids", "attention_mask", "token_type_ids")     # an exported file's and graph.py's inputs, (B, T) int64
ENGINES = ("onnxruntime", "openvino")                           # what runs the encoder's graph


@dataclass
class Batch:
    """One length bucket: which inputs it holds, packed."""
    index: list[int]              # positions of these inputs in the caller's list
    packed: Packed
    tensors: dict[str, Tensor]    # packed (N,) input_ids, position_ids, token_type_ids


class Engine(Protocol):
    name: str                     # torch, onnx, onnxruntime, openvino
    precision: str                # float32, bfloat16, int8 ...
    heads: bool                   # whether `run` returns the head's outputs too

    def run(self, b: Batch) -> dict[str, Tensor]:
        """`last_hidden_state` (N, C) of the packed batch (and the head's outputs where `heads`)."""


def encoder_of(model: nn.Module) -> BertModel:
    return model if isinstance(model, BertModel) else model.bert


class TorchEngine:
    """The PyTorch model as loaded (and quantised, cast, prepacked or compiled at load)."""
    name, heads = "torch", False

    def __init__(self, model: nn.Module):
        self.model = model

    @property
    def precision(self) -> str:
        return dtype_name(next(self.model.parameters()).dtype)

    def run(self, b: Batch) -> dict[str, Tensor]:
        t = b.tensors
        h = encoder_of(self.model)(t["input_ids"], t["token_type_ids"], None, t["position_ids"], packed=b.packed)
        return {"last_hidden_state": h}


class ExportedEngine:
    """An exported file on onnxruntime: the batch padded to (B, T) in runs of similar lengths
    (`padded_runs`), its outputs by name, the states and a per-token head's outputs packed back to
    (N, ...)."""
    name, heads, precision = "onnx", True, "float32"

    def __init__(self, session, per_token: bool):
        self.session, self.per_token = session, per_token
        self.outputs = [o.name for o in session.get_outputs()]

    def run(self, b: Batch) -> dict[str, Tensor]:
        t = b.tensors
        runs = [self._padded(t["input_ids"][a:z], t["token_type_ids"][a:z], p) for a, z, p in padded_runs(b.packed)]
        if len(runs) == 1:                            # one run (a batch of similar lengths): no copy
            return runs[0]
        return {name: torch.cat([r[name] for r in runs]) for name in self.outputs}

    def _padded(self, ids: Tensor, types: Tensor, p: Packed) -> dict[str, Tensor]:
        feed = {"input_ids": unpack(ids, p), "token_type_ids": unpack(types, p),
                "attention_mask": unpack(torch.ones_like(ids), p)}
        flat = lambda a: torch.from_numpy(a).flatten(0, 1)[p.indices]       # (B, T, ...) -> (N, ...)
        res = self.session.run(None, {n: feed[n].numpy() for n in INPUTS})
        return {name: flat(a) if self.per_token or name == "last_hidden_state" else torch.from_numpy(a)
                for name, a in zip(self.outputs, res)}


def load_session(path: Path, threads: int | None = None, device: str | None = None):
    """An onnxruntime session for an exported file (CUDA provider when asked for and available)."""
    import onnxruntime as ort

    path = Path(path)
    if not path.is_file():
        raise BertkitError(f"{path}: no such ONNX file (export one with `bertkit export onnx --model DIR "
                           f"--out {path}`)")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
    providers = ["CPUExecutionProvider"]
    if device and str(device).startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    try:
        session = ort.InferenceSession(str(path), so, providers=providers)
    except Exception as e:
        raise BertkitError(f"{path}: onnxruntime cannot load it ({first_line(e, 200)})") from None
    names = [i.name for i in session.get_inputs()]
    if sorted(names) != sorted(INPUTS):
        raise BertkitError(f"{path}: expected inputs {', '.join(INPUTS)}, found {', '.join(names)}")
    return session


@contextmanager
def torch_threads(n: int | None):
    """torch's intra-op threads set to `n` for the block (None or the same: unchanged); ~0.5 us."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class GraphEngine:
    """The encoder's graph on a `runner` (onnxruntime or OpenVINO) for batches of at most
    `max_tokens` padded positions (B x T), and for larger ones with little padding (`max_padding`),
    on `threads` threads, its PyTorch part (gathering the states of a padded batch) too. `latency_ms` holds what was
    timed at load (per sequence length: PyTorch and the engines), `agreement` how closely it follows
    the fp32 model on the sample. Its states come back in float32, as the runtime computed them."""
    runner: Any
    name: str
    max_tokens: int = 0
    max_padding: float = 0.0         # larger batches too, while padded positions <= this x real tokens (0: none)
    wide: Any = None                 # the runtime on more threads (or streams) for those larger batches (None: `runner`)
    latency_ms: dict = field(default_factory=dict)
    agreement: dict = field(default_factory=dict)
    threads: int | None = None
    heads = False

    @property
    def precision(self) -> str:
        return self.runner.precision

    def takes(self, p: Packed) -> bool:
        if p.batch_size * p.max_seqlen <= self.max_tokens:
            return True
        return self.max_padding > 0 and (sum(g.batch_size * g.max_seqlen for _, _, g in padded_runs(p))
                                         <= self.max_padding * p.indices.numel())

    def run(self, b: Batch) -> dict[str, Tensor]:
        with torch_threads(self.threads):
            return {"last_hidden_state": self.hidden(b.tensors, b.packed)}

    def hidden(self, tensors: dict[str, Tensor], p: Packed) -> Tensor:
        """(N, C) float32 last hidden states of a packed batch."""
        ids, types = tensors["input_ids"], tensors["token_type_ids"]                   # (N,)
        if p.batch_size * p.max_seqlen <= self.max_tokens:               # a short batch: one call
            return self._padded(self.runner, ids, types, p)
        wide = self.wide or self.runner                                   # a larger one: a call per run of lengths,
        return torch.cat([self._padded(wide if g.batch_size >= getattr(wide, "streams", 1) else self.runner,
                                       ids[a:b], types[a:b], g)          # a run too short to cut among streams
                          for a, b, g in padded_runs(p)])                 # on the short batches' runtime

    @staticmethod
    def _padded(runner, ids: Tensor, types: Tensor, p: Packed) -> Tensor:
        """The runtime on the (N,) ids and segments of one layout, padded to (B, T) -> (N, C). The
        inputs are padded in numpy: no torch op runs before the runtime's call (see `pack_rows`)."""
        ids, types = ids.numpy(), types.numpy()
        if p.batch_size == 1:                                             # one sequence: nothing to pad
            n = ids.shape[0]
            return torch.from_numpy(runner.run(ids.reshape(1, n), np.ones((1, n), np.int64), types.reshape(1, n))[0])
        at = p.pad_indices.numpy()

        def padded(t: np.ndarray) -> np.ndarray:                          # (B, T), T the longest here, 0 after
            out = np.zeros(p.batch_size * p.max_seqlen, np.int64)
            out[at] = t
            return out.reshape(p.batch_size, p.max_seqlen)

        h = runner.run(padded(ids), p.key_mask.numpy().astype(np.int64), padded(types))
        return torch.from_numpy(h).flatten(0, 1)[p.pad_indices]          # (B, T, C) -> (N, C)

    def describe(self) -> dict:
        return {"engine": self.name, "precision": self.precision, "threads": self.threads,
                "runtime_threads": getattr(self.runner, "threads", None),
                "max_tokens": self.max_tokens, "max_padding": self.max_padding,
                "large_runtime_threads": getattr(self.wide or self.runner, "threads", None),
                "large_runtime_streams": getattr(self.wide or self.runner, "streams", 1),
                "latency_ms": self.latency_ms, "agreement": self.agreement}


# A sequence that would be padded by more than this many positions opens a new run: a round figure, on
# the side of few runs (one more runtime call costs what a few padded positions of a full batch cost;
# larger runs keep the GEMMs efficient; docs/serve-measurements.md).
RUN_OVERHEAD_TOKENS = 32


def padded_runs(p: Packed) -> list[tuple[int, int, Packed]]:
    """A large batch cut for an engine that pads: runs of sequences, each padded to its own longest, a
    sequence opening a new run where padding it to the run's longest would cost more than
    RUN_OVERHEAD_TOKENS positions (Predictor batches are sorted by length, longest first: 32 texts
    of 8-128 tokens pad to 1.2x their tokens in four runs, against 1.9x in one).
    [(first token, end token, layout of the run)], kept on the layout."""
    if "padded_runs" in p.scratch:
        return p.scratch["padded_runs"]
    lengths, cu = (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).tolist(), p.cu_seqlens.tolist()
    runs, start, top = [], 0, lengths[0]
    for i, n in enumerate(lengths[1:], 1):
        if top - n > RUN_OVERHEAD_TOKENS:
            runs.append((start, i))
            start, top = i, n
        top = max(top, n)
    runs.append((start, len(lengths)))
    if len(runs) == 1:
        out = [(0, cu[-1], p)]
    else:
        out = [(cu[a], cu[b], packing(torch.arange(max(lengths[a:b]))[None, :] < torch.tensor(lengths[a:b])[:, None]))
               for a, b in runs]
    p.scratch["padded_runs"] = out
    return out


def installed_engines() -> list[str]:
    """Which of ENGINES import here."""
    return [name for name in ENGINES if find_spec(name) is not None]


class OnnxRuntimeGraph:
    """The graph on onnxruntime's CPU provider (fp32, or int8 GEMMs where the graph has them, a call
    per row so that a text's states do not depend on its batch): all
    graph optimisations, `threads` intra-op threads that spin between the operators of one run and
    stop at its end (spinning threads would take the cores from the PyTorch batches that follow; not
    spinning at all, the workers sleep and wake between operators, slower still:
    docs/serve-measurements.md)."""

    def __init__(self, graph: bytes, threads: int, precision: str = "float32"):
        import onnxruntime as ort

        self.precision = precision              # int8: a graph of DynamicQuantizeMatMul (`graph.encoder_graph`)

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.threads = max(1, threads)
        so.intra_op_num_threads, so.inter_op_num_threads = self.threads, 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "1")
        so.add_session_config_entry("session.force_spinning_stop", "1")
        self.session = ort.InferenceSession(graph, so, providers=["CPUExecutionProvider"])

    def run(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        if self.precision != "int8" or ids.shape[0] == 1:
            return self.session.run(None, dict(zip(INPUTS, (ids, mask, types))))[0]
        # int8: DynamicQuantizeMatMul takes one activation scale per call, so in one call a row's states
        # would depend on the rows beside it and their padding (16 sample texts alone against together:
        # cosine down to 0.990, docs/serve-measurements.md); each (right-padded) row alone, at its length
        out = None
        for i, n in enumerate(mask.sum(1).tolist()):
            h = self.session.run(None, dict(zip(INPUTS, (ids[i:i + 1, :n], mask[i:i + 1, :n], types[i:i + 1, :n]))))[0]
            if out is None:
                out = np.zeros((*ids.shape, h.shape[-1]), h.dtype)
            out[i, :n] = h[0]
        return out


class OpenVINOGraph:
    """The graph compiled by OpenVINO for the CPU with its latency hint, in `precision` ('float32'
    or 'bfloat16'; default OpenVINO's own: bf16 where the CPU has AMX or AVX512_BF16, and the
    agreement check at load decides whether it may serve). `int8_group`: a graph with int8 weights
    (`graph.encoder_graph(int8=True)`) whose activations OpenVINO quantizes to int8 at run time in
    groups of this many values (`choose.openvino_int8_group`), so its GEMMs run int8 x int8.
    `streams` > 1: compiled for throughput instead, `threads` shared among that many streams, each
    call's rows cut into as many parts that run at once (one stream per part); for large batches only:
    one short sequence runs on one stream's threads (`choose._dense` decides)."""

    def __init__(self, graph: bytes, threads: int, precision: str | None = None, int8_group: int = 0,
                 streams: int = 1):
        import openvino as ov

        core = ov.Core()
        self.threads, self.streams = max(1, threads), max(1, min(streams, threads))
        config: dict = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": self.threads}
        if self.streams > 1:
            config.update(PERFORMANCE_HINT="THROUGHPUT", NUM_STREAMS=self.streams)
        if precision:
            config["INFERENCE_PRECISION_HINT"] = {"float32": "f32", "bfloat16": "bf16"}[precision]
        if int8_group:
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = str(int8_group)
        # read from a file, not from memory: a lower peak at load (docs/serve-measurements.md)
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as d:
            (Path(d) / "encoder.onnx").write_bytes(graph)
            self.compiled = core.compile_model(core.read_model(str(Path(d) / "encoder.onnx")), "CPU", config)
        self.requests = [self.compiled.create_infer_request() for _ in range(self.streams)]
        self.request = self.requests[0]
        self.lock = threading.Lock()                     # one set of request objects: one call at a time
        hint = str(self.compiled.get_property("INFERENCE_PRECISION_HINT"))      # "<Type: 'bfloat16'>"
        name = hint.split("'")[1] if "'" in hint else hint
        names = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
        self.precision = "int8" if int8_group else names.get(name, name)

    def run(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        # inputs by index (INPUTS' order) and shared, not copied: a list goes through OpenVINO's
        # slower Python dispatch, a visible share of one short request (docs/serve-measurements.md)
        with self.lock:
            if self.streams == 1 or ids.shape[0] < 2:
                out = self.request.infer({0: ids, 1: mask, 2: types}, share_inputs=True, share_outputs=True)
                return np.array(out[0])                         # a copy: the request reuses its buffers
            cuts = np.linspace(0, ids.shape[0], min(self.streams, ids.shape[0]) + 1).round().astype(int)
            parts = list(zip(self.requests, cuts[:-1], cuts[1:]))
            for r, a, b in parts:                                # rows a:b on their own stream, all at once
                r.start_async({0: ids[a:b], 1: mask[a:b], 2: types[a:b]}, share_inputs=True)
            for r, _, _ in parts:
                r.wait()
            return np.concatenate([r.get_output_tensor(0).data for r, _, _ in parts])


def load_runner(name: str, graph: bytes, threads: int, precision: str | None = None, int8_group: int = 0,
                streams: int = 1):
    """One of ENGINES on the graph. `precision`: OpenVINO's; `int8_group` > 0: a graph with int8
    weights (OpenVINO quantizes its activations in groups of that many values, see OpenVINOGraph;
    onnxruntime's graph quantizes its own, and its runner says int8); `streams`: OpenVINO's (one
    otherwise)."""
    if name == "openvino":
        return OpenVINOGraph(graph, threads, precision, int8_group, streams)
    return OnnxRuntimeGraph(graph, threads, "int8" if int8_group else "float32")


def length_buckets(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices sorted by length (longest first), cut into batches of <= batch_size items."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[k:k + batch_size] for k in range(0, len(order), batch_size)]


def make_batches(rows: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int,
                 device: torch.device) -> list[Batch]:
    """Length-sorted, packed batches of (input_ids, token_type_ids) rows on `device` (not yet run)."""
    out = []
    for idx in length_buckets([len(r[0]) for r in rows], batch_size):
        tensors, p = pack_rows([rows[i] for i in idx])
        if device.type != "cpu":
            tensors, p = {k: v.to(device) for k, v in tensors.items()}, packed_to(p, device)
        out.append(Batch(idx, p, tensors))
    return out


def split_packed(x: Tensor, p: Packed) -> list[Tensor]:
    """(N, ...) -> one (T_b, ...) tensor per sequence."""
    return list(torch.split(x, (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).tolist()))


def packed_to(p: Packed, device: torch.device) -> Packed:
    if p.cu_seqlens.device == device:
        return p
    return Packed(p.cu_seqlens.to(device), p.max_seqlen, p.indices.to(device), p.batch_size, p.padded_len,
                  p.pad_indices.to(device), p.key_mask.to(device))
