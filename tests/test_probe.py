"""Frozen-feature probes (`finetune --freeze`): the paper's Table 7 feature choices over token
states, never a frozen random pooler, and probe checkpoints that load_model / evaluate / predict /
the Predictor run exactly as trained."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit import Tokenizer, load_model, save_model
from bertkit.checkpoint import build
from bertkit.cli import main
from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.finetune import FinetuneConfig, finetune
from bertkit.probe import FEATURES, ProbeModel, probe_layers
from test_finetune import WORDS, conll_dir, sst_dir, tiny_model  # noqa: F401  (fixtures)


pytestmark = pytest.mark.usefixtures("one_thread")    # conftest: tiny models, one thread


def cfg(**kw) -> FinetuneConfig:
    base = dict(batch_size=16, lr=1e-2, epochs=3, warmup=0.1, progress=False, max_length=32, log_every=5,
                freeze=True)
    base.update(kw)
    return FinetuneConfig(**base)


def test_feature_choices_name_the_paper_layers():
    L = 12
    assert probe_layers("embeddings", L) == ("concat", [0])
    assert probe_layers("second_to_last", L) == ("concat", [11])
    assert probe_layers("last", L) == ("concat", [12])
    assert probe_layers("sum_last_four", L) == ("sum", [9, 10, 11, 12])
    assert probe_layers("concat_last_four", L) == ("concat", [9, 10, 11, 12])
    assert probe_layers("sum_all", L) == ("sum", list(range(1, 13)))
    assert probe_layers("concat_last_2", L) == ("concat", [11, 12])
    assert probe_layers("pooler", L) == ("pooler", [12])
    for bad, n in (("concat_last_four", 2), ("second_to_last", 1), ("concat_last_0", 12), ("mean", 12)):
        with pytest.raises(BertkitError):
            probe_layers(bad, n)


def test_config_checks_probe_options():
    with pytest.raises(BertkitError, match="freeze"):
        FinetuneConfig(probe_features="last")
    with pytest.raises(BertkitError, match="choose from"):
        FinetuneConfig(freeze=True, probe_features="cls")
    assert FinetuneConfig(freeze=True).features == "concat_last_four"
    assert FinetuneConfig(freeze=True, probe_features="last").features == "last"
    assert FinetuneConfig().features is None


@pytest.fixture(scope="module")
def mlm_only(tmp_path_factory, tiny_model):
    """An MLM-only checkpoint (BertForMaskedLM: no pooler weights at all)."""
    d = tmp_path_factory.mktemp("mlm_only")
    torch.manual_seed(1)
    model = load_model(tiny_model, head="masked_lm", new_head_ok=True)
    save_model(model, d)
    Tokenizer.from_dir(tiny_model).save(d)
    return d


def test_never_a_frozen_random_pooler(mlm_only, tiny_model, sst_dir, tmp_path):
    from safetensors import safe_open
    with safe_open(str(mlm_only / "model.safetensors"), "pt") as f:
        assert not any("pooler" in k for k in f.keys())
    with pytest.raises(BertkitError, match="no pre-trained pooler"):
        finetune(cfg(task="sst2", data=str(sst_dir), model=str(mlm_only), out=str(tmp_path / "a"),
                     probe_features="pooler"))
    with pytest.raises(BertkitError, match="random pooler"):
        finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(tmp_path / "b"),
                     probe_features="pooler", init="random"))
    # a sentence probe on token states of the MLM-only checkpoint: no pooler anywhere, it learns
    result = finetune(cfg(task="sst2", data=str(sst_dir), model=str(mlm_only), out=str(tmp_path / "c"),
                          probe_features="last", probe_pooling="mean", epochs=4, lr=3e-2))
    model = load_model(tmp_path / "c")
    assert isinstance(model, ProbeModel) and model.bert.pooler is None and model.combine == "concat"
    assert result["dev"]["accuracy"] >= 0.7, result["history"]          # chance: 0.52
    encoder = load_model(tiny_model, head="encoder")
    with pytest.raises(BertkitError, match="tagging"):
        ProbeModel(encoder, "token_classification", 3, "pooler")
    with pytest.raises(BertkitError, match="same vector for every input"):
        ProbeModel(encoder, "sequence_classification", 2, "embeddings", pooling="cls")   # [CLS] embedding
    assert ProbeModel(encoder, "sequence_classification", 2, "embeddings").pooling == "mean"
    with pytest.raises(BertkitError, match="tagging"):
        ProbeModel(encoder, "token_classification", 3, "last", pooling="mean")


@pytest.mark.parametrize("features, pooling", [("embeddings", None), ("second_to_last", "cls"),
                                               ("sum_all", "mean"), ("concat_last_2", None)])
def test_sentence_probe_round_trips(tiny_model, sst_dir, tmp_path, capsys, features, pooling):
    """Train a probe; the saved folder loads as the same ProbeModel (same logits), `evaluate`
    reproduces the dev metric, and `predict` and the Predictor give the probe's own outputs."""
    out = tmp_path / "run"
    result = finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(out),
                          probe_features=features, probe_pooling=pooling, epochs=2))
    raw = json.loads((out / "config.json").read_text())
    combine, layers = probe_layers(features, 2)
    pooling = pooling or ("mean" if features == "embeddings" else "cls")
    assert raw["bertkit_probe"] == {"features": features, "combine": combine, "layers": layers,
                                    "pooling": pooling}
    model = load_model(out)
    assert isinstance(model, ProbeModel) and not model.training and model.features == features
    if combine == "sum":                       # the layer weights trained and were saved
        assert model.classifier.layer_weights.abs().max() > 0
    tok = Tokenizer.from_dir(out)
    batch = tok(["the movie was good", "a bad plot and it is very poor"])
    with torch.no_grad():
        logits, _ = model(**batch)
        states = model.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], all_layers=True)
        m = batch["attention_mask"][..., None].float()
        h = [states[i][:, 0] if pooling != "mean" else (states[i] * m).sum(1) / m.sum(1) for i in layers]
        x = torch.cat(h, -1) if combine == "concat" else sum(
            w * s for w, s in zip(model.classifier.layer_weights.softmax(0), h))
        torch.testing.assert_close(logits, x @ model.classifier.weight.T + model.classifier.bias)
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out), "--data", str(sst_dir / "dev.tsv"), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ev["accuracy"] == pytest.approx(result["dev"]["accuracy"])
    from bertkit.infer import Predictor
    p = Predictor.from_dir(out, precision="fp32")
    got = np.array([r["logits"] for r in p.classify(["the movie was good", "a bad plot and it is very poor"],
                                                     raw=True)])
    np.testing.assert_allclose(got, logits.numpy(), atol=1e-4, rtol=1e-4)


def test_token_probe_loads_in_predict_and_predictor(tiny_model, conll_dir, tmp_path, capsys):
    out = tmp_path / "ner"
    result = finetune(cfg(task="conll2003", data=str(conll_dir), model=str(tiny_model), out=str(out),
                          probe_features="sum_last_2", epochs=4))
    assert result["dev"]["f1"] > 0.9, result["history"]
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"tokens": ["mary", "lives", "in", "rome", "."]}\n', encoding="utf-8")
    capsys.readouterr()
    assert main(["predict", "--model", str(out), str(inp)]) == 0
    row = json.loads(capsys.readouterr().out)
    from bertkit.infer import Predictor
    tags = Predictor.from_dir(out, precision="fp32").ner([["mary", "lives", "in", "rome", "."]])[0]["tags"]
    assert tags == row["prediction"] == ["B-PER", "O", "O", "B-LOC", "O"]


def test_probe_checkpoint_refuses_another_head(tiny_model, sst_dir, tmp_path):
    out = tmp_path / "run"
    finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(out), probe_features="last",
                 epochs=1))
    with pytest.raises(BertkitError, match="probe"):
        load_model(out, head="token_classification")
    enc = load_model(out, head="encoder")                 # its encoder is the pre-trained one, unchanged
    ref = load_model(tiny_model, head="encoder")
    for (n, a), (_, b) in zip(enc.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), n


def test_cli_probe_options_are_one_line_errors(tiny_model, sst_dir, tmp_path, capsys):
    base = ["finetune", "--task", "sst2", "--data", str(sst_dir), "--model", str(tiny_model), "--out",
            str(tmp_path / "o"), "--no-progress", "--max-length", "16"]
    assert main(base + ["--probe-features", "last"]) == 1
    assert "--freeze" in capsys.readouterr().err
    assert main(base + ["--freeze"]) == 1                  # default concat_last_four on a 2-layer model
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has 2 layers" in err
    assert set(FEATURES) >= {"embeddings", "second_to_last", "last", "sum_last_four", "concat_last_four"}


def test_probe_exports_to_onnx(minilm, sst_dir, tmp_path):
    pytest.importorskip("onnxruntime")
    from bertkit.infer import Predictor
    from bertkit.infer.export import export_onnx

    src = tmp_path / "tiny"                  # a small random encoder with the real vocabulary
    torch.manual_seed(0)
    save_model(build("encoder", preset("tiny", vocab_size=30522, max_position_embeddings=128)), src)
    Tokenizer.from_dir(minilm).save(src)
    out = tmp_path / "run"
    finetune(cfg(task="sst2", data=str(sst_dir), model=str(src), out=str(out), probe_features="sum_all",
                 probe_pooling="mean", epochs=1, train_limit=64, dev_limit=16))
    export_onnx(out, out / "model.onnx")
    texts = ["the movie was good", "a bad plot and it is very poor", "fine"]
    got = [r["logits"] for r in Predictor.from_dir(out, backend="onnx").classify(texts, raw=True)]
    want = [r["logits"] for r in Predictor.from_dir(out, precision="fp32").classify(texts, raw=True)]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_causal_model_probes_read_the_last_token(tiny_model):
    """Under a causal mask [CLS] sees only itself: sentence probes default to the last real token
    (padded and packed agree) and refuse [CLS]."""
    from bertkit.packing import pack

    encoder = load_model(tiny_model, head="encoder")
    encoder.config.causal = True
    for block in encoder.blocks:
        block.attn.causal = True
    with pytest.raises(BertkitError, match="sees only itself"):
        ProbeModel(encoder, "sequence_classification", 2, "last", pooling="cls")
    probe = ProbeModel(encoder, "sequence_classification", 2, "concat_last_2").eval()
    assert probe.pooling == "last" and probe.record()["pooling"] == "last"
    tok = Tokenizer.from_dir(tiny_model)
    batch = tok(["the movie was good", "a bad plot and it is very poor"])
    with torch.no_grad():
        padded, _ = probe(**batch)
        flat, layout = pack(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        packed, _ = probe(flat["input_ids"], flat["token_type_ids"], packed=layout, position_ids=flat["position_ids"])
        states = encoder(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], all_layers=True)
        last = batch["attention_mask"].sum(-1) - 1
        x = torch.cat([states[i][torch.arange(2), last] for i in (1, 2)], -1)
        torch.testing.assert_close(padded, x @ probe.classifier.weight.T + probe.classifier.bias)
        torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-4)
