"""The pre-training recipe levers: pre-LN placement and the warmup-stable-decay schedule."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.checkpoint import build, load_model, save_model
from bertkit.config import BertConfig, ConfigError, preset
from bertkit.optim import lr_at
from bertkit.packing import pack


def _ids(B=3, T=12, V=100, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    return ids, mask


def test_pre_ln_block_is_pre_norm_and_packed_equals_padded(tmp_path):
    cfg = preset("tiny", vocab_size=100, norm_position="pre", hidden_dropout=0.0, attention_dropout=0.0)
    model = build("encoder", cfg).eval()
    assert model.final_norm is not None and all(b.pre_norm for b in model.blocks)
    ids, mask = _ids()
    padded = model(ids, attention_mask=mask)
    flat, layout = pack(ids, mask, torch.zeros_like(ids))
    packed = model(flat["input_ids"], flat["token_type_ids"], packed=layout, position_ids=flat["position_ids"])
    torch.testing.assert_close(packed, padded[mask.bool()], atol=1e-5, rtol=1e-5)
    # the final LayerNorm is what makes the output normalised: each token state has ~zero mean
    assert padded[mask.bool()].mean(-1).abs().max() < 1e-4
    # and a post-LN model with the same weights computes something else
    post = build("encoder", preset("tiny", vocab_size=100, hidden_dropout=0.0, attention_dropout=0.0)).eval()
    missing = post.load_state_dict(model.state_dict(), strict=False)
    assert missing.unexpected_keys == ["final_norm.weight", "final_norm.bias"]
    assert not torch.allclose(post(ids, attention_mask=mask), padded, atol=1e-3)


def test_pre_ln_round_trips_through_the_checkpoint(tmp_path):
    cfg = preset("tiny", vocab_size=100, norm_position="pre")
    model = build("pretraining", cfg).eval()
    save_model(model, tmp_path)
    again = load_model(tmp_path, head="pretraining").eval()
    assert again.config.norm_position == "pre"
    ids, mask = _ids()
    torch.testing.assert_close(again(ids, attention_mask=mask)["mlm_logits"],
                               model(ids, attention_mask=mask)["mlm_logits"], atol=0, rtol=0)
    # a post-LN checkpoint writes no bertkit-only key: transformers reads it as it is
    save_model(build("pretraining", preset("tiny", vocab_size=100)), tmp_path / "post")
    assert "bertkit_norm_position" not in (tmp_path / "post" / "config.json").read_text()


def test_norm_position_is_checked():
    with pytest.raises(ConfigError, match="norm_position"):
        BertConfig(vocab_size=10, hidden_size=8, num_heads=2, num_layers=1, intermediate_size=8, norm_position="mid")


def test_wsd_schedule_is_a_trapezoid():
    lr = [lr_at(s, 100, 10, 1.0, "wsd", 0.0, decay_fraction=0.2) for s in range(101)]
    assert lr[0] == 0.0 and lr[5] == pytest.approx(0.5)
    assert all(v == 1.0 for v in lr[10:81])              # stable until the last 20%
    assert lr[90] == pytest.approx(0.5) and lr[100] == 0.0
    assert all(a >= b for a, b in zip(lr[10:], lr[11:]))


# ---- bf16 autocast in pre-training, and evaluation against the training clock ----------------------
def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def data64(tmp_path_factory):
    from test_pretrain import make_data
    return make_data(tmp_path_factory.mktemp("recipe_data"), (64,))[64]


@pytest.mark.slow
def test_bf16_and_fp32_loss_curves_agree_within_seed_noise(data64, tmp_path, monkeypatch):
    """bf16 autocast (fp32 master weights) follows the fp32 loss curve as closely as another seed
    does. bf16 is forced on, so the test runs the same on every CPU (slowly where it is emulated)."""
    from test_pretrain import tiny_config
    from bertkit.train import pretrain

    monkeypatch.setenv("BERTKIT_BF16", "1")
    common = {"train.max_steps": 240, "train.log_every": 1, "train.eval_every": 0, "train.checkpoint_every": 0,
              "data.eval_instances": 8, "model.hidden_dropout": 0.0, "model.attention_dropout": 0.0}
    runs = {}
    for name, precision, seed in (("fp32", "fp32", 0), ("bf16", "bf16", 0), ("fp32_seed1", "fp32", 1)):
        card = pretrain(tiny_config(data64, tmp_path / name, **common, **{"train.precision": precision,
                                                                         "train.seed": seed}))
        assert card["precision"] == ("bfloat16" if precision == "bf16" else "float32")
        runs[name] = _losses(tmp_path / name)
    tail = lambda xs: sum(xs[-60:]) / 60                  # mean loss over the last quarter
    first = lambda xs: sum(xs[:10]) / 10
    assert tail(runs["fp32"]) < first(runs["fp32"]) - 0.5, "the tiny model should learn in 240 updates"
    seed_noise = abs(tail(runs["fp32"]) - tail(runs["fp32_seed1"]))
    gap = abs(tail(runs["bf16"]) - tail(runs["fp32"]))
    assert runs["bf16"] != runs["fp32"], "bf16 autocast did not reach the computation"
    assert gap <= max(2 * seed_noise, 0.05 * tail(runs["fp32"])), (gap, seed_noise)


def test_auto_precision_follows_the_measured_speed(data64, tmp_path, monkeypatch):
    from test_pretrain import tiny_config
    from bertkit.train import pretrain

    for env, expected in (("1", "bfloat16"), ("0", "float32")):
        monkeypatch.setenv("BERTKIT_BF16", env)
        card = pretrain(tiny_config(data64, tmp_path / env, **{"train.max_steps": 2, "train.precision": "auto"}))
        assert card["precision"] == expected
        assert card["precision_reason"].startswith("auto")


def test_time_based_evaluation_gives_a_curve_on_the_training_clock(data64, tmp_path):
    from test_pretrain import tiny_config
    from bertkit.train import pretrain

    card = pretrain(tiny_config(data64, tmp_path / "t", **{"train.max_steps": 30, "train.eval_every": 0,
                                                           "train.eval_minutes": 1e-9, "train.precision": "fp32"}))
    rows = [json.loads(line) for line in (tmp_path / "t" / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(31))          # before training, then after every update
    assert all(r["elapsed_s"] <= card["wall_time_s"] + 0.05 for r in rows)     # the card rounds to 0.1 s
    assert [r["tokens"] for r in rows] == sorted(r["tokens"] for r in rows) and rows[-1]["tokens"] == card["tokens_seen"]


def test_a_causal_model_pools_its_last_real_token():
    """Under a causal mask [CLS] sees only itself: pooling it would give every input the same
    sentence vector. A causal model pools the last real token, in the padded and packed layouts."""
    cfg = preset("tiny", vocab_size=100, causal=True, hidden_dropout=0.0, attention_dropout=0.0)
    model = build("sequence_classification", cfg, num_labels=3).eval()
    ids, mask = _ids()
    logits, _ = model(ids, attention_mask=mask)
    changed = ids.clone()
    changed[0, 7] = (changed[0, 7] + 1) % 100                # a token near the end of sequence 0
    assert not torch.allclose(model(changed, attention_mask=mask)[0][0], logits[0])
    flat, layout = pack(ids, mask, torch.zeros_like(ids))
    packed, _ = model(flat["input_ids"], flat["token_type_ids"], packed=layout, position_ids=flat["position_ids"])
    torch.testing.assert_close(packed, logits, atol=1e-5, rtol=1e-5)
    # padding after the last real token changes nothing
    longer_ids = torch.cat([ids, torch.zeros(3, 4, dtype=ids.dtype)], 1)
    longer_mask = torch.cat([mask, torch.zeros(3, 4, dtype=mask.dtype)], 1)
    torch.testing.assert_close(model(longer_ids, attention_mask=longer_mask)[0], logits, atol=1e-5, rtol=1e-5)


def test_data_fill_is_real_tokens_per_position_of_the_longest_training_instance():
    from types import SimpleNamespace

    from bertkit.train.phases import data_fill

    data = SimpleNamespace(lengths=lambda: np.array([128, 64, 96, 128, 32]))
    assert data_fill(SimpleNamespace(data=data, indices=np.arange(4))) == pytest.approx(416 / 4 / 128)
    assert data_fill(SimpleNamespace(data=data, indices=np.arange(5)), sample=2) == pytest.approx(0.75)
    assert data_fill(SimpleNamespace(data=data, indices=np.arange(0))) is None


def test_packed_auto_follows_the_device_the_data_and_what_varlen_can_run():
    """'auto' on the CPU packs only data with much padding for a model wider than BERT-tiny (padded
    ran more updates on prepare's 83%-full data at every width); on a GPU only where varlen flash
    attention runs it (bf16/fp16 and no attention dropout), since packed attention is otherwise a
    padded call plus copies (slower on an H200); the reason is recorded for the run card."""
    from bertkit import packing
    from bertkit.model import BertConfig
    from bertkit.train import resolve_packed

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    drop, nodrop = BertConfig(attention_dropout=0.1), BertConfig(attention_dropout=0.0)
    assert drop.hidden_size > 128
    assert resolve_packed("auto", cpu, torch.float32, drop, fill=lambda: 0.5)[0] is True
    packed, why = resolve_packed("auto", cpu, torch.float32, drop, fill=lambda: 0.9)
    assert packed is False and "90% real tokens" in why
    assert resolve_packed("auto", cpu, torch.float32, drop)[0] is False          # fill unknown: padded
    narrow = BertConfig(hidden_size=128, num_heads=2)
    assert resolve_packed("auto", cpu, torch.float32, narrow, fill=lambda: 0.5)[0] is False
    def unread() -> float:
        raise AssertionError("the data's fill is read only for CPU auto")
    assert resolve_packed("false", cpu, torch.float32, nodrop, unread) == (False, "asked: train.packed=false")
    assert resolve_packed("true", gpu, torch.float32, drop, unread)[0] is True
    assert resolve_packed("auto", gpu, torch.float32, nodrop, unread)[0] is False
    packed, why = resolve_packed("auto", gpu, torch.bfloat16, drop)
    assert packed is False and "dropout" in why
    if packing._varlen_attn is not None:
        assert resolve_packed("auto", gpu, torch.bfloat16, nodrop) == (True, "auto: packed (varlen flash attention)")
        alibi = BertConfig(attention_dropout=0.0, position_embedding_type="alibi")   # packed: padded SDPA + gathers
        packed, why = resolve_packed("auto", gpu, torch.bfloat16, alibi)
        assert packed is False and "ALiBi" in why
