"""infer/graph.py and engines.GraphEngine: the encoder written out as an ONNX graph computes what model.py computes, and the
Predictor sends short batches there only when it is installed, agrees and (by default) measures faster."""
from __future__ import annotations

import gc
import re
import subprocess
import sys
import tempfile
import weakref

import numpy as np
import pytest
import torch

from bertkit import Tokenizer, hardware, preset
from bertkit.checkpoint import build, save_model
from bertkit.config import ACTIVATIONS
from bertkit.infer import Predictor, PredictorError, PredictorOptions
from bertkit.model import BertModel
from bertkit.packing import pack

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from bertkit.infer import choose, engines, graph  # noqa: E402
from bertkit.infer import predictor as predictor_module  # noqa: E402
from test_infer import assert_fp32_close, minilm_dir  # noqa: E402  (the fp32 reordering bound, explained there)

VARIANTS = [("gelu", "absolute", "post"), ("gelu_new", "alibi", "pre"), ("relu", "absolute", "pre"),
            ("gelu", "alibi", "post")]


def _model(act: str, positions: str, norm: str) -> BertModel:
    torch.manual_seed(0)
    model = BertModel(preset("tiny", vocab_size=500, hidden_act=act, position_embedding_type=positions,
                             norm_position=norm)).eval()
    for p in model.parameters():          # larger weights than the init so that a wrong op shows
        if p.dim() > 1:
            p.data.normal_(0, 0.2)
    return model


@pytest.mark.parametrize("int8, fused", [(False, False), (False, True), (True, False), (True, True)])
def test_the_graph_is_onnx_that_onnx_itself_checks(int8, fused):
    """bertkit writes the protobuf itself (no `onnx` import on the way to a runtime): the onnx package
    reads it back, its checker passes it, and the weights come back bit for bit."""
    import onnx
    from onnx import numpy_helper

    model = _model("gelu", "absolute", "post")
    proto = onnx.load_from_string(graph.encoder_graph(model, int8=int8, fused=fused))
    onnx.checker.check_model(proto, full_check=True)
    assert [i.name for i in proto.graph.input] == list(engines.INPUTS)
    assert [o.name for o in proto.graph.output] == ["last_hidden_state"]
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    norm = model.blocks[0].norm1
    assert any(a.shape == norm.weight.shape and np.array_equal(a, norm.weight.detach().numpy()) for a in inits.values())
    attrs = {a.name: onnx.helper.get_attribute_value(a) for n in proto.graph.node for a in n.attribute}
    assert attrs["epsilon"] == pytest.approx(norm.eps, rel=1e-6)        # a float attribute, 32 bits
    if not fused:
        assert attrs["axis"] in (-1, 0, 1) and attrs["perm"] in ([2, 0, 3, 1, 4], [0, 1, 3, 2], [0, 2, 1, 3])


def test_writing_a_graph_does_not_import_onnx():
    code = ("import sys; from bertkit.infer import graph; from bertkit.model import BertModel; from bertkit import preset; "
            "graph.encoder_graph(BertModel(preset('tiny', vocab_size=50)).eval(), fused=True); "
            "print('onnx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("engine, fused", [("onnxruntime", False), ("onnxruntime", True), ("openvino", False)])
@pytest.mark.parametrize("act, positions, norm", VARIANTS)
def test_graph_equals_the_model_padded_and_packed(act, positions, norm, engine, fused):
    """Standard operators on both engines; onnxruntime's own (EmbedLayerNormalization, Attention) where
    the encoder has a position table, the standard graph where it has ALiBi."""
    pytest.importorskip(engine)
    import onnx

    model = _model(act, positions, norm)
    g = graph.encoder_graph(model, fused=fused)
    ops = {n.op_type for n in onnx.load_from_string(g).graph.node}
    assert ("Attention" in ops) == ("EmbedLayerNormalization" in ops) == (fused and positions == "absolute")
    small = engines.GraphEngine(engines.load_runner(engine, g, threads=1), engine, max_tokens=1 << 20)
    if small.precision != "float32":
        pytest.skip(f"{engine} runs {small.precision} on this CPU (judged by cosine at load)")
    ids = torch.randint(5, 500, (3, 13))
    types = (torch.arange(13) >= 7).long().expand(3, 13)
    mask = torch.tensor([[1] * 13, [1] * 6 + [0] * 7, [1] * 9 + [0] * 4])
    flat, layout = pack(ids, mask, types)
    with torch.inference_mode():
        want = model(flat["input_ids"], flat["token_type_ids"], position_ids=flat["position_ids"], packed=layout)
        got = small.hidden(flat, layout)                           # three sequences, padded inside
        assert_fp32_close(got, want, model.config, f"{act}/{positions}/{norm}, a padded batch")
        one, alone = pack(ids[1:2, :6], mask[1:2, :6], types[1:2, :6])    # one sequence: no padding at all
        want = model(one["input_ids"], one["token_type_ids"], position_ids=one["position_ids"], packed=alone)
        assert_fp32_close(small.hidden(one, alone), want, model.config, f"{act}/{positions}/{norm}, alone")
        assert torch.allclose(small.hidden(one, alone), got[13:19], atol=1e-5)   # padding changes nothing


@pytest.mark.parametrize("positions", ["absolute", "alibi"])
def test_the_int8_graphs_hold_int8_weights_and_follow_the_model(positions):
    """graph.encoder_graph(int8=True): every block Linear's weight int8 (one scale per output channel)
    behind a DequantizeLinear, for OpenVINO; with fused=True (onnxruntime) in DynamicQuantizeMatMul,
    the FFN's down projection in fp32 and, with a position table, Q, K and V in the fp32 Attention
    operator; with ranges, the FFN's input scaled per channel first. Each engine's states keep the
    int8 class's cosine to the fp32 model."""
    import onnx

    model = _model("gelu", positions, "post")
    L = model.config.num_layers
    m = onnx.load_from_string(graph.encoder_graph(model, int8=True))
    int8 = [t for t in m.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert len(int8) == 4 * L                  # QKV (one MatMul), out, up, down per block
    assert sum(n.op_type == "DequantizeLinear" for n in m.graph.node) == len(int8)
    m = onnx.load_from_string(graph.encoder_graph(model, int8=True, fused=True, levels=63))
    int8 = [t for t in m.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert len(int8) == (2 if positions == "absolute" else 3) * L and max(int(abs(onnx.numpy_helper.to_array(t)).max()) for t in int8) == 63
    assert sum(n.op_type == "DynamicQuantizeMatMul" for n in m.graph.node) == len(int8)
    down8 = onnx.load_from_string(graph.encoder_graph(model, int8=True, fused=True, levels=63, down_int8=True))
    assert sum(n.op_type == "DynamicQuantizeMatMul" for n in down8.graph.node) == len(int8) + L   # the down projection too
    flat, layout = pack(torch.randint(5, 500, (3, 13)), torch.tensor([[1] * 13, [1] * 6 + [0] * 7, [1] * 9 + [0] * 4]))
    calibration = [engines.Batch([0, 1, 2], layout, flat)]
    ranges = graph.ffn_input_ranges(model, calibration)           # the FFN inputs' channel ranges, smoothed away
    assert len(ranges) == L and all(r.shape == (model.config.hidden_size,) and r.min() > 0 for r in ranges)
    smoothed = onnx.load_from_string(graph.encoder_graph(model, int8=True, fused=True, levels=63, ranges=ranges))
    assert sum(n.op_type == "Mul" for n in smoothed.graph.node) == sum(n.op_type == "Mul" for n in m.graph.node) + L
    runners, why = choose.load_engines(model, 1, int8=True, calibration=calibration)
    assert set(runners) == set(engines.installed_engines()), why
    with torch.inference_mode():
        want = model(flat["input_ids"], flat["token_type_ids"], position_ids=flat["position_ids"], packed=layout)
        for name, runner in runners.items():
            small = engines.GraphEngine(runner, name, max_tokens=1 << 20)
            assert small.precision == "int8" and small.runner.threads == 1
            got = small.hidden(flat, layout)
            assert torch.nn.functional.cosine_similarity(got, want, dim=-1).min() > 0.98, name
            # a text's states do not depend on the texts in the same call (nor on their padding): onnxruntime's
            # DynamicQuantizeMatMul takes one activation scale per call, so its runner calls each row alone
            # (the same call either way: equal); OpenVINO's scales are per token, its other operators may run
            # bf16, whose rounding a different batch shape can move (equal on a Zen 4; before the fix
            # onnxruntime's rows moved by 0.03)
            for i, n in enumerate(layout.cu_seqlens.diff().tolist()):
                one, alone = pack(flat["input_ids"][layout.cu_seqlens[i]:][:n][None], torch.ones(1, n, dtype=torch.long),
                                  flat["token_type_ids"][layout.cu_seqlens[i]:][:n][None])
                by_itself, in_batch = small.hidden(one, alone), got[layout.cu_seqlens[i]:][:n]
                if name == "onnxruntime":
                    assert torch.allclose(by_itself, in_batch, atol=1e-6), (name, i)
                else:
                    assert torch.nn.functional.cosine_similarity(by_itself, in_batch, dim=-1).min() > 0.9999, (name, i)


def test_each_int8_engine_keeps_real_weights_in_the_int8_class():
    """On all-MiniLM-L6-v2's weights every installed int8 engine, as `load_engines` builds it, keeps
    each sample text (mean-pooled) within INT8_MIN_COSINE of fp32, or as close as the PyTorch int8
    model itself: the bar it must pass to serve. On a Zen 4 OpenVINO's engine with one activation
    scale per token read 0.9897 and was silently never used; in groups of 128 (`openvino_int8_group`)
    it reads 0.9957 (docs/serve-measurements.md).
    onnxruntime's is held to it after its fallback (`choose_engine`), as it would serve."""
    from bertkit.checkpoint import load_model

    assert choose.openvino_int8_group(384) == 128 and choose.openvino_int8_group(312) == 312
    d = minilm_dir()
    p = Predictor.from_dir(d, device="cpu", int8=True, small_batches=False)
    fp32 = engines.encoder_of(load_model(d, random_init=False).eval())
    rows = choose.sample_rows(p.tokenizer, p.max_length)
    runners, why = choose.load_engines(fp32, 1, int8=True, calibration=p.batches(rows, 8))
    assert set(runners) == set(engines.installed_engines()), why
    with torch.inference_mode():
        for name, runner in runners.items():
            agreement = choose._agreement(p, engines.GraphEngine(runner, name), rows, fp32)
            if not agreement["ok"] and hasattr(runner, "safer"):     # as choose_engine: onnxruntime's fp32-down graph
                agreement = choose._agreement(p, engines.GraphEngine(runner.safer(), name), rows, fp32)
            bar = min(choose.INT8_MIN_COSINE, p.precision_check["cosine_min"])   # the class, as `_agreement` holds it
            assert agreement["ok"] and agreement["cosine_min"] >= bar, (name, agreement, bar)


def test_a_large_batch_runs_on_the_engine_in_runs_of_similar_lengths():
    """engines.padded_runs: a length-sorted batch cut where padding to the run's longest costs more than
    one more call; the engine's states for the whole batch equal those of each sequence alone; `takes`
    counts the padding of the runs."""
    lengths = [128, 120, 100, 96, 60, 40, 12, 8]
    ids = torch.randint(5, 500, (len(lengths), 128))
    rows = [(ids[i, :n].tolist(), [0] * n) for i, n in enumerate(lengths)]
    tensors, p = engines.pack_rows(rows)
    runs = engines.padded_runs(p)
    assert [(g.batch_size, g.max_seqlen) for _, _, g in runs] == [(4, 128), (2, 60), (2, 12)]
    assert [(a, b) for a, b, _ in runs] == [(0, 444), (444, 544), (544, 564)] and engines.padded_runs(p) is runs
    model = _model("gelu", "alibi", "pre")
    small = engines.GraphEngine(engines.load_runner("onnxruntime", graph.encoder_graph(model), 1), "onnxruntime",
                                max_tokens=64, max_padding=1.2)
    assert small.takes(p)                                  # 4 x 128 + 2 x 60 + 2 x 12 = 656 <= 1.2 x 564
    small.max_padding = 656 / 564 - 0.01
    assert not small.takes(p)
    with torch.inference_mode():
        got = small.hidden(tensors, p)
        alone = [small.hidden(*engines.pack_rows([r])) for r in rows]
    torch.testing.assert_close(got, torch.cat(alone), atol=1e-4, rtol=1e-4)


def test_a_wrong_graph_is_caught_by_the_bound():
    """The comparison above fails when the graph differs from the model in one operation."""
    model = _model("gelu", "absolute", "post")
    wrong = _model("gelu_new", "absolute", "post")                     # same weights, tanh GELU
    small = engines.GraphEngine(engines.load_runner("onnxruntime", graph.encoder_graph(wrong), 1), "onnxruntime", 1 << 20)
    flat, layout = pack(torch.randint(5, 500, (2, 9)), torch.ones(2, 9, dtype=torch.long))
    with torch.inference_mode():
        want = model(flat["input_ids"], flat["token_type_ids"], position_ids=flat["position_ids"], packed=layout)
        with pytest.raises(AssertionError, match="fp32 reordering bound"):
            assert_fp32_close(small.hidden(flat, layout), want, model.config)


def test_what_is_not_written_as_a_graph():
    assert graph.supported(_model("gelu", "absolute", "post")) is None
    assert graph.supported(BertModel(preset("tiny", vocab_size=500)).to(torch.bfloat16)) == "weights not in float32"
    with pytest.raises(ValueError, match="2 GB"):
        import unittest.mock
        with unittest.mock.patch.object(graph, "MAX_GRAPH_BYTES", 1000):
            graph.encoder_graph(_model("gelu", "absolute", "post"))


def test_a_freed_parameter_never_stands_in_for_a_new_one():
    """graph._Builder keeps one initializer per Parameter (a tied weight is written once). The fused
    Q, K, V Linear each layer makes for the graph is freed after its layer, and Python may give the
    next one the same id(): that one must get its own initializer, not the last layer's. (It did not:
    OpenVINO's and onnxruntime's engines failed the load-time check in some starts, 2026-12-07.)"""
    g = graph._Builder()
    names = []
    for i in range(50):
        p = torch.nn.Parameter(torch.full((3,), float(i)))
        names.append(g.const(p))
        del p
    assert len(set(names)) == 50
    tied = torch.nn.Parameter(torch.ones(2))
    assert g.const(tied) == g.const(tied)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_every_activation_and_a_causal_mask_in_the_graph(act):
    """Every hidden_act model.py knows has its ONNX spelling; a causal encoder (with ALiBi for
    one in three) has its mask in the standard graph and is not fused."""
    causal, positions = ACTIVATIONS.index(act) % 2 == 0, "alibi" if ACTIVATIONS.index(act) % 3 == 0 else "absolute"
    torch.manual_seed(0)
    model = BertModel(preset("tiny", vocab_size=500, hidden_act=act, causal=causal, norm_position="pre",
                             position_embedding_type=positions)).eval()
    for p in model.parameters():
        if p.dim() > 1:
            p.data.normal_(0, 0.2)
    assert graph.fusable(model) == (not causal and positions == "absolute")
    small = engines.GraphEngine(engines.load_runner("onnxruntime", graph.encoder_graph(model, fused=True), 1),
                                "onnxruntime", max_tokens=1 << 20)
    flat, layout = pack(torch.randint(5, 500, (2, 11)), torch.tensor([[1] * 11, [1] * 7 + [0] * 4]))
    with torch.inference_mode():
        want = model(flat["input_ids"], flat["token_type_ids"], position_ids=flat["position_ids"], packed=layout)
        assert_fp32_close(small.hidden(flat, layout), want, model.config, f"{act}, causal {causal}")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    tok = Tokenizer.from_dir(minilm_dir())
    out = {}
    for name, kw in (("plain", {}), ("causal", {"causal": True})):
        torch.manual_seed(0)
        d = tmp_path_factory.mktemp(name)
        save_model(build("encoder", preset("tiny", vocab_size=tok.vocab_size, **kw)), d)
        tok.save(d)
        out[name] = d
    return out


def test_predictor_default_measures_and_says_why(checkpoints, monkeypatch):
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    info = p.describe()["small_batches"]
    assert info["reason"] == p.small_reason
    if p.small is not None:                          # faster here at 16 tokens: timed lengths and agreement
        assert info["engine"] in engines.ENGINES and info["max_tokens"] in (16, 32, 64, 128, 256)
        assert "16" in {str(k) for k in info["latency_ms"]} and info["agreement"]["ok"]
        assert re.match(rf"{info['engine']} \({info['precision']}, (one thread|\d+ threads)\) as fast as PyTorch",
                        p.small_reason), p.small_reason
    else:
        assert info["engine"] is None and "slower than PyTorch" in p.small_reason
    off = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=False)
    assert off.small is None and off.describe()["small_batches"] == {"engine": None, "reason": "off: small_batches=False"}
    texts = ["one", "two words", "a third text of a few more words"]
    np.testing.assert_allclose(p.embed(texts), off.embed(texts), atol=1e-5)


def test_predictor_keeps_pytorch_where_no_graph_applies(checkpoints, monkeypatch):
    monkeypatch.setattr(graph, "MAX_GRAPH_BYTES", 1000)
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    assert p.small is None and "at most 2 GB" in p.small_reason
    monkeypatch.undo()
    monkeypatch.setattr(engines, "installed_engines", lambda: [])
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    assert p.small is None and "neither onnxruntime nor openvino is installed" in p.small_reason


def test_a_causal_encoder_takes_the_graph_too(checkpoints):
    """Its mask is in the standard graph (not fused): the engine agrees with PyTorch at load and
    answers as PyTorch does."""
    p = Predictor.from_dir(checkpoints["causal"], device="cpu", precision="fp32", small_batch_tokens=64,
                           small_batches=True)
    assert p.small is not None and p.small.agreement["ok"], p.small_reason
    off = Predictor.from_dir(checkpoints["causal"], device="cpu", precision="fp32", small_batches=False)
    texts = ["one", "two words", "a third text of a few more words"]
    np.testing.assert_allclose(p.embed(texts), off.embed(texts), atol=1e-5)


def test_the_options(checkpoints):
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=False,
                           small_batch_tokens=48)
    assert p.small is None and p.small_reason == "off: small_batches=False"
    assert Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32",
                              small_batch_tokens=8, small_batches=True).small.max_tokens == 8
    p = Predictor.from_dir(checkpoints["plain"], PredictorOptions(device="cpu", precision="fp32", small_batch_tokens=48))
    assert p.small is not None and p.small.max_tokens == 48 and "as asked" in p.small_reason
    b = p.batches([([101] + [2000] * 5 + [102], [0] * 7)] * 6)[0]       # 6 x 7 = 42 tokens: onnxruntime
    assert p.small.takes(b.packed) and not p.small.takes(p.batches([([101] * 50, [0] * 50)])[0].packed)
    with pytest.raises(PredictorError, match="small_batch_tokens must be at least 1, got 0"):
        Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batch_tokens=0)
    with pytest.raises(PredictorError, match="unexpected keyword argument 'small'"):
        Predictor.from_dir(checkpoints["plain"], small=True)


def test_a_disagreeing_graph_is_discarded(checkpoints, monkeypatch):
    """A graph that computes something else (here: another model's weights) never serves."""
    real = graph.encoder_graph

    def other_weights(bert, *args, **kwargs):
        torch.manual_seed(1)
        return real(BertModel(bert.config).eval(), *args, **kwargs)

    monkeypatch.setattr(graph, "encoder_graph", other_weights)
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batch_tokens=1 << 20, small_batches=True)
    assert p.small is None and "disagrees with PyTorch" in p.small_reason


class FakeEngine:
    """onnxruntime under another name, precision and speed, counting its runs."""

    def __init__(self, graph: bytes, precision: str = "float32", noise: float = 0.0):
        self.inner, self.precision, self.noise, self.calls = engines.OnnxRuntimeGraph(graph, 1), precision, noise, 0

    def run(self, ids, mask, types):
        self.calls += 1
        self.torch_threads = torch.get_num_threads()
        h = self.inner.run(ids, mask, types)
        return h + self.noise * np.random.default_rng(0).standard_normal(h.shape).astype(np.float32)


def _with_fakes(monkeypatch, fakes: dict, ms: dict, cache_dir, made: list | None = None):
    """choose.load_engines gives `fakes`; timing a call costs ms[engine] (PyTorch: ms['torch']).
    Returns the list of the engine sets made (`made`, or a new one), one per Predictor loaded."""
    def load(encoder, threads, precision=None, int8=False, calibration=None, only=None):
        assert threads == 1 or only is not None     # one thread, whatever the model's, unless decided before
        g = graph.encoder_graph(encoder)
        engines_made.append({name: make(g) for name, make in fakes.items() if only in (None, name)})
        return dict(engines_made[-1]), ""            # a copy: choose_engine empties what it is given

    def fake_times(fns, rounds, settle=0.0):
        made, out = engines_made[-1] if engines_made else {}, []      # (nothing loaded yet: the attention kernel)
        for fn in fns:
            before = {n: e.calls for n, e in made.items()}
            fn()
            ran = [n for n, e in made.items() if e.calls > before[n]]
            out.append((ms[ran[0]] if ran else ms["torch"]) * getattr(fn, "calls", 1) / 1e3)   # a burst: per call
        return out

    engines_made = [] if made is None else made
    monkeypatch.setenv(hardware.CACHE_ENV, tempfile.mkdtemp(dir=cache_dir))   # nothing timed before
    monkeypatch.setattr(hardware, "_session", {})
    monkeypatch.setattr(choose, "load_engines", load)
    monkeypatch.setattr(hardware, "best_times", fake_times)
    monkeypatch.setattr(hardware, "busy", lambda: None)             # whatever else this machine runs now
    return engines_made


def reloadable(name: str, made: list, has_streams: bool = False):
    """A maker of FakeEngine `name` on one thread whose `reload(n, streams=1)` loads a copy on n threads,
    timed as 'NAME xN' (it joins the engine set `_with_fakes` made last); with `has_streams` the engine
    and its copies have streams as OpenVINO's do, a copy on S streams timed as 'NAME xNsS'."""
    def make(g: bytes) -> FakeEngine:
        def reload(n: int, streams: int = 1) -> FakeEngine:
            copy = FakeEngine(g)
            made[-1][f"{name} x{n}" + (f"s{streams}" if streams > 1 else "")] = copy
            copy.threads = n
            if has_streams:
                copy.streams = streams
            return copy
        e = FakeEngine(g)
        e.threads, e.reload = 1, reload
        if has_streams:
            e.streams = 1
        return e
    return make


def test_the_engines_not_chosen_are_let_go(checkpoints, monkeypatch, tmp_path):
    """When the engine decided before on this machine loads again on more threads, the other runtimes
    and its one-thread runtime are gone already (the peak memory of a load: one runtime at a time)."""
    refs, alive = {}, []

    def reload(g: bytes, n: int) -> FakeEngine:
        gc.collect()
        alive.append(sorted(name for name, r in refs.items() if r() is not None))
        return FakeEngine(g)

    def load(encoder, threads, precision=None, int8=False, calibration=None, only=None):
        g = graph.encoder_graph(encoder)
        runners = {name: FakeEngine(g) for name in ("slow", "fast")}
        for name, e in runners.items():
            refs[name], e.reload = weakref.ref(e), lambda n, g=g: reload(g, n)
        return runners, ""

    real = hardware.decided_once
    decided = {"engine": "fast", "max_tokens": 64, "runtime_threads": 2, "note": "decided before"}
    monkeypatch.setattr(choose, "load_engines", load)
    monkeypatch.setattr(hardware, "decided_once", lambda name, decide, valid: decided
                        if name.startswith("short-input engine") else real(name, decide, valid))
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    assert p.small.name == "fast" and p.small.max_tokens == 64 and alive == [[]], (p.small_reason, alive)
    assert not hasattr(p.small.runner, "reload")              # the graph's bytes are let go too


def test_the_fastest_agreeing_engine_is_chosen(checkpoints, monkeypatch, tmp_path):
    _with_fakes(monkeypatch, {"slow": FakeEngine, "fast": FakeEngine, "wrong": lambda g: FakeEngine(g, noise=0.5)},
                {"torch": 5.0, "slow": 4.0, "fast": 2.0, "wrong": 1.0}, tmp_path)
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    assert p.small is not None and p.small.name == "fast", p.small_reason
    assert p.small.max_tokens == 256                         # ahead at every timed length
    assert p.small_reason.startswith("fast (float32, one thread) as fast as PyTorch or faster up to 256 tokens here "
                                     "(slow 4.00 ms, fast 2.00 ms vs PyTorch 5.00 ms")
    assert p.describe()["small_batches"]["latency_ms"][16] == {"torch": 5.0, "slow": 4.0, "fast": 2.0}
    _with_fakes(monkeypatch, {"even": FakeEngine}, {"torch": 5.0, "even": 5.2}, tmp_path)   # within 5%: one thread wins
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    assert p.small is not None and p.small.name == "even", p.small_reason
    _with_fakes(monkeypatch, {"slow": FakeEngine}, {"torch": 5.0, "slow": 5.3}, tmp_path)   # more than 5% slower
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    assert p.small is None and p.small_reason == "slower than PyTorch on 16 tokens here (slow 5.30 ms vs 5.00 ms)"


def test_the_engine_runtime_takes_torchs_threads_only_where_that_times_faster(checkpoints, monkeypatch, tmp_path):
    """With two torch threads the chosen engine's runtime is timed on two as well, and kept on two only
    where that is more than 5% faster (Zen 4's OpenVINO: 2.3-2.8 against 3.8-4.0 ms at 1 x 16); its
    PyTorch part stays on one thread; a later start reloads it on two without timing."""
    made = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _with_fakes(monkeypatch, {"fast": reloadable("fast", made)}, {"torch": 5.0, "fast": 4.0, "fast x2": 2.0},
                    tmp_path, made)
        p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
        assert p.small.runner.threads == 2 and p.small.threads == 1, p.small_reason
        assert p.small_reason.startswith("fast (float32, 2 threads) as fast as PyTorch or faster up to 256 tokens "
                                         "here (fast 4.00 ms, fast x2 2.00 ms vs PyTorch 5.00 ms at 16)")
        assert p.describe()["small_batches"]["runtime_threads"] == 2
        assert p.describe()["small_batches"]["latency_ms"][16] == {"torch": 5.0, "fast": 4.0, "fast x2": 2.0}
        monkeypatch.setattr(hardware, "_session", {})                  # a second process on this machine
        monkeypatch.setattr(hardware, "best_times", lambda fns, rounds, **kw: pytest.fail("timed again"))
        again = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
        assert again.small.runner.threads == 2
        _with_fakes(monkeypatch, {"fast": reloadable("fast", made)}, {"torch": 5.0, "fast": 4.0, "fast x2": 3.9},
                    tmp_path, made)
        p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
        assert p.small.runner.threads == 1 and "one thread" in p.small_reason     # within 5%: one thread
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("split_ms, kept", [(2.05, True), (2.2, False)])
def test_larger_batches_run_on_streams_unless_that_times_clearly_slower(checkpoints, monkeypatch, tmp_path,
                                                                        split_ms, kept):
    """A runtime with streams is timed on the full batch also as two streams of one thread (the rows
    cut between them) and takes the larger batches so unless that is more than SMALL_TIE slower (on a
    Zen 4 it was 4-6% faster in steady state, a coin flip at load); a later start reloads it so."""
    made = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _with_fakes(monkeypatch, {"fast": reloadable("fast", made, has_streams=True)},
                    {"torch": 10.0, "fast": 4.0, "fast x2": 2.0, "fast x2s2": split_ms}, tmp_path, made)
        p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
        assert p.small.runner.threads == 2 and p.small.runner.streams == 1, p.small_reason
        assert p.describe()["small_batches"]["latency_ms"]["8x128"] == {"torch": 10.0, "fast": 2.0, "fast 2 streams": split_ms}
        if kept:
            assert p.small.wide.streams == 2 and p.describe()["small_batches"]["large_runtime_streams"] == 2
            assert f"(8 x 128 on 2 streams of one thread: {split_ms:.1f} ms against PyTorch's 10.0 (2.0 on 2 threads " \
                   "as one stream))" in p.small_reason
        else:
            assert p.small.wide is None and p.describe()["small_batches"]["large_runtime_streams"] == 1
            assert f"(8 x 128: 2.0 ms against PyTorch's 10.0 ({split_ms:.1f} on 2 streams of one thread))" in p.small_reason
        assert p.small.max_padding > 1
        monkeypatch.setattr(hardware, "_session", {})                  # a second process on this machine
        monkeypatch.setattr(hardware, "best_times", lambda fns, rounds, **kw: pytest.fail("timed again"))
        again = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
        assert getattr(again.small.wide or again.small.runner, "streams") == (2 if kept else 1)
        assert again.small.runner.streams == 1 and again.small.runner.threads == 2
    finally:
        torch.set_num_threads(before)


def test_on_more_threads_the_streams_share_them(checkpoints, monkeypatch, tmp_path):
    """With four torch threads the larger batches are timed (and kept) as LARGE_STREAMS = 2 streams of two
    threads, not four of one: a batch of a few rows is still cut among every core."""
    made = []
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        _with_fakes(monkeypatch, {"fast": reloadable("fast", made, has_streams=True)},
                    {"torch": 10.0, "fast": 4.0, "fast x4": 2.0, "fast x4s2": 1.9}, tmp_path, made)
        p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
        assert (p.small.wide.threads, p.small.wide.streams) == (4, 2), p.small_reason
        assert "(8 x 128 on 2 streams of 2 threads: 1.9 ms against PyTorch's 10.0" in p.small_reason
    finally:
        torch.set_num_threads(before)


def test_openvino_on_streams_cuts_the_rows_and_gives_the_same_states():
    """OpenVINOGraph(streams=2): a batch's rows cut between two streams of one thread, run at once;
    the states are those of one stream, for an odd number of rows and for one row."""
    pytest.importorskip("openvino")
    model = _model("gelu", "absolute", "post")
    g = graph.encoder_graph(model)
    one, two = (engines.load_runner("openvino", g, 2, "float32", streams=s) for s in (1, 2))
    assert (one.streams, two.streams, two.threads) == (1, 2, 2)
    ids = torch.randint(5, 500, (3, 13)).numpy()
    mask = torch.tensor([[1] * 13, [1] * 6 + [0] * 7, [1] * 9 + [0] * 4]).numpy()
    types = np.zeros_like(ids)
    want = one.run(ids, mask, types)
    np.testing.assert_allclose(two.run(ids, mask, types), want, atol=1e-4)
    np.testing.assert_allclose(two.run(ids[1:2], mask[1:2], types[1:2]), want[1:2], atol=1e-4)


def test_engines_are_compared_on_the_threads_they_will_run_on(checkpoints, monkeypatch, tmp_path):
    """Every engine is timed on one thread and on torch's, and the fastest of those runs: on a Zen 3,
    OpenVINO timed 8.54 ms on one thread against onnxruntime's 8.70 and was kept, but on two threads
    onnxruntime answers 1 x 16 in 5.3-6.0 ms against OpenVINO's 5.5-6.2 (benchmarks/results/
    zen3-2026-12-07e/engine_threads.txt). Comparing on one thread and widening the winner kept 'one'."""
    made = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        both = {"one": reloadable("one", made), "two": reloadable("two", made)}
        _with_fakes(monkeypatch, both, {"torch": 10.0, "one": 8.0, "one x2": 7.0, "two": 8.5, "two x2": 5.5},
                    tmp_path, made)
        p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
        assert p.small.name == "two" and p.small.runner.threads == 2, p.small_reason
        assert p.small_reason.startswith("two (float32, 2 threads) as fast as PyTorch or faster up to 256 tokens here "
                                         "(one 8.00 ms, one x2 7.00 ms, two 8.50 ms, two x2 5.50 ms vs PyTorch 10.00")
        # 'one' ties its copy on two threads, so it stays on one thread, and is still the fastest
        _with_fakes(monkeypatch, both, {"torch": 10.0, "one": 6.0, "one x2": 5.9, "two": 8.5, "two x2": 6.1},
                    tmp_path, made)
        p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
        assert p.small.name == "one" and p.small.runner.threads == 1, p.small_reason
    finally:
        torch.set_num_threads(before)


def test_the_engine_is_timed_once_per_machine_and_kept_by_every_later_start(checkpoints, monkeypatch, tmp_path):
    _with_fakes(monkeypatch, {"slow": FakeEngine, "fast": FakeEngine}, {"torch": 5.0, "slow": 4.0, "fast": 2.0}, tmp_path)
    first = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    timings = []
    monkeypatch.setattr(hardware, "best_times", lambda fns, rounds, **kw: timings.append(1) or [1.0] * len(fns))
    monkeypatch.setattr(hardware, "_session", {})                  # a second process on this machine
    again = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    assert not timings and again.small.name == first.small.name == "fast"
    assert again.small.max_tokens == first.small.max_tokens == 256
    assert again.small_reason == first.small_reason + " (timed once on this machine)"


def test_a_later_start_loads_only_the_engine_decided_before(checkpoints, monkeypatch, tmp_path):
    """Once the choice is recorded, a second start builds, loads and checks the kept engine alone,
    and no runtime at all where PyTorch was the faster (what a restart costs: docs/serve.md)."""
    made = _with_fakes(monkeypatch, {"slow": FakeEngine, "fast": FakeEngine}, {"torch": 5.0, "slow": 4.0, "fast": 2.0},
                       tmp_path)
    Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    monkeypatch.setattr(hardware, "_session", {})                  # a second process on this machine
    again = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    assert [sorted(m) for m in made] == [["fast", "slow"], ["fast"]] and again.small.name == "fast"
    assert again.small.agreement["ok"]                              # checked on the sample all the same
    made = _with_fakes(monkeypatch, {"slow": FakeEngine}, {"torch": 5.0, "slow": 5.3}, tmp_path)
    first = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    monkeypatch.setattr(hardware, "_session", {})
    again = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    assert len(made) == 1 and again.small is None and first.small is None
    assert again.small_reason == first.small_reason + " (timed once on this machine)"


def test_a_number_of_tokens_takes_the_first_agreeing_engine_untimed(checkpoints, monkeypatch, tmp_path):
    made = _with_fakes(monkeypatch, {"wrong": lambda g: FakeEngine(g, noise=0.5), "first": FakeEngine,
                                     "second": FakeEngine}, {"torch": 5.0, "wrong": 1.0, "first": 4.0, "second": 2.0}, tmp_path)
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True, small_batch_tokens=40)
    assert p.small is not None and p.small.name == "first" and p.small.max_tokens == 40, p.small_reason
    assert p.small_reason == "first for batches of up to 40 tokens, as asked (not timed)" and not p.small.latency_ms
    assert p.small.agreement["ok"] and made[-1]["wrong"].calls > 0         # each checked in turn until one agrees
    assert made[-1]["second"].calls == 0                                   # the rest neither checked nor timed


def test_a_bf16_engine_is_judged_by_cosine(checkpoints, monkeypatch, tmp_path):
    """OpenVINO runs bf16 on CPUs that have it: such an engine may differ by more than fp32 rounding,
    as long as every token keeps cosine >= 0.999 to fp32 (the bar of bf16 everywhere in bertkit).
    That holds where the precision is chosen (auto, fp32 here); fp32 asked for takes fp32 engines only."""
    monkeypatch.setenv("BERTKIT_BF16", "0")                  # auto: fp32 on any CPU
    fakes = {"bf16": lambda g: FakeEngine(g, "bfloat16", noise=0.002), "fp32": lambda g: FakeEngine(g, noise=0.002)}
    _with_fakes(monkeypatch, fakes, {"torch": 5.0, "bf16": 2.0, "fp32": 1.0}, tmp_path)
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", small_batches=True)
    assert p.precision == "float32" and p.small is not None and p.small.name == "bf16", p.small_reason
    assert p.small.agreement["max_abs_diff"] > 1e-3 and p.small.agreement["token_cosine_min"] >= 0.999
    assert p.small_reason.startswith("bf16 (bfloat16")                        # the choice first, then what was
    assert "; not timed: fp32 (float32) disagrees with PyTorch" in p.small_reason   # dropped for its accuracy
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    assert p.small is None and "bf16 runs bfloat16, and fp32 was asked for" in p.small_reason
    _with_fakes(monkeypatch, {"bf16": lambda g: FakeEngine(g, "bfloat16", noise=0.3)}, {"torch": 5.0, "bf16": 1.0}, tmp_path)
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", small_batches=True)
    assert p.small is None and p.small_reason.startswith("bf16 (bfloat16) disagrees with PyTorch on the sample")


def test_fp32_asked_for_runs_short_batches_in_fp32(checkpoints):
    """Exact fp32 on request: whatever engine takes short batches runs fp32 (OpenVINO is compiled
    with its f32 hint, where it would pick bf16 by itself on AMX or AVX512_BF16 CPUs)."""
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True,
                           small_batch_tokens=64)
    if p.small is None:
        pytest.skip(f"no engine for short batches here: {p.small_reason}")
    assert p.small.precision == "float32" and p.small.agreement["max_abs_diff"] <= 1e-3


def test_a_bf16_predictor_takes_an_engine_from_the_fp32_weights(checkpoints, monkeypatch):
    """Where bf16 is chosen at load (forced here), the graph is written from the fp32 weights, the
    engine is held to bf16's bar against the fp32 model, and its states come back in bf16."""
    monkeypatch.setenv("BERTKIT_BF16", "1")
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", small_batches=True, small_batch_tokens=64)
    assert p.precision == "bfloat16" and p.small is not None, (p.precision_reason, p.small_reason)
    assert p.small.agreement["ok"] and p.small.agreement["token_cosine_min"] >= 0.999
    b = p.batches([([101, 2023, 2003, 1037, 3231, 102], [0] * 6)])[0]
    assert p.small.takes(b.packed) and p.hidden(b).dtype == torch.bfloat16
    monkeypatch.setenv("BERTKIT_BF16", "0")
    ref = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=False)
    texts = ["a short text", "another one of a few more words"]
    a, r = p.embed(texts), ref.embed(texts)
    assert (np.sum(a * r, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(r, axis=1)).min() >= 0.999


def test_an_engine_that_fails_at_run_time_hands_back_to_pytorch(checkpoints, caplog):
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True, small_batch_tokens=64)
    want = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=False).embed(["a b c"])

    class Broken:
        precision = "float32"

        def run(self, ids, mask, types):
            raise RuntimeError("out of memory")

    p.small.runner = Broken()
    np.testing.assert_allclose(p.embed(["a b c"]), want, atol=1e-5)      # answered, by PyTorch
    assert p.small is None and p.small_reason == "off: onnxruntime failed at run time (RuntimeError)"
    assert "PyTorch runs them from now on" in caplog.text


def test_a_timed_run_is_a_burst_of_back_to_back_calls(monkeypatch):
    """choose._timed: a run of a 16-token batch is 10 calls, of a 32 x 128 one a single call (a
    server's steady state: one call after a pause mismeasures a runtime's threads), per call in ms."""
    class Counting:
        calls = 0

        def run(self, b):
            self.calls += 1

    def batch(rows, length):
        return engines.make_batches([([101] * length, [0] * length)] * rows, rows, torch.device("cpu"))[0]

    monkeypatch.setattr(hardware, "best_times", lambda fns, rounds, settle=0.0: [f() and 0.0 or 1.0 for f in fns])
    short, long = Counting(), Counting()
    assert choose._timed([(short, batch(1, 16)), (long, batch(32, 128))]) == [100.0, 1000.0]
    assert (short.calls, long.calls) == (choose.BURST_TOKENS // 16, 1)


def test_an_int8_predictor_asks_for_int8_engines_held_to_its_own_class(checkpoints, monkeypatch, tmp_path):
    """int8=True loads the int8-weight graph (`load_engines(int8=True)`), and an engine serves if its
    sentences stay within 0.99 of fp32 or no further than the int8 model's own (which a noisy engine
    here is not)."""
    asked = []
    _with_fakes(monkeypatch, {"fast": FakeEngine}, {"torch": 5.0, "fast": 2.0}, tmp_path)
    load = choose.load_engines
    monkeypatch.setattr(choose, "load_engines", lambda *a, **k: asked.append(k.get("int8", False)) or load(*a, **k))
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", int8=True, small_batches=True)
    assert asked == [True] and p.small is not None and p.small.name == "fast", p.small_reason
    assert p.small.agreement["cosine_min"] >= min(0.99, p.precision_check["cosine_min"])
    _with_fakes(monkeypatch, {"noisy": lambda g: FakeEngine(g, noise=0.5)}, {"torch": 5.0, "noisy": 2.0}, tmp_path)
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", int8=True, small_batches=True)
    assert p.small is None and "noisy (float32) disagrees" in p.small_reason
    # one agrees, one does not: the one dropped for its accuracy is said in the reason, and stays said
    # when the recorded choice is reused
    _with_fakes(monkeypatch, {"fast": FakeEngine, "noisy": lambda g: FakeEngine(g, noise=0.5)},
                {"torch": 5.0, "fast": 2.0, "noisy": 1.0}, tmp_path)
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", int8=True, small_batches=True)
    assert p.small.name == "fast" and "not timed: noisy (float32) disagrees" in p.small_reason, p.small_reason
    again = Predictor.from_dir(checkpoints["plain"], device="cpu", int8=True, small_batches=True)
    assert again.small.name == "fast" and "not timed: noisy (float32) disagrees" in again.small_reason


def test_an_int8_onnxruntime_engine_that_disagrees_falls_back_to_its_fp32_down_projection(checkpoints, monkeypatch):
    """onnxruntime's int8 engine runs every Linear in int8 first; where that graph disagrees with fp32
    on the sample, the one with the FFN's down projection in fp32 (`safer`) is loaded and checked in
    its place, and the reason says so."""
    monkeypatch.setattr(engines, "installed_engines", lambda: ["onnxruntime"])
    real, seen, checked = choose._agreement, [], []

    def agreement(p, candidate, *a, **k):
        out = real(p, candidate, *a, **k)
        seen.append(hasattr(candidate.runner, "safer"))
        checked.append(candidate.runner)
        return {**out, "ok": False} if seen[-1] else out          # the all-int8 graph "disagrees"
    monkeypatch.setattr(choose, "_agreement", agreement)
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", int8=True, small_batches=True, small_batch_tokens=40)
    assert seen == [True, False] and p.small is not None and p.small.name == "onnxruntime", p.small_reason
    assert p.small.runner is checked[1]                           # the fp32-down graph serves
    assert not hasattr(p.small.runner, "safer") and not hasattr(p.small.runner, "reload")   # nothing held for them
    assert "onnxruntime with its FFN down projection in fp32 (every Linear int8: cosine" in p.small_reason


def test_short_batches_run_on_one_thread_and_longer_ones_on_the_models(checkpoints, monkeypatch, tmp_path):
    """The engine of short batches, its PyTorch embedding layer, pooling and head run on one thread
    (a second thread waits at every op for a core another process holds); longer batches that PyTorch
    runs and everything after keep the model's threads; a long batch with little padding goes to the
    engine where it timed faster on a full batch (here 5 against 2 ms: up to 2.38x padding)."""
    made = _with_fakes(monkeypatch, {"fast": FakeEngine}, {"torch": 5.0, "fast": 2.0}, tmp_path)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
        pooled = []
        real_pool = predictor_module.pool_tokens
        monkeypatch.setattr(predictor_module, "pool_tokens",
                            lambda *a, **k: pooled.append(torch.get_num_threads()) or real_pool(*a, **k))
        p.embed(["a short text"])
        assert made[-1]["fast"].torch_threads == 1 and pooled == [1] and torch.get_num_threads() == 2
        assert p.describe()["small_batches"]["threads"] == 1                  # what ran, as /v1/model says
        assert p.small.max_padding == pytest.approx(5.0 / 2.0 / 1.05, abs=1e-3), p.small_reason
        long = [" ".join(["word"] * 200)] * 4
        p.small.max_padding, timed = 0.0, p.small.max_padding
        p.embed(long)                                      # 4 x over 100 tokens, the engine slower there: PyTorch
        assert pooled == [1, 2]
        p.small.max_padding = timed
        p.embed(long)                                      # as timed: the engine, its PyTorch part on one thread
        assert pooled == [1, 2, 1]
    finally:
        torch.set_num_threads(before)


def test_a_small_lead_on_the_full_batch_keeps_larger_batches_on_pytorch(checkpoints, monkeypatch, tmp_path):
    """An engine 7% faster everywhere takes the short batches (within SMALL_TIE) but not the larger
    ones: a full batch timed once at load moves by more than that between loads (DENSE_TIE). A lead
    that near the tie is timed a second time (DENSE_AGAIN), a clear one once."""
    _with_fakes(monkeypatch, {"fast": FakeEngine}, {"torch": 5.35, "fast": 5.0}, tmp_path)
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    assert p.small is not None and p.small.name == "fast", p.small_reason
    assert p.small.max_padding == 0.0 and p.small.wide is None and "not larger batches" in p.small_reason
    assert "timed twice: near the tie" in p.small_reason          # 1.07x is within DENSE_AGAIN of DENSE_TIE
    _with_fakes(monkeypatch, {"fast": FakeEngine}, {"torch": 5.0, "fast": 2.0}, tmp_path)
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    assert p.small.max_padding > 1 and "timed twice" not in p.small_reason     # a clear lead: timed once


def test_an_engine_timed_on_a_busy_machine_says_so(checkpoints, monkeypatch, tmp_path):
    """The choice is kept once per machine; one timed while other work held the cores carries the
    load and how to time it again in its reason."""
    _with_fakes(monkeypatch, {"fast": FakeEngine}, {"torch": 5.0, "fast": 2.0}, tmp_path)
    monkeypatch.setattr(hardware, "busy", lambda: "load 4.5 on 2 cores")
    p = Predictor.from_dir(checkpoints["plain"], device="cpu", precision="fp32", small_batches=True)
    assert p.small is not None and p.small.name == "fast"
    assert "(timed while the machine was busy: load 4.5 on 2 cores; delete " in p.small_reason
    assert str(hardware.measurements_path()) in p.small_reason


def test_busy_reads_the_load_average(monkeypatch):
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (4.5, 3.0, 2.0))
    assert hardware.busy() == "load 4.5 on 2 cores"
    monkeypatch.setattr(os, "getloadavg", lambda: (1.2, 1.0, 1.0))
    assert hardware.busy() is None


@pytest.mark.parametrize("head, features, pooling, causal", [
    ("sequence_classification", "pooler", None, False), ("sequence_classification", "concat_last_2", None, False),
    ("sequence_classification", "sum_all", "mean", False), ("sequence_classification", "last", "last", True),
    ("token_classification", "second_to_last", None, True)])
def test_a_probe_in_the_graph_equals_its_outputs(head, features, pooling, causal):
    """`encoder_graph(head=probe)`, as `bertkit export onnx` writes a probe: the chosen states, pooled,
    concatenated or mixed, then the linear layer, on a padded batch of three lengths."""
    from bertkit.infer.export import Exportable
    from bertkit.probe import ProbeModel

    torch.manual_seed(0)
    probe = ProbeModel(BertModel(preset("tiny", vocab_size=500, causal=causal)), head, 3, features, pooling=pooling).eval()
    if probe.classifier.layer_weights is not None:
        probe.classifier.layer_weights.data.normal_()          # a mix that is not uniform
    session = ort.InferenceSession(graph.encoder_graph(probe.bert, head=probe), providers=["CPUExecutionProvider"])
    ids = torch.randint(5, 500, (3, 13))
    mask = torch.tensor([[1] * 13, [1] * 6 + [0] * 7, [1] * 9 + [0] * 4])
    types = (torch.arange(13) >= 7).long().expand(3, 13) * mask
    with torch.no_grad():
        want = Exportable(probe)(ids, mask, types)
    got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()})
    keep = mask.bool().numpy()
    for w, g in zip(want, got):
        w = w.numpy()
        if w.ndim == 3:                                          # per token: the real tokens only
            w, g = w[keep], g[keep]
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)


def test_a_causal_encoder_has_its_own_recorded_choice():
    """A causal encoder's graph is not fused (slower on onnxruntime): its short-engine choice is not
    the one a bidirectional model of the same shape recorded."""
    from types import SimpleNamespace

    names = {causal: choose._choice_name(SimpleNamespace(config=preset("tiny", vocab_size=500, causal=causal),
                                                         precision="float32"), False) for causal in (False, True)}
    assert names[False] != names[True] and "causal" in names[True] and "causal" not in names[False]
