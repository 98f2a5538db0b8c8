"""What a Predictor runs, decided at load and checked against fp32 on a fixed sample.

Precision (`choose_precision`): on a CPU whose bf16 matrix multiplies are measurably faster than
fp32 (`hardware.capabilities`: AMX, AVX512_BF16; not AVX2-only CPUs, where bf16 is emulated and
10-40x slower) the model runs in bf16 if, on the sample, its sentence embeddings, token states and
head outputs keep cosine >= 0.999 to fp32; otherwise, and on GPUs, fp32. int8 (`quantize_int8`) and
OpenVINO's bf16 (`openvino`) are measured against fp32 the same way.

The engine of short batches (`choose_engine`): every installed engine of the encoder's graph
(`engines.GraphEngine`; for an int8 Predictor the graphs with int8 weights) must follow
the fp32 model on the sample; of those the fastest on one sequence of 16 tokens, if within 5% of
PyTorch, takes batches up to the longest length (16, 32, ... 256 tokens) at which it stays so, its
runtime on one thread or on torch's where that is 5% faster (each engine timed on both), and larger
batches with little padding where it is 10% faster on a full batch (`_dense`, timed twice near that
tie), timed once per machine (`hardware.decided_once`); a later start loads and checks that engine
alone (`_load_short`). Dynamic int8 itself is `int8.py`.

Attention (`choose_attention`): SDPA or the written-out formula one sequence at a time, whichever
times faster for the model's heads, also once per machine.
"""
from __future__ import annotations

import copy
import logging
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import hardware
from ..hardware import dtype_name
from ..model import BertModel, pool_tokens, set_attention_kernel
from ..tokenizer import Tokenizer
from . import engines, graph
from .engines import Batch, GraphEngine, OpenVINOGraph, TorchEngine, encoder_of, split_packed
from .options import PredictorError
# Int8Linear and prepack_linear: benchmarks/results' scripts of 2026-12-06/07 import them from here
from .int8 import Int8Linear, int8_weight_levels, quantize_int8  # noqa: F401
from .prepack import FusedSelfAttention, prepack_linear, prepack_linears  # noqa: F401

log = logging.getLogger("bertkit")

BF16_MIN_COSINE = 0.999     # bf16 keeps every sample sentence, token state and head output this close to fp32
INT8_MIN_COSINE = 0.99      # an int8 Predictor's engine: every sample sentence this close to fp32 (or as the int8 model)
DENSE_BATCH = 8             # sequences of the full batch the engine is timed on against PyTorch (`_dense`;
                            # why not 32: docs/serve-measurements.md)
SMALL_LENGTHS = (16, 32, 64, 128, 256)   # one-sequence lengths timed at load
TIMING_ROUNDS = 7                        # interleaved rounds per length; the fastest of each counts
SETTLE_S = 0.1                           # before each timed run, at most this long for idle threads (`quiet`)
BURST_TOKENS = 160                       # a timed run: back-to-back calls of this many padded positions (`_timed`)
# The engine of short batches runs its PyTorch part on one thread, and its runtime on one thread unless
# torch's threads time more than SMALL_TIE faster at load (`_pick`): one thread never waits at a barrier for
# a core another process holds; a second gained nothing on a Xeon with AMX and much on Zen 4
# (docs/serve-measurements.md). It is kept where it is no more than SMALL_TIE slower than PyTorch.
SMALL_THREADS = 1
SMALL_TIE = 1.05
# the lead on a full batch an engine needs before it takes larger batches: that one timing at load
# moved by more than 5% between loads on a 2-core VM (docs/serve-measurements.md), and a wrong yes
# costs every large batch
DENSE_TIE = 1.10
# within this factor of DENSE_TIE either way, the full batch is timed a second time before the choice: on a
# Zen 4 the engine's lead there read 1.10-1.18 in five loads and under 1.10 in a sixth, so one machine in
# six kept its full batches on PyTorch, 10% slower in steady state (docs/serve-measurements.md)
DENSE_AGAIN = 1.10
OPENVINO_INT8_GROUP = 128   # activation values per int8 scale in OpenVINO's int8 engine (`openvino_int8_group`)
# OpenVINO's larger batches may run as this many streams sharing torch's threads, the rows cut among them
# (`_dense`): measured with two cores (two streams of one thread) only; two keeps a batch of a few rows
# cut among all the cores on a larger machine too
LARGE_STREAMS = 2
RECORDED = " (timed once on this machine)"     # after a reason read from the machine's record, not timed now


def choose_precision(p, dtype: torch.dtype | None, int8: bool, prepack: bool, small: bool | int,
                     attention: bool = True) -> None:
    """Set p.model to the int8 / bf16 / fp32 model that will run, and say why (and, on the CPU,
    its attention kernel where `attention`, before the model is checked against fp32, and when
    `small` the engine of short batches)."""
    fp32, cfg = p.model, p.config
    kernel = choose_attention if attention else (lambda p: None)
    if int8:
        down = torch.bfloat16 if hardware.bf16_fast(cfg.hidden_size, cfg.intermediate_size) else torch.float32
        p.model, p.int8, p.precision = quantize_int8(fp32, down, prepack), True, "int8"
        kernel(p)
        p.precision_check = check_against(p, fp32)
        bits = "8-bit" if int8_weight_levels() == 127 else "7-bit (no VNNI)"
        p.precision_reason = (f"int8=True (dynamic: {bits} weights per output channel, activations per token; FFN down "
                              f"projection in {dtype_name(down)}); "
                              f"cosine {p.precision_check['cosine_min']:.4f} to fp32 on the sample")
        if small:
            rows = sample_rows(p.tokenizer, p.max_length)
            _short_batches(p, small, encoder_of(fp32), _load_short(p, small, encoder_of(fp32), int8=True,
                                                                   calibration=p.batches(rows, 8)))
        return
    if dtype is not None:
        p.model, p.precision = fp32.to(dtype), dtype_name(dtype)
        p.precision_reason = f"precision {p.precision} asked for"
    elif p.device.type != "cpu":
        p.precision, p.precision_reason = "float32", f"default on {p.device.type} (bf16 or fp16 for the tensor cores)"
    else:
        caps = hardware.capabilities(cfg.hidden_size, cfg.intermediate_size)
        p.precision, p.precision_reason = "float32", caps.reason
        if caps.bf16_fast:
            bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
            packed = prepack and prepack_linears(bf16)
            p.model = bf16
            kernel(p)
            check = check_against(p, fp32)
            cos = _worst(check)
            if cos >= BF16_MIN_COSINE:
                p.precision, p.prepacked, p.precision_check = "bfloat16", packed, check
                p.precision_reason = f"{caps.reason}; cosine {cos:.5f} to fp32 on the sample"
                if small:
                    _short_batches(p, small, encoder_of(fp32), _load_short(p, small, encoder_of(fp32)))
                return
            p.model = fp32
            p.precision_reason = f"{caps.reason}, but bf16 cosine {cos:.5f} < {BF16_MIN_COSINE} to fp32 on the sample"
    exact = dtype == torch.float32            # fp32 asked for: short batches exact too (engines in fp32, fp32's bar)
    found = _load_short(p, small, p.encoder, exact, "float32" if exact else None) if small else None
    if prepack and p.device.type == "cpu":    # (the engines take the plain weights, before prepacking)
        p.prepacked = prepack_linears(p.model)
    kernel(p)
    if found is not None:
        _short_batches(p, small, None, found, exact)


def choose_attention(p) -> None:
    """On the CPU, kernel 'chunked' (`packing.attention`; on packed tokens one sequence at a time on
    views, `packing._sequence_attention`) where it times more than SMALL_TIE faster than SDPA's
    forward for the model's heads on a full and a ragged batch (32 sequences of 128 and of 128 down to
    8 tokens) in the precision chosen, once per machine; with SDPA, how finely the prepacked model
    splits a ragged batch's attention into length groups (`hardware.attention_group_overhead`)."""
    if p.device.type != "cpu":
        return
    H, D = p.config.num_heads, p.config.hidden_size // p.config.num_heads
    dtype = next((w.dtype for w in p.encoder.blocks.parameters() if w.is_floating_point()), torch.float32)
    speedup = hardware.attention_forward_speedup(H, D, min(128, p.max_length), dtype)
    p.attention_kernel = "chunked" if speedup > SMALL_TIE else "sdpa"
    set_attention_kernel(p.model, p.attention_kernel)
    p.attention_reason = (f"{p.attention_kernel}: the chunked kernel {speedup:.3g}x SDPA's forward "
                          f"(measured once on this machine)")
    fused = [m for m in p.model.modules() if isinstance(m, FusedSelfAttention)]
    if fused and p.attention_kernel == "sdpa":     # ragged batches: how finely to split attention into length groups
        overhead = hardware.attention_group_overhead(H, D, dtype)
        for m in fused:
            m.group_overhead = overhead
        p.attention_reason += f"; length groups at {overhead} pairs a call (measured once on this machine)"


def _short_batches(p, small: bool | int, reference: BertModel | None, found: tuple, exact: bool = False) -> None:
    runners, why = found                                  # what `load_engines` returned
    if not runners:
        p.small_reason = why
        return
    p.small, p.small_reason = choose_engine(p, runners, small, sample_rows(p.tokenizer, p.max_length), reference,
                                            exact)
    for r in (p.small.runner, p.small.wide) if p.small is not None else ():
        for held in ("reload", "safer"):                   # the graph's bytes (and the fp32 encoder) go with them
            getattr(r, "__dict__", {}).pop(held, None)


def _worst(check: dict) -> float:
    return min(check["cosine_min"], check["token_cosine_min"], check.get("head_cosine_min", 1.0))


def openvino(p, threads: int | None, dtype: torch.dtype | None) -> None:
    """backend openvino: the encoder's graph (embedding lookup included) on OpenVINO for every batch,
    the head in PyTorch. dtype None: OpenVINO's own precision (bf16 where the CPU has it) if the sample
    keeps cosine >= 0.999 to fp32, else fp32."""
    if dtype not in (None, torch.float32, torch.bfloat16):
        raise PredictorError("backend openvino runs fp32 or bf16")
    if "openvino" not in engines.installed_engines():
        raise PredictorError("backend openvino needs the openvino package (pip install openvino)")
    if why := graph.supported(p.encoder):
        raise PredictorError(f"backend openvino runs the encoder as an ONNX graph; there is none for {why}")
    g, fp32 = graph.encoder_graph(p.encoder), p.model
    name = dtype_name(dtype) if dtype is not None else None
    # its PyTorch part (gathering the states of a padded batch) on one thread: two would leave an OpenMP
    # worker spinning on the core OpenVINO is about to use (docs/serve-measurements.md, Zen 4); every
    # batch padded in runs of similar lengths (max_tokens 0: `GraphEngine.hidden`, `engines.padded_runs`)
    run = lambda precision: GraphEngine(OpenVINOGraph(g, threads or torch.get_num_threads(), precision),  # noqa: E731
                                        "openvino", 0, threads=1)
    p.engine = run(name)
    p.precision, p.precision_reason = p.engine.precision, "OpenVINO " + ("asked for" if name else "default")
    if p.precision != "float32":
        p.precision_check = check_against(p, fp32)
        cos = _worst(p.precision_check)
        p.precision_reason += f"; cosine {cos:.5f} to fp32 on the sample"
        if cos < BF16_MIN_COSINE and name is None:
            p.engine, p.precision, p.precision_check = run("float32"), "float32", None
            p.precision_reason = f"OpenVINO's default lost too much (cosine {cos:.5f} < {BF16_MIN_COSINE}): float32"


def sample_lines() -> list[str]:
    """The bundled sample sentences (`sample/sample.txt`), blank lines left out."""
    text = (Path(__file__).parents[1] / "sample" / "sample.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def sample_rows(tokenizer: Tokenizer, max_length: int) -> list[tuple[list[int], list[int]]]:
    """The fixed sample a precision is checked on: the 13 bundled sample sentences, 4 passages of
    three of them and 6 short queries (their first 1 to 8 words): 23 texts of 3 to ~100 word
    pieces, as [CLS] ... [SEP] rows cut to max_length."""
    lines = sample_lines()
    texts = (lines + [" ".join(lines[i:i + 3]) for i in range(0, len(lines) - 1, 3)][:4]
             + [" ".join(l.split()[:n]) for l, n in zip(lines, (1, 2, 3, 4, 6, 8))])
    cut = max(max_length - 2, 0)
    rows = [[tokenizer.cls_id, *ids[:cut], tokenizer.sep_id] for ids in tokenizer.encode_ids(texts)]
    return [(ids, [0] * len(ids)) for ids in rows]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine along the last axis."""
    return (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)


def check_against(p, reference: nn.Module) -> dict[str, float]:
    """How closely Predictor `p` follows `reference` (fp32) on the sample texts: cosine of the last
    hidden states per sentence (mean-pooled: `cosine_min`, `cosine_mean`) and per token, and for a
    task head the cosine of each text's outputs (logits, token logits or span logits, flattened:
    `head_cosine_min`; a masked-LM head's vocabulary logits are left out, the states they are
    computed from are compared)."""
    rows = sample_rows(p.tokenizer, p.max_length)
    task = bool(p.output_names) and "mlm_logits" not in p.output_names

    def run(q) -> list[tuple[np.ndarray, np.ndarray | None]]:
        def fn(b: Batch) -> list:
            h = split_packed(q.hidden(b, torch.float32).cpu(), engines.packed_to(b.packed, torch.device("cpu")))
            if not task:
                return [(x.numpy(), None) for x in h]
            return [(x.numpy(), np.concatenate([y.flatten() for y in ys]))
                    for x, ys in zip(h, q.per_input(b, q.head_outputs(b)))]
        return q._run(rows, fn)

    a, b = run(p), run(type(p)(reference, p.tokenizer, p.device, p.max_length))
    sent = np.array([cosine(x.mean(0), y.mean(0)) for (x, _), (y, _) in zip(a, b)])
    tok = np.concatenate([cosine(x, y) for (x, _), (y, _) in zip(a, b)])
    report = {"texts": len(rows), "tokens": int(tok.size), "cosine_min": float(sent.min()),
              "cosine_mean": float(sent.mean()), "token_cosine_min": float(tok.min()),
              "max_abs_diff": float(max(np.abs(x - y).max() for (x, _), (y, _) in zip(a, b)))}
    if task:
        report["head_cosine_min"] = float(min(cosine(x, y) for (_, x), (_, y) in zip(a, b)))
    return report


def agreement(candidate, reference, texts: Sequence[str], pairs: Sequence[str | None] | None = None,
              labels: Sequence[Any] | None = None, batch_size: int = 32) -> dict[str, float]:
    """How closely Predictor `candidate` (int8, ONNX, compiled...) follows `reference` (fp32) on
    `texts`: cosine (mean and min over texts) and max abs diff of the mean-pooled embeddings - or of
    the logits for a classification head - and, when `labels` (names) are given, both accuracies
    and how often the two predict the same label."""
    def outputs(p) -> np.ndarray:
        if p.head == "sequence_classification":
            return np.array([r["logits"] for r in p.classify(texts, pairs, raw=True, batch_size=batch_size)])
        return p.embed(texts, pairs, pooling="mean", batch_size=batch_size)

    a, b = outputs(candidate), outputs(reference)
    cos = cosine(a, b)
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


# ---- the engine of short batches ------------------------------------------------------------------
def load_engines(fp32_encoder: BertModel, threads: int, precision: str | None = None,
                 int8: bool = False, calibration: list | None = None,
                 only: str | None = None) -> tuple[dict[str, Any], str]:
    """Every installed engine's runner on the encoder's graph, by name, and a reason when there is
    none (no engine installed, no graph for this encoder, or none could load it). `precision`:
    OpenVINO's ('float32' when fp32 was asked for; None: its own, bf16 where the CPU has it).
    onnxruntime runs the graph in its own operators (`graph.encoder_graph(fused=True)`). `int8`: the
    graphs with int8 weights: on OpenVINO, which quantizes the activations at run time in groups
    of `openvino_int8_group` values (`engines.OpenVINOGraph`); on onnxruntime, per tensor (its
    DynamicQuantizeMatMul), weights of `int8_weight_levels` like `Int8Linear`'s, the FFN's input
    smoothed by its ranges on the `calibration` batches (`graph.encoder_graph`), the FFN's down
    projection in int8 too (a Zen 4: 1 x 16 2.46 against 3.16 ms, 8 x 128 90 against 113 ms, sample
    cosine 0.9920 against 0.9979) and, where that graph disagrees with fp32, the runner's `safer`
    loads the one with it in fp32, as `quantize_int8` keeps it (`choose_engine`). `only`: that engine alone."""
    why = graph.supported(fp32_encoder)
    installed = [name for name in engines.installed_engines() if only in (None, name)]
    if why or not installed:
        return {}, (f"no ONNX graph for {why}" if why else
                    "neither onnxruntime nor openvino is installed (pip install 'bertkit[onnx]')")
    group = openvino_int8_group(fp32_encoder.config.hidden_size) if int8 else 0
    smooth = int8 and calibration and "onnxruntime" in installed      # only onnxruntime's int8 graph is smoothed
    ranges = graph.ffn_input_ranges(fp32_encoder, calibration) if smooth else None
    runners, failed = {}, []
    for name in installed:
        ort = name == "onnxruntime"
        down8 = int8 and ort                    # onnxruntime int8: the down projection int8 too, fp32 if that disagrees

        def load(down_int8: bool | None, name=name, ort=ort):
            g = graph.encoder_graph(fp32_encoder, int8, fused=ort, levels=int8_weight_levels() if ort else 127,
                                    ranges=ranges, down_int8=down_int8)
            runner = engines.load_runner(name, g, threads, precision, group)
            # the same engine on more threads, for `_on_threads` (dropped once the short engine is chosen)
            runner.reload = lambda n, streams=1: engines.load_runner(name, g, n, precision, group, streams)
            return runner
        try:
            runners[name] = load(True if down8 else None)
            if down8:                           # `choose_engine` loads it where the first disagrees
                runners[name].safer = lambda load=load: load(False)
        except ValueError as e:                  # over protobuf's 2 GB
            return {}, str(e)
        except Exception as e:            # a build that cannot take the graph: say so, keep the others
            failed.append(f"{name} could not load the graph ({type(e).__name__}: {str(e)[:100]})")
    return runners, "; ".join(failed)


def _load_short(p, small: bool | int, encoder: BertModel, exact: bool = False, precision: str | None = None,
                **graphs) -> tuple[dict[str, Any], str]:
    """`load_engines` for the choice of the short-batch engine. Where this machine has made that
    choice before (`_fastest_once`), only the engine it kept is loaded (on the threads it was kept on)
    and checked, and none where PyTorch was the faster: a later start builds, loads and checks no
    runtime it will not use."""
    before = hardware.recorded(_choice_name(p, exact)) if small is True else None
    if not (isinstance(before, dict) and "engine" in before):
        return load_engines(encoder, SMALL_THREADS, precision, **graphs)
    if before["engine"] is None:
        return {}, before.get("note", "") + RECORDED
    threads = int(before.get("runtime_threads", SMALL_THREADS))
    return load_engines(encoder, threads, precision, only=before["engine"], **graphs)


def openvino_int8_group(hidden: int) -> int:
    """How many activation values share one int8 scale in OpenVINO's int8 engine
    (`DYNAMIC_QUANTIZATION_GROUP_SIZE`): 128 where the hidden size divides by it, else the hidden size
    (one scale per token). On all-MiniLM-L6-v2 (2-vCPU Zen 4, 2026-12-07) one scale per token left the
    sample's texts at cosine 0.9897 to fp32, under INT8_MIN_COSINE, so the engine was never used; groups
    of 128 read 0.9957 at the same speed (32 x 128: 260-270 ms against 266-274), groups of 32 0.9973 but
    334 ms (docs/serve-measurements.md)."""
    return OPENVINO_INT8_GROUP if hidden % OPENVINO_INT8_GROUP == 0 else hidden


def _choice_name(p, exact: bool) -> str:
    """The name the choice of short-batch engine is recorded under: the model's shape and precision,
    the engines installed with their versions (an upgrade times again), the threads."""
    c = p.config
    installed = " ".join(f"{name}-{_version(name)}" for name in engines.installed_engines())
    return (f"short-input engine L{c.num_layers} C{c.hidden_size} H{c.num_heads} F{c.intermediate_size} "
            f"{c.hidden_act} {c.norm_position}-LN {c.position_embedding_type}{' causal' * c.causal} {p.precision}"
            f"{' exact' if exact else ''} [{installed}] settled t{SMALL_THREADS}-t{torch.get_num_threads()} "
            f"each-on-tN dense-again burst fused-ops split-rows{' ov-group ort-down8 ort-rows' * (p.precision == 'int8')}")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "?"


def choose_engine(p, runners: dict[str, Any], small: bool | int, rows: list,
                  reference: BertModel | None = None, exact: bool = False) -> tuple[GraphEngine | None, str]:
    """The engine Predictor `p` keeps for short batches, and why (or why none). Each must follow
    the fp32 model on the sample `rows` (`reference`, default p's own encoder: an fp32 engine of an
    fp32 Predictor within max abs diff 1e-3 and token cosine 0.9999; with bf16 in either, token
    cosine BF16_MIN_COSINE; `exact`, fp32 asked for: fp32 engines only, at fp32's bar); of those the fastest (`_fastest_once`). `small` a number: the first
    engine that agrees, up to that many tokens, untimed. It takes `runners` (the dict is emptied): those
    not chosen are let go as soon as the choice is known, which lowers the peak memory of a load."""
    notes, variants, agreeing = [], [], {}
    with torch.inference_mode():
        for name in list(runners):
            runner = runners[name]
            candidate = GraphEngine(runner, name, threads=SMALL_THREADS)
            candidate.agreement = _agreement(p, candidate, rows, reference, exact)
            if not candidate.agreement["ok"] and getattr(runner, "safer", None):   # its down projection in fp32
                variants.append(f"{name} with its FFN down projection in fp32 (every Linear int8: cosine "
                                f"{candidate.agreement['cosine_min']:.5f} to fp32 on the sample)")
                safer, candidate = runner.safer, None
                runners[name] = runner = None                  # the first goes before the second loads
                runners[name] = runner = safer()
                candidate = GraphEngine(runner, name, threads=SMALL_THREADS)
                candidate.agreement = _agreement(p, candidate, rows, reference, exact)
            if candidate.agreement["ok"]:
                agreeing[name] = candidate
                if small is not True:            # a number of tokens: the first that agrees, untimed
                    break
            elif exact and runner.precision != "float32":
                notes.append(f"{name} runs {runner.precision}, and fp32 was asked for")
            else:
                notes.append(f"{name} ({runner.precision}) disagrees with PyTorch on the sample (token cosine "
                             f"{candidate.agreement['token_cosine_min']:.5f}, max abs diff "
                             f"{candidate.agreement['max_abs_diff']:.3g})")
        runners.clear()
        runner = candidate = None                      # the loop's last ones go too
        if agreeing and small is not True:
            chosen = next(iter(agreeing.values()))
            chosen.max_tokens = int(small)
            return chosen, "; ".join([f"{chosen.name} for batches of up to {small} tokens, as asked (not timed)",
                                      *variants])
        if agreeing:
            chosen, note = _fastest_once(p, agreeing, rows, exact, said=[*(f"not timed: {n}" for n in notes), *variants])
            if chosen is not None:
                return chosen, note
            notes.append(note)
    return None, "; ".join(notes + variants)


def _fastest_once(p, agreeing: dict[str, GraphEngine], rows: list,
                  exact: bool = False, said: Sequence[str] = ()) -> tuple[GraphEngine | None, str]:
    """`_fastest`, timed once per machine for a model of this shape and precision and these engines
    (`hardware.decided_once`): every later start on the machine keeps the same engine, so two
    servers of one model answer short requests alike. `said`: why the engines that disagree were left
    out, and which ran a safer variant (`choose_engine`), kept in the recorded reason (an engine
    dropped for its accuracy is said, not hidden)."""
    timed: dict = {}    # settled t1-tN: timed with SETTLE_S, each runtime on one thread and on torch's N (`_on_threads`)

    def decide() -> dict:
        log.info("timing %s against PyTorch for short batches, once on this machine (tens of seconds; recorded in %s)",
                 " and ".join(agreeing), hardware.measurements_path())
        loaded = hardware.busy()
        chosen, note = _fastest(p, agreeing, rows)
        note = "; ".join([note, *said])
        if loaded:                       # kept all the same (one choice per machine), but said
            note += (f" (timed while the machine was busy: {loaded}; delete {hardware.measurements_path()} "
                     "to time it again)")
        timed["chosen"] = chosen
        return {"engine": chosen.name if chosen else None, "max_tokens": chosen.max_tokens if chosen else 0,
                "max_padding": chosen.max_padding if chosen else 0.0,
                "large_threads": getattr(chosen.wide, "threads", 0) if chosen else 0,
                "large_streams": getattr(chosen.wide, "streams", 1) if chosen else 1,
                "runtime_threads": getattr(chosen.runner, "threads", 1) if chosen else 1, "note": note}
    known = lambda v: isinstance(v, dict) and (v.get("engine") is None or v.get("engine") in agreeing)  # noqa: E731
    d = hardware.decided_once(_choice_name(p, exact), decide, known)
    if "chosen" in timed:                                # timed in this process
        return timed["chosen"], d["note"]
    if d["engine"] is None:
        return None, d["note"] + RECORDED
    chosen = agreeing.pop(d["engine"])
    agreeing.clear()                                     # the others go before a runtime loads again
    n, reload = int(d.get("runtime_threads", 1)), getattr(chosen.runner, "reload", None)
    if getattr(chosen.runner, "threads", 1) != n and reload is not None:   # as timed: on n threads (one at a time)
        chosen.runner = None
        chosen = replace(chosen, runner=reload(n))
    chosen.max_tokens, chosen.max_padding = int(d["max_tokens"]), float(d.get("max_padding", 0.0))
    if large := int(d.get("large_threads", 0)):                         # larger batches on more threads, as timed
        streams = int(d.get("large_streams", 1))
        same = getattr(chosen.runner, "threads", 1) == large and streams == 1
        chosen.wide = chosen.runner if same or reload is None else reload(large, streams=streams)
    return chosen, d["note"] + RECORDED


def _fastest(p, agreeing: dict[str, GraphEngine], rows: list) -> tuple[GraphEngine | None, str]:
    """Time PyTorch and each engine, interleaved (`_timed`), on one sequence of each SMALL_LENGTHS, the
    engines on one thread and on torch's (`_on_threads`: an engine that gains more from a second
    thread than another can overtake it there); the fastest engine on its threads (`_pick`), if it is
    within SMALL_TIE of PyTorch at the first length, up to the longest length at which it stays so,
    with its reason, else None and why not."""
    tok = p.tokenizer
    stream = [i for r in rows for i in r[0][1:-1]]
    lengths = [n for n in SMALL_LENGTHS if n <= min(p.max_length, len(stream) + 2)]
    if not lengths:
        return None, f"the model takes fewer than {SMALL_LENGTHS[0]} tokens: nothing to time"
    batch = {n: p.batches([([tok.cls_id, *stream[:n - 2], tok.sep_id], [0] * n)])[0] for n in lengths}
    b = batch[lengths[0]]
    options = _on_threads(agreeing)
    ms_torch, *ms_options = _timed([(p.engine, b), *((e, b) for e in options.values())])
    timed = dict(zip(options, ms_options))
    times = ", ".join(f"{k} {v:.2f} ms" for k, v in timed.items())
    best, label, chosen = _pick(agreeing, options, timed)
    options.clear()
    if timed[label] > SMALL_TIE * ms_torch:
        return None, f"slower than PyTorch on {lengths[0]} tokens here ({times} vs {ms_torch:.2f} ms)"
    chosen.latency_ms[lengths[0]] = {"torch": round(ms_torch, 3), **{k: round(v, 3) for k, v in timed.items()}}
    chosen.max_tokens = lengths[0]
    for n in lengths[1:]:
        t_torch, t = _timed([(p.engine, batch[n]), (chosen, batch[n])])
        chosen.latency_ms[n] = {"torch": round(t_torch, 3), best: round(t, 3)}
        if t > SMALL_TIE * t_torch:
            break
        chosen.max_tokens = n
    dense = _dense(p, chosen, stream)
    k = getattr(chosen.runner, "threads", 1)
    on = "one thread" if k == 1 else f"{k} threads"
    return chosen, (f"{best} ({chosen.precision}, {on}) as fast as PyTorch or faster up to {chosen.max_tokens} "
                    f"tokens here ({times} vs PyTorch {ms_torch:.2f} ms at {lengths[0]}); {dense}")


def _timed(calls: list) -> list[float]:
    """Milliseconds per call of each (engine, batch), interleaved (`hardware.best_times`, SETTLE_S
    between runtimes); each timed run is a burst of back-to-back calls worth BURST_TOKENS padded
    positions (at least one): a server's steady state, which one call after a pause misreads
    (docs/serve-measurements.md, "The choice at load times bursts")."""
    fns = []
    for engine, b in calls:
        n = max(1, BURST_TOKENS // (b.packed.batch_size * b.packed.max_seqlen))
        fn = lambda engine=engine, b=b, n=n: [engine.run(b) for _ in range(n)]   # noqa: E731
        fn.calls = n
        fns.append(fn)
    return [1e3 * t / f.calls for t, f in zip(hardware.best_times(fns, TIMING_ROUNDS, settle=SETTLE_S), fns)]


def _dense(p, chosen: GraphEngine, stream: list[int]) -> str:
    """Time `chosen` against PyTorch on a full batch without padding (DENSE_BATCH sequences of up to
    128 tokens, the sample's tokens over and over); where the engine is DENSE_TIE faster or more it
    also takes larger batches while their padding costs less than that lead: `max_padding`, padded
    positions per real token, is the speed ratio over SMALL_TIE (PyTorch's padding-free batches pay
    for real tokens only, the engine for every padded position). A lead within DENSE_AGAIN of the tie
    is timed again, each side's fastest kept. A runtime with streams (OpenVINO) on torch's N > 1
    threads is also timed as LARGE_STREAMS streams sharing them (N = 2: two of one thread), the batch's
    rows cut among them (`engines.OpenVINOGraph`), and runs the larger batches so unless that times
    more than SMALL_TIE slower: on a Zen 4, 32 x 128 in 263-279 against 276-291 ms (medians; four
    runs), while at load, on 8 x 128 and fastest of 7, the two read within 3% either way
    (docs/serve-measurements.md). Returns what it found."""
    T, tok = min(128, p.max_length), p.tokenizer
    rows = [[tok.cls_id, *(stream[(i * (T - 2) + j) % len(stream)] for j in range(T - 2)), tok.sep_id]
            for i in range(DENSE_BATCH)]
    b = p.batches([(r, [0] * T) for r in rows], batch_size=DENSE_BATCH)[0]
    n, reload = torch.get_num_threads(), getattr(chosen.runner, "reload", None)
    wide = split = None
    if getattr(chosen.runner, "threads", 1) < n and reload is not None:
        wide = chosen.wide or reload(n)                   # the copy `_on_threads` loaded and timed, where it did
    calls = [(p.engine, b), (replace(chosen, runner=wide or chosen.runner, wide=None), b)]
    if n > 1 and reload is not None and hasattr(chosen.runner, "streams"):
        split = reload(n, streams=LARGE_STREAMS)
        calls.append((replace(chosen, runner=split, wide=split), b))
    times = _timed(calls)
    again = DENSE_TIE / DENSE_AGAIN <= times[0] / min(times[1:]) < DENSE_TIE * DENSE_AGAIN
    if again:                          # near the tie: as many rounds again, each side's fastest kept
        times = [min(x, y) for x, y in zip(times, _timed(calls))]
    t_torch, t, *t_split = times
    timed, on, also = {"torch": round(t_torch, 3), chosen.name: round(t, 3)}, f" on {n} threads" if wide else "", ""
    if split is not None:
        k = split.streams
        streams = f"{k} streams of {'one thread' if n == k else f'{n // k} threads'}"
        timed[f"{chosen.name} {k} streams"] = round(t_split[0], 3)
        if t_split[0] <= t * SMALL_TIE:    # the same runtime and graph, cut by rows: kept unless clearly slower
            also = f" ({t:.1f} on {n} threads as one stream)"
            wide, t, on = split, t_split[0], f" on {streams}"
        else:
            also = f" ({t_split[0]:.1f} on {streams})"
    chosen.latency_ms[f"{DENSE_BATCH}x{T}"] = timed
    lead = t_torch / t / SMALL_TIE
    chosen.max_padding, chosen.wide = (round(lead, 3), wide) if t_torch / t >= DENSE_TIE else (0.0, None)
    said = (f"{DENSE_BATCH} x {T}{on}: {t:.1f} ms against PyTorch's {t_torch:.1f}{also}"
            f"{', timed twice: near the tie' if again else ''}")
    return (f"and batches padded to at most {chosen.max_padding:.2f}x their tokens ({said})" if chosen.max_padding
            else f"not larger batches ({said})")


def _on_threads(agreeing: dict[str, GraphEngine]) -> dict[str, GraphEngine]:
    """Each engine on one thread (`NAME`) and, where torch has N > 1 threads, a copy on N (`NAME xN`)."""
    n, out = torch.get_num_threads(), {}
    for name, engine in agreeing.items():
        out[name] = engine
        if n > 1 and (reload := getattr(engine.runner, "reload", None)) is not None:
            out[f"{name} x{n}"] = replace(engine, runner=reload(n), latency_ms={}, agreement=dict(engine.agreement))
            out[f"{name} x{n}"].runner.reload = reload        # for `_dense`'s streams, where it is the one kept
    return out


def _pick(agreeing: dict[str, GraphEngine], options: dict[str, GraphEngine],
          timed: dict[str, float]) -> tuple[str, str, GraphEngine]:
    """The fastest engine as timed: (its name, the label of its threads, the engine). Each engine runs
    on torch's N threads only where that times more than SMALL_TIE faster than one (one thread is
    kept on a tie: it never waits at a barrier for a core another process holds); a chosen engine on
    one thread keeps its copy on N for `_dense` to time."""
    n = torch.get_num_threads()
    wide = {name: f"{name} x{n}" for name in agreeing if f"{name} x{n}" in timed}
    label = {name: wide[name] if name in wide and timed[wide[name]] * SMALL_TIE < timed[name] else name
             for name in agreeing}
    best = min(label, key=lambda name: timed[label[name]])
    chosen = options[label[best]]
    if label[best] == best and f"{best} x{n}" in options:
        chosen.wide = options[f"{best} x{n}"].runner
    return best, label[best], chosen


def _agreement(p, candidate: GraphEngine, rows: list, reference: BertModel | None, exact: bool = False) -> dict:
    """How closely an engine follows the fp32 model on the sample rows: an fp32 Predictor and engine
    within fp32 rounding, bf16 in either within BF16_MIN_COSINE per token; with `exact` (fp32 asked
    for) only an fp32 engine within fp32 rounding; an int8 Predictor's engine per text (mean-pooled, as
    the int8 model itself is checked) within INT8_MIN_COSINE or no further than the int8 model is."""
    ref = TorchEngine(reference if reference is not None else p.model)
    diff, cos, pooled = 0.0, 1.0, 1.0
    for b in p.batches(rows, batch_size=8):
        want, got = ref.run(b)["last_hidden_state"].float(), candidate.run(b)["last_hidden_state"].float()
        diff = max(diff, float((want - got).abs().max()))
        cos = min(cos, float(F.cosine_similarity(want, got, dim=-1).min()))
        pooled = min(pooled, float(F.cosine_similarity(pool_tokens(want, "mean", b.packed),
                                                       pool_tokens(got, "mean", b.packed), dim=-1).min()))
    fp32 = p.precision == "float32" and (exact or candidate.precision == "float32")   # bf16 anywhere: bf16's bar
    int8_bar = min(INT8_MIN_COSINE, (p.precision_check or {}).get("cosine_min", 1.0))
    ok = (pooled >= int8_bar if p.int8 else
          (candidate.precision == "float32" and diff <= 1e-3 and cos >= 0.9999) if fp32 else cos >= BF16_MIN_COSINE)
    return {"texts": len(rows), "max_abs_diff": diff, "token_cosine_min": cos, "cosine_min": pooled, "ok": ok}
