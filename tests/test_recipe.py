"""The pre-training recipe levers: pre-LN placement and the warmup-stable-decay schedule."""
import pytest
import torch

from bertkit.checkpoint import build, load_model, save_model
from bertkit.config import BertConfig, ConfigError, preset
from bertkit.fast import pack
from bertkit.optim import lr_at


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
