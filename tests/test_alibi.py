"""model.position_embedding_type=alibi: no position table, a distance penalty in attention. The
same numbers on every path (padded, packed, prepacked inference), a checkpoint that round-trips,
and pre-training that records it."""
from __future__ import annotations

import json

import pytest
import torch

from bertkit.config import BertConfig
from bertkit.model import BertForMaskedLM, init_weights
from bertkit.packing import pack


def alibi_model(causal: bool = False) -> BertForMaskedLM:
    cfg = BertConfig(vocab_size=300, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                     hidden_dropout=0.0, attention_dropout=0.0, position_embedding_type="alibi", causal=causal)
    torch.manual_seed(0)
    return init_weights(BertForMaskedLM(cfg), cfg).eval()


def batch():
    ids = torch.randint(5, 300, (3, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 24, dtype=torch.long)
    mask[1, 15:] = 0
    mask[2, 6:] = 0
    return ids, mask


@pytest.mark.parametrize("causal", [False, True])
def test_alibi_padded_packed_and_alone_agree(causal):
    """A sequence's outputs do not depend on its batch: alone, padded, or packed padding-free."""
    m = alibi_model(causal)
    assert not any("position" in n for n, _ in m.named_parameters())
    ids, mask = batch()
    with torch.no_grad():
        padded = m(ids, attention_mask=mask)["mlm_logits"]
        d, layout = pack(ids, mask)
        packed = m.mlm(m.bert(d["input_ids"], d["token_type_ids"], None, d["position_ids"], layout))
        for b in range(3):
            n = int(mask[b].sum())
            alone = m(ids[b:b + 1, :n])["mlm_logits"][0]
            torch.testing.assert_close(padded[b, :n], alone, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(packed, padded[mask.bool()], rtol=1e-5, atol=1e-5)


def test_alibi_attention_falls_with_distance():
    """With Q = K = 0 every score is the penalty alone: head h's weights go as 2^(-h |i - j|)."""
    from bertkit.model import alibi_slopes, attention_bias

    m = alibi_model()
    slopes = alibi_slopes(m.config)
    assert slopes.tolist() == [1.0, 0.5, 0.25, 0.125]
    q = torch.zeros(1, 4, 9, 16)
    w = torch.softmax(attention_bias(None, q, False, slopes)[0], -1)            # (H, T, T)
    i = 4
    for h, s in enumerate(slopes.tolist()):
        ratio = (w[h, i, i + 1] / w[h, i, i]).item()
        assert ratio == pytest.approx(2.718281828 ** -s, rel=1e-5)
        assert w[h, i, i - 2] == pytest.approx(w[h, i, i + 2].item())            # symmetric


def test_alibi_checkpoint_round_trip_and_inference(tmp_path):
    """config.json says position_embedding_type alibi; bertkit loads it back to the same outputs,
    and the Predictor (prepacked, padding-free) embeds as the model does."""
    from bertkit import Tokenizer
    from bertkit.checkpoint import load_model, save_model
    from bertkit.infer import Predictor

    m = alibi_model()
    save_model(m, tmp_path)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(295)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    Tokenizer.from_vocab(tmp_path / "vocab.txt").save(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["position_embedding_type"] == "alibi"
    back = load_model(tmp_path, head="masked_lm")
    ids, mask = batch()
    with torch.no_grad():
        torch.testing.assert_close(back(ids, attention_mask=mask)["mlm_logits"],
                                   m(ids, attention_mask=mask)["mlm_logits"], rtol=1e-5, atol=1e-5)
    texts = ["w1 w2 w3 w4 w5", "w7 w8", "w9 " * 30]
    pred = Predictor.from_dir(tmp_path, precision="fp32")
    got = pred.embed(texts, pooling="mean")
    tok = Tokenizer.from_dir(tmp_path)
    with torch.no_grad():
        for t, e in zip(texts, got):
            x = torch.tensor([[tok.cls_id, *tok.encode_ids([t])[0], tok.sep_id]])
            want = back.bert(x).mean(1)[0]
            assert torch.nn.functional.cosine_similarity(torch.as_tensor(e), want, dim=0) > 0.9999


def test_alibi_reaches_the_model_or_is_refused():
    from bertkit.runconfig import PretrainConfig, RunConfigError, load_config
    from bertkit.train.model import build_model

    cfg = load_config(PretrainConfig, None, ["--model.preset=tiny", "--model.position_embedding_type=alibi"])
    model = build_model(cfg, 200, None)
    assert model.bert.embeddings.position is None and model.config.position_embedding_type == "alibi"
    for bad, says in ((["--model.position_init=sinusoidal"], "no position table"),
                      (["--model.attention_init=neighbours"], "no position table")):
        with pytest.raises(RunConfigError, match=says):
            load_config(PretrainConfig, None, ["--model.position_embedding_type=alibi", *bad])
    with pytest.raises(RunConfigError):
        load_config(PretrainConfig, None, ["--model.position_embedding_type=rope"])
