"""`bertkit pretrain` end to end on a small real corpus (the bundled inaugural addresses)."""
from __future__ import annotations

import gzip
import json
import re
import math
from importlib import resources
from pathlib import Path

import pytest
import torch

from bertkit.checkpoint import load_model
from bertkit.runconfig import PretrainConfig, RunConfigError, load_config, save_config, to_dict


def make_data(root: Path, lengths=(64,)) -> dict[int, Path]:
    """A 1000-word WordPiece vocabulary and prepared data (NSP pairs, dynamic masking) per length."""
    from bertkit import Tokenizer
    from bertkit.data.prepare import PrepareConfig, prepare

    root.mkdir(parents=True, exist_ok=True)
    raw = root / "inaugural.txt"
    raw.write_bytes(gzip.decompress((resources.files("bertkit") / "sample" / "inaugural.txt.gz").read_bytes()))
    tok = Tokenizer.train([str(raw)], vocab_size=1000)
    return {L: Path(prepare([str(raw)], tok, root / f"d{L}", PrepareConfig(max_length=L), progress=False)
                    and root / f"d{L}") for L in lengths}


def tiny_config(data: Path, out: Path, **sections) -> PretrainConfig:
    """A 2-layer, 64-wide BERT, batch 4: a few updates per second on one core."""
    overrides = {"out": str(out), "data.path": str(data), "data.eval_instances": 16, "model.preset": "tiny",
                 "model.hidden_size": 64, "model.num_heads": 2, "model.intermediate_size": 128,
                 "train.batch_size": 4, "train.max_steps": 12, "train.log_every": 1, "train.eval_every": 6,
                 "train.checkpoint_every": 6, "train.progress": False, "train.threads": 1,
                 "optim.lr": 2e-3, "optim.warmup": 0.1}
    overrides.update(sections)
    return load_config(PretrainConfig, None, [f"--{k}={json.dumps(v) if not isinstance(v, str) else v}"
                                              for k, v in overrides.items()])


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[int, Path]:
    return make_data(tmp_path_factory.mktemp("pretrain_data"), (64, 128))


# ---- configuration -----------------------------------------------------------------------------
def test_config_unknown_key_hint_types_and_round_trip(tmp_path):
    with pytest.raises(RunConfigError, match="did you mean 'train.max_steps'"):
        load_config(PretrainConfig, None, ["--train.max_step=3"])
    with pytest.raises(RunConfigError, match="did you mean 'train.max_steps'"):
        load_config(PretrainConfig, None, ["--max_steps=3"])
    with pytest.raises(RunConfigError, match="train.batch_size: expected int"):
        load_config(PretrainConfig, None, ["--train.batch_size=big"])
    with pytest.raises(RunConfigError, match="optim.optimizer: 'sgd' is not one of"):
        load_config(PretrainConfig, None, ["--optim.optimizer=sgd"])
    with pytest.raises(RunConfigError, match="optim.name is now optim.optimizer"):     # fine-tuning's name
        load_config(PretrainConfig, None, ["--optim.name=lamb"])
    yml = tmp_path / "c.yaml"
    yml.write_text("train:\n  max_steps: 7\n  budgett: 3m\n")
    with pytest.raises(RunConfigError, match=r"c.yaml.*'train.budgett'.*did you mean 'train.budget'"):
        load_config(PretrainConfig, yml)
    cfg = load_config(PretrainConfig, None, ["--train.budget=30m", "--optim.lr=1e-3", "--optim.betas=[0.9, 0.98]"])
    assert cfg.optim.lr == 1e-3 and cfg.optim.betas == (0.9, 0.98) and cfg.train.budget == "30m"
    save_config(cfg, tmp_path / "resolved.yaml")
    assert to_dict(load_config(PretrainConfig, tmp_path / "resolved.yaml")) == to_dict(cfg)


def test_shipped_configs_load():
    root = Path(__file__).resolve().parents[1] / "configs" / "pretrain"
    names = sorted(p.stem for p in root.glob("*.yaml"))
    assert {"tiny", "mini", "small", "base", "large"} <= set(names)
    for p in root.glob("*.yaml"):
        text = p.read_text()
        assert text.startswith("#") and "bertkit pretrain" in text.splitlines()[0] + text.splitlines()[1]
        load_config(PretrainConfig, p)


def test_the_avx2_hour_is_the_hour_on_a_narrower_model():
    """cpu-60m-avx2.yaml is cpu-60m.yaml's recipe with only the shape and its learning rate changed
    (docs/pretrain-measurements.md, "One hour on a CPU with AVX2 only"): a lever added to one reaches the other."""
    from bertkit.train.model import build_model

    root = Path(__file__).resolve().parents[1] / "configs" / "pretrain"
    hour, avx2 = (to_dict(load_config(PretrainConfig, root / f"{n}.yaml")) for n in ("cpu-60m", "cpu-60m-avx2"))
    flat = [{(s, k): v for s, sec in d.items() if isinstance(sec, dict) for k, v in sec.items()}
            | {(s, None): v for s, v in d.items() if not isinstance(v, dict) and s != "out"} for d in (hour, avx2)]
    assert ("resume", None) in flat[0]                        # the top-level keys are compared too (not `out`)
    assert {key for key in flat[0] if flat[0][key] != flat[1][key]} == {
        ("model", "preset"), ("model", "num_layers"), ("optim", "lr")}
    model = build_model(load_config(PretrainConfig, root / "cpu-60m-avx2.yaml"), 8000, None)
    c = model.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.intermediate_size) == (4, 128, 2, 512)
    assert c.position_embedding_type == "alibi" and c.norm_position == "pre"


# ---- the padding-free path is the padded path -----------------------------------------------------
def test_packed_step_equals_padded(data):
    from bertkit import preset
    from bertkit.data.masking import Collator
    from bertkit.data.pretraining import open_dataset
    from bertkit.model import BertForPreTraining, init_weights
    from bertkit.train.model import forward

    ds = open_dataset(data[64])
    order = ds.lengths().argsort()
    batch = Collator(ds, seed=0)([ds[int(i)] for i in [*order[:4], *order[-4:]]], epoch=0)
    assert (batch["attention_mask"] == 0).any()           # a ragged batch
    cfg = preset("tiny", vocab_size=ds.meta["vocab_size"], hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = init_weights(BertForPreTraining(cfg), cfg)
    a, b = forward(model, batch, packed=False), forward(model, batch, packed=True)
    torch.testing.assert_close(a["loss"], b["loss"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a["mlm_logits"], b["mlm_logits"], atol=1e-4, rtol=1e-4)
    a["loss"].backward()
    g_pad = model.bert.blocks[0].attn.query.weight.grad.clone()
    model.zero_grad()
    b["loss"].backward()
    torch.testing.assert_close(model.bert.blocks[0].attn.query.weight.grad, g_pad, atol=1e-5, rtol=1e-4)


# ---- a whole run --------------------------------------------------------------------------------------
def test_pretrain_run_learns_and_leaves_everything(data, tmp_path):
    from bertkit.sources import read_jsonl
    from bertkit.train import pretrain

    cfg = tiny_config(data[64], tmp_path / "run", **{"train.max_steps": 40, "train.eval_every": 20,
                                                      "train.checkpoint_every": 20, "train.keep_checkpoints": 1})
    card = pretrain(cfg, command="test")
    out = tmp_path / "run"
    metrics, evals = read_jsonl(out / "metrics.jsonl"), read_jsonl(out / "eval.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, 41))
    for key in ("step", "loss", "mlm_loss", "mlm_accuracy", "nsp_accuracy", "lr", "tokens_per_s"):
        assert key in metrics[0]
    assert [e["step"] for e in evals] == [0, 20, 40]
    # it learns: held-out MLM loss falls well below its start (log V = 6.9 for random weights)
    assert evals[-1]["eval_mlm_loss"] < evals[0]["eval_mlm_loss"] - 0.5
    assert math.isclose(evals[-1]["eval_perplexity"], math.exp(evals[-1]["eval_mlm_loss"]), rel_tol=1e-6)
    assert card["updates"] == 40 and card["tokens_seen"] > 0 and card["final_eval"] == evals[-1]
    assert 0 < card["mfu"] < 1.5 and card["parameters"] > 0 and card["global_batch"] == 4
    # train.packed auto on the CPU is chosen from this data's share of real tokens, and says so
    assert card["packed_reason"].startswith("auto: ") and "real tokens" in card["packed_reason"]
    assert card["packed"] == card["packed_reason"].startswith("auto: padding-free")
    assert (out / "run_card.md").read_text().startswith("# Run card")
    assert json.loads((out / "run_card.json").read_text())["command"] == "test"
    assert (out / "curves.png").stat().st_size > 1000
    assert load_config(PretrainConfig, out / "config.yaml").train.max_steps == 40
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000040"]   # keep_checkpoints=1
    # lr: linear warm-up over 4 updates, then linear decay to 0 at update 40 (logged lr = the update's lr)
    assert metrics[0]["lr"] == 0.0 and metrics[4]["lr"] == 2e-3
    assert math.isclose(metrics[5]["lr"], 2e-3 * 35 / 36, rel_tol=1e-9)


def test_transformers_loads_the_checkpoint(data, tmp_path):
    transformers = pytest.importorskip("transformers")
    from bertkit.checkpoint import load_model
    from bertkit.data.masking import Collator
    from bertkit.data.pretraining import open_dataset
    from bertkit.train import pretrain

    pretrain(tiny_config(data[64], tmp_path / "run", **{"train.max_steps": 3}))
    folder = tmp_path / "run" / "checkpoints" / "step-00000003" / "model"
    hf = transformers.BertForPreTraining.from_pretrained(folder).eval()
    ours = load_model(tmp_path / "run" / "final", head="pretraining").eval()
    ds = open_dataset(data[64])
    batch = Collator(ds, seed=0)([ds[i] for i in range(4)], epoch=0)
    with torch.no_grad():
        ref = hf(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                 attention_mask=batch["attention_mask"])
        out = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(out["mlm_logits"][real], ref.prediction_logits[real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out["nsp_logits"], ref.seq_relationship_logits, atol=1e-4, rtol=1e-4)
    assert transformers.BertTokenizerFast.from_pretrained(folder).vocab_size == ds.meta["vocab_size"]


# ---- non-finite losses ------------------------------------------------------------------------------
def test_nan_steps_are_skipped_then_the_run_stops(data, tmp_path, monkeypatch):
    import bertkit.train as T

    real_forward, calls = T.forward, {"n": 0}

    def flaky(model, batch, packed, bad=lambda n: n in (3, 4)):
        out = real_forward(model, batch, packed)
        if not model.training:
            return out
        calls["n"] += 1
        if bad(calls["n"]):
            out["loss"] = out["loss"] * float("nan")
        return out

    monkeypatch.setattr(T, "forward", flaky)
    card = T.pretrain(tiny_config(data[64], tmp_path / "a", **{"train.max_steps": 6, "train.eval_every": 0}))
    assert card["skipped_updates"] == 2 and card["updates"] == 6 and card["stop_reason"] == "max_steps"
    metrics = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(m["mlm_loss"]) for m in metrics if m["step"] not in (3, 4))
    assert metrics[2]["loss"] is None and metrics[2]["skipped"] == 1 and metrics[3]["skipped"] == 2
    for p in load_model(tmp_path / "a" / "final", head="pretraining").parameters():
        assert torch.isfinite(p).all()

    calls["n"] = 0
    monkeypatch.setattr(T, "forward", lambda m, b, p: flaky(m, b, p, bad=lambda n: n >= 2))
    card = T.pretrain(tiny_config(data[64], tmp_path / "b", **{"train.max_steps": 50, "train.max_bad_steps": 3,
                                                               "train.eval_every": 0}))
    assert card["updates"] == 4 and "3 non-finite losses in a row" in card["stop_reason"]
    assert (tmp_path / "b" / "checkpoints" / "step-00000004" / "manifest.json").exists()


# ---- two phases and the time budget ----------------------------------------------------------------
def test_two_phases_from_one_config(data, tmp_path):
    from bertkit.sources import read_jsonl
    from bertkit.train import pretrain

    card = pretrain(tiny_config(data[64], tmp_path / "run", **{
        "data.long_path": str(data[128]), "train.max_steps": 8, "train.long_fraction": 0.25,
        "train.long_batch_size": 2, "train.eval_every": 0}))
    phases = [m["phase"] for m in read_jsonl(tmp_path / "run" / "metrics.jsonl")]
    assert phases == [0] * 6 + [1] * 2
    assert card["sequence_lengths"] == [64, 128] and card["global_batch"] == 4


def test_time_budget_becomes_a_planned_number_of_updates(data, tmp_path):
    from bertkit.optim import lr_at
    from bertkit.sources import read_jsonl
    from bertkit.train import pretrain

    card = pretrain(tiny_config(data[64], tmp_path / "run", **{
        "train.budget": "4s", "train.max_steps": 100000, "train.eval_every": 0, "optim.warmup": 0.25}))
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    n = card["planned_updates"]
    assert card["stop_reason"] == f"budget: {n} updates planned" and card["updates"] == n and len(metrics) == n
    assert 1.0 <= card["wall_time_s"] < 30          # about the budget (the plan comes from timed updates)
    for m in metrics:               # the schedule spans the planned updates, as a run of max_steps=n would
        assert m["lr"] == pytest.approx(lr_at(m["step"] - 1, n, 0.25 * n, 2e-3))


def test_cli_pretrain_and_errors(data, tmp_path, capsys):
    from bertkit.cli import main

    with pytest.raises(SystemExit) as e:             # options come from PretrainConfig: argparse's one line
        main(["pretrain", "--train.max_stepz=3"])
    assert e.value.code == 1 and "did you mean --train.max_steps?" in capsys.readouterr().err
    assert main(["pretrain", "--out", str(tmp_path / "x")]) == 1
    assert "data.path is not set" in capsys.readouterr().err
    code = main(["pretrain", "--out", str(tmp_path / "run"), f"--data.path={data[64]}", "--model.preset=tiny",
                 "--train.max_steps=2", "--train.batch_size=4", "--train.progress=false", "--train.eval_every=0",
                 "--data.eval_instances=8", "--train.threads=1"])
    assert code == 0 and (tmp_path / "run" / "final" / "model.safetensors").exists()


def test_mask_accuracy_counts_the_positions_that_show_mask(data, tmp_path):
    """eval_mask_accuracy is the accuracy at chosen positions whose input is [MASK]: with every chosen
    token replaced by [MASK] it equals the overall accuracy; with none replaced there is none to count."""
    from bertkit.train import pretrain

    all_masked = pretrain(tiny_config(data[64], tmp_path / "all", **{"train.max_steps": 6, "data.mask_token_fraction": 1.0,
                                                                      "data.random_token_fraction": 0.0}))
    e = all_masked["final_eval"]
    assert e["eval_mask_accuracy"] == pytest.approx(e["eval_mlm_accuracy"], abs=1e-12)
    none_masked = pretrain(tiny_config(data[64], tmp_path / "none", **{"train.max_steps": 6, "data.mask_token_fraction": 0.0,
                                                                        "data.random_token_fraction": 0.0}))
    assert "eval_mask_accuracy" not in none_masked["final_eval"]


def test_position_init_reaches_the_model_or_is_refused(tmp_path):
    """model.position_init=sinusoidal fills the new model's position table; with init_from (whose
    checkpoint brings its own table) it is an error, not a setting that silently does nothing."""
    import torch

    from bertkit.model import sinusoidal_positions_
    from bertkit.train.model import build_model

    cfg = load_config(PretrainConfig, None, ["--model.preset=tiny", "--model.position_init=sinusoidal"])
    table = build_model(cfg, 100, None).bert.embeddings.position.weight
    expected = sinusoidal_positions_(torch.empty_like(table), 0.02)
    assert torch.equal(table, expected) and abs(table.std().item() - 0.02) < 1e-4
    with pytest.raises(RunConfigError, match="model.position_init 'sinusoidal' starts a new model"):
        load_config(PretrainConfig, None, ["--model.position_init=sinusoidal", f"--model.init_from={tmp_path}"])


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_neighbour_attention_init_points_each_head_at_its_neighbour(norm):
    """model.attention_init=neighbours: at step 0 head h of every layer puts most of its attention on
    the token at its offset (-1, +1, -2, +2, ...), on any input; the weights are still a plain BERT
    (the same names and shapes), so the checkpoint loads anywhere a BERT does."""
    import torch

    from bertkit.model import BertModel
    from bertkit.train.model import build_model

    cfg = load_config(PretrainConfig, None, ["--model.preset=tiny", "--model.num_heads=4", "--model.num_layers=2",
                                             f"--model.norm_position={norm}", "--model.attention_init=neighbours"])
    model = build_model(cfg, 500, None).eval()
    plain = build_model(load_config(PretrainConfig, None, ["--model.preset=tiny", "--model.num_heads=4",
                                                            "--model.num_layers=2", f"--model.norm_position={norm}"]),
                         500, None)
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in plain.state_dict().items()}
    bert: BertModel = model.bert
    ids = torch.randint(5, 500, (2, 60), generator=torch.Generator().manual_seed(1))
    x = bert.embeddings(ids, torch.zeros_like(ids), torch.arange(60).expand(2, -1))
    offsets = [-1, 1, -2, 2]
    for layer, block in enumerate(bert.blocks):
        h_in = block.norm1(x) if norm == "pre" else x
        q = block.attn.query(h_in).unflatten(-1, (4, -1)).transpose(1, 2)        # (B, H, T, D)
        k = block.attn.key(h_in).unflatten(-1, (4, -1)).transpose(1, 2)
        w = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).softmax(-1)           # (B, H, T, T)
        for h in range(4):
            d = offsets[(layer * 4 + h) % 4]
            i = torch.arange(5, 55)
            at_offset = w[:, h, i, i + d].mean().item()
            assert at_offset > 0.2, (layer, h, d, at_offset)                        # random init: ~1/60
        x = block(x, None)
    with pytest.raises(RunConfigError, match="sets the position table itself"):
        load_config(PretrainConfig, None, ["--model.attention_init=neighbours", "--model.position_init=sinusoidal"])
    with pytest.raises(RunConfigError, match="model.attention_init 'neighbours' starts a new model"):
        load_config(PretrainConfig, None, ["--model.attention_init=neighbours", "--model.init_from=/x"])


def test_init_from_trains_the_checkpoints_architecture_and_says_so(data, tmp_path):
    """Continued pre-training (model.init_from): the checkpoint's architecture, never a model key
    silently ignored: one that contradicts the checkpoint is refused by name; dropout, which changes
    no weight, is applied when given; config.yaml and the run card say what trained, and the
    written config.yaml runs again."""
    from bertkit.train import pretrain

    steps = {"train.max_steps": 1, "train.eval_every": 0, "train.checkpoint_every": 0, "train.nsp": False}
    src = tiny_config(data[64], tmp_path / "src", **steps, **{"model.position_embedding_type": "alibi",
                                                             "model.norm_position": "pre", "model.hidden_dropout": 0.0,
                                                             "model.attention_dropout": 0.0})
    pretrain(src, command="test")
    final = str(tmp_path / "src" / "final")
    assert json.loads((Path(final) / "config.json").read_text())["bertkit_trained_length"] == 64   # (ALiBi's limit)
    cont = tiny_config(data[64], tmp_path / "cont", **steps, **{"model.init_from": final})
    card = pretrain(cont, command="test")
    assert card["dropout"] == "hidden 0.0, attention 0.0" and card["normalisation"].startswith("pre-LN")
    written = load_config(PretrainConfig, tmp_path / "cont" / "config.yaml", [])
    m = written.model
    assert (m.position_embedding_type, m.norm_position, m.hidden_dropout, m.num_layers, m.hidden_size) == \
        ("alibi", "pre", 0.0, 2, 64)
    written.out = str(tmp_path / "again")
    pretrain(written, command="test")                                   # the record runs as it says
    drop = tiny_config(data[64], tmp_path / "drop", **steps, **{"model.init_from": final, "model.hidden_dropout": 0.2})
    assert pretrain(drop, command="test")["dropout"] == "hidden 0.2, attention 0.0"
    assert json.loads((tmp_path / "drop" / "final" / "config.json").read_text())["hidden_dropout_prob"] == 0.2
    m = load_config(PretrainConfig, tmp_path / "drop" / "config.yaml", []).model
    assert (m.hidden_dropout, m.attention_dropout) == (0.2, 0.0)        # given, and the checkpoint's
    pretrain(tiny_config(data[64], tmp_path / "new", **steps), command="test")
    m = load_config(PretrainConfig, tmp_path / "new" / "config.yaml", []).model
    assert (m.hidden_dropout, m.attention_dropout) == (0.1, 0.1)        # a new model: BERT's, recorded
    for key, value, says in (("model.num_layers", 4, "model.num_layers=4 (it has 2)"),
                             ("model.hidden_act", "relu", "model.hidden_act='relu' (it has 'gelu')"),
                             ("model.preset", "small", "model.num_layers=4 (it has 2)"),
                             ("model.position_embedding_type", "absolute", None)):
        bad = tiny_config(data[64], tmp_path / f"bad-{value}", **steps, **{"model.init_from": final, key: value})
        if says is None:       # 'absolute' is the default: the checkpoint's ALiBi is kept (and recorded)
            pretrain(bad, command="test")
            assert bad.model.position_embedding_type == "alibi"
            continue
        if key == "model.preset":
            bad = load_config(PretrainConfig, None, [f"--data.path={data[64]}", f"--out={tmp_path / 'bad-preset'}",
                                                     "--model.preset=small", f"--model.init_from={final}",
                                                     "--train.max_steps=1", "--train.nsp=false"])
        with pytest.raises(RunConfigError, match=re.escape(says)):
            pretrain(bad, command="test")


def test_classifier_pooling_travels_from_pretraining_to_fine_tuning(data, tmp_path):
    """model.classifier_pooling=mean is written into the checkpoint; a sentence head fine-tuned
    from it pools the mean of the tokens unless `finetune --pooling` says otherwise."""
    from bertkit.finetune import FinetuneConfig, build_model
    from bertkit.tasks import get_task
    from bertkit.train import pretrain

    cfg = tiny_config(data[64], tmp_path / "run", **{"train.max_steps": 2, "train.eval_every": 0,
                                                      "train.checkpoint_every": 0, "train.nsp": False,
                                                      "model.classifier_pooling": "mean"})
    card = pretrain(cfg, command="test")
    assert card["sentence_pooling"].startswith("mean")
    final = tmp_path / "run" / "final"
    assert json.loads((final / "config.json").read_text())["classifier_pooling"] == "mean"
    # continuing with model.init_from keeps the checkpoint's choice unless the config names one
    for asked, expect in ((None, "mean"), ("cls", "cls")):
        more = {"model.classifier_pooling": asked} if asked else {}
        again = tiny_config(data[64], tmp_path / f"again-{asked}", **{"train.max_steps": 1, "train.eval_every": 0,
                                                                      "train.checkpoint_every": 0, "train.nsp": False,
                                                                      "model.init_from": str(final), **more})
        assert pretrain(again, command="test")["sentence_pooling"].startswith("mean" if expect == "mean" else "[CLS]")
        written = json.loads((tmp_path / f"again-{asked}" / "final" / "config.json").read_text())
        assert written.get("classifier_pooling", "cls") == expect, asked
    task = get_task("sst2")
    for pooling, init, expect in ((None, "pretrained", "mean"), (None, "random", "mean"), ("cls", "pretrained", "cls")):
        model = build_model(task, FinetuneConfig(task="sst2", model=str(final), init=init, pooling=pooling), ["0", "1"])
        assert model.config.classifier_pooling == model.bert.config.classifier_pooling == expect, (pooling, init)
