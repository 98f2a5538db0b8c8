"""Parity with Hugging Face transformers is the specification."""
from __future__ import annotations

import json

import pytest
import torch

import bertkit
from bertkit.checkpoint import CheckpointError, load_model, save_model
from bertkit.config import BertConfig, ConfigError, preset
from bertkit.model import BertForPreTraining, BertModel, init_weights
from bertkit.packing import pack, unpack

from conftest import hf_tiny_config

transformers = pytest.importorskip("transformers")
torch.manual_seed(0)


def random_batch(B=4, T=13, vocab=1000, seed=0, pairs=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    lengths = torch.tensor([T, T - 4, 5, T - 1][:B])
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    types = ((torch.arange(T)[None] >= (lengths[:, None] // 2)) & mask.bool()).long() if pairs else torch.zeros_like(ids)
    ids = ids * mask
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


def test_minilm_hidden_states_equal_transformers(minilm):
    tok = bertkit.load_tokenizer(minilm)
    ours = load_model(minilm).eval()
    ref = transformers.BertModel.from_pretrained(minilm, attn_implementation="sdpa").eval()
    texts = ["The quick brown fox jumps over the lazy dog.", "Hello there!", "Short."]
    pairs = ["A second segment that is rather longer than the first one.", "General Kenobi.", "x"]
    batch = tok(texts, pairs)
    assert batch["attention_mask"].min() == 0  # really padded
    with torch.no_grad():
        h = ours(**batch)
        r = ref(**batch)
    mask = batch["attention_mask"].bool()
    assert (h - r.last_hidden_state)[mask].abs().max() < 1e-5
    assert (ours.pool(h) - r.pooler_output).abs().max() < 1e-5
    # reference values from BASELINES.md (single sentence)
    with torch.no_grad():
        single = ours(**tok(["The quick brown fox jumps over the lazy dog."]))
    expected = torch.tensor([0.046444, 0.338062, 0.208205, 0.646797, -0.195709])
    assert torch.allclose(single[0, 0, :5], expected, atol=1e-5)


def test_packed_path_equals_padded(minilm):
    tok = bertkit.load_tokenizer(minilm)
    model = load_model(minilm).eval()
    batch = tok(["one", "a sentence of medium length here", "and a much longer sentence " * 4], ["b", None, "c"][:0] or None)
    with torch.no_grad():
        padded = model(**batch)
        flat, layout = pack(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        packed = model(flat["input_ids"], flat["token_type_ids"], position_ids=flat["position_ids"], packed=layout)
    mask = batch["attention_mask"].bool()
    assert packed.shape == (int(mask.sum()), 384)
    assert (unpack(packed, layout) - padded)[mask].abs().max() < 1e-5
    assert (model.pool(packed, layout) - model.pool(padded)).abs().max() < 1e-5


HEAD_CASES = [
    ("BertModel", "encoder", {}),
    ("BertForPreTraining", "pretraining", {}),
    ("BertForMaskedLM", "masked_lm", {}),
    ("BertForSequenceClassification", "sequence_classification", {"num_labels": 3}),
    ("BertForSequenceClassification", "sequence_classification", {"num_labels": 1}),
    ("BertForTokenClassification", "token_classification", {"num_labels": 5}),
    ("BertForQuestionAnswering", "question_answering", {}),
    ("BertForMultipleChoice", "multiple_choice", {}),
]


def _hf_outputs(name, hf, batch):
    if name == "BertForMultipleChoice":
        mc = {k: torch.stack([v, v.roll(1, 0)]) for k, v in batch.items()}  # (2, K=4, T)
        return hf(**mc).logits, mc
    out = hf(**batch)
    if name == "BertModel":
        return (out.last_hidden_state, out.pooler_output), batch
    if name == "BertForPreTraining":
        return (out.prediction_logits, out.seq_relationship_logits), batch
    if name == "BertForQuestionAnswering":
        return (out.start_logits, out.end_logits), batch
    return out.logits, batch


def _our_outputs(name, model, batch):
    if name == "BertModel":
        h = model(**batch)
        return (h, model.pool(h))
    if name == "BertForPreTraining":
        o = model(**batch)
        return (o["mlm_logits"], o["nsp_logits"])
    if name == "BertForMaskedLM":
        return model(**batch)["mlm_logits"]
    if name == "BertForQuestionAnswering":
        return model(**batch)[0]
    return model(**batch)[0]


# every head with gelu_new; the exact gelu and relu on two heads
ACT_CASES = [(*case, "gelu_new") for case in HEAD_CASES] + [
    (*case, act) for case in HEAD_CASES[1:4:2] for act in ("gelu", "relu")]


@pytest.mark.parametrize("name,head,args,act", ACT_CASES)
def test_every_head_equals_transformers(tmp_path, name, head, args, act):
    torch.manual_seed(1)
    hf = getattr(transformers, name)(hf_tiny_config(hidden_act=act, **args)).eval()
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path).eval()
    assert ours.config.hidden_act == act
    batch = random_batch()
    with torch.no_grad():
        ref, fed = _hf_outputs(name, hf, batch)
        got = _our_outputs(name, ours, fed)
    ref = ref if isinstance(ref, tuple) else (ref,)
    got = got if isinstance(got, tuple) else (got,)
    mask = batch["attention_mask"].bool()
    for r, g in zip(ref, got):
        assert r.shape == g.shape
        if r.dim() >= 2 and r.shape[:2] == mask.shape:
            r, g = r[mask], g[mask]
        assert (r - g).abs().max() < 1e-5, name


@pytest.mark.parametrize("name,head,args", HEAD_CASES)
def test_transformers_loads_what_bertkit_saves(tmp_path, name, head, args):
    cfg = BertConfig(vocab_size=1000, hidden_size=48, num_layers=3, num_heads=3, intermediate_size=100,
                     hidden_act="gelu_new", max_position_embeddings=64)
    model = bertkit.checkpoint.build(head, cfg, **args).eval()
    save_model(model, tmp_path)
    hf, info = getattr(transformers, name).from_pretrained(tmp_path, output_loading_info=True)
    hf.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    batch = random_batch()
    with torch.no_grad():
        ref, fed = _hf_outputs(name, hf, batch)
        got = _our_outputs(name, model, fed)
    ref = ref if isinstance(ref, tuple) else (ref,)
    got = got if isinstance(got, tuple) else (got,)
    for r, g in zip(ref, got):
        assert (r - g).abs().max() < 1e-5
    # and back again: bertkit loads its own folder as the same head
    again = load_model(tmp_path)
    assert type(again) is type(model)


@pytest.mark.parametrize("variant", [{}, {"norm_position": "pre"}, {"position_embedding_type": "alibi"},
                                     {"causal": True}, {"classifier_pooling": "mean"}])
def test_transformers_refuses_what_it_would_compute_differently(tmp_path, variant):
    """Plain BERT is saved as model_type 'bert' and loads in transformers to the same outputs; a
    bertkit-only architecture is saved as 'bertkit' (BertkitFor... classes), which transformers'
    AutoConfig / AutoModel refuse instead of loading it as plain BERT. bertkit loads both, and an
    older checkpoint that says 'bert' with bertkit's keys, to the same weights and config."""
    torch.manual_seed(3)
    cfg = preset("tiny", vocab_size=100, hidden_dropout=0.0, attention_dropout=0.0, **variant)
    model = bertkit.checkpoint.build("pretraining", cfg).eval()
    save_model(model, tmp_path / "new")
    raw = json.loads((tmp_path / "new" / "config.json").read_text())
    batch = random_batch(vocab=100)
    if not variant:
        assert raw["model_type"] == "bert" and raw["architectures"] == ["BertForPreTraining"]
        assert "bertkit_only" not in raw
        hf = transformers.AutoModel.from_pretrained(tmp_path / "new").eval()
        with torch.no_grad():
            diff = (hf(**batch).last_hidden_state - model.bert(**batch)).abs()[batch["attention_mask"].bool()]
        assert diff.max() < 1e-5
    else:
        assert raw["model_type"] == "bertkit" and raw["architectures"] == ["BertkitForPreTraining"]
        assert "load it with bertkit" in raw["bertkit_only"], raw["bertkit_only"]
        for auto in (transformers.AutoConfig, transformers.AutoModel, transformers.AutoModelForMaskedLM):
            with pytest.raises(ValueError, match="model type `bertkit`"):
                auto.from_pretrained(tmp_path / "new")
    old = tmp_path / "old"                      # as bertkit wrote it before: 'bert' and BertForPreTraining
    old.mkdir()
    (old / "model.safetensors").write_bytes((tmp_path / "new" / "model.safetensors").read_bytes())
    (old / "config.json").write_text(json.dumps({**{k: v for k, v in raw.items() if k != "bertkit_only"},
                                                 "model_type": "bert", "architectures": ["BertForPreTraining"]}))
    for folder in (tmp_path / "new", old):
        again = load_model(folder)
        assert type(again) is type(model) and again.config.bertkit_only == cfg.bertkit_only
        assert {k: getattr(again.config, k) for k in vars(cfg) if k != "extra"} == \
            {k: getattr(cfg, k) for k in vars(cfg) if k != "extra"}
        assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))
        save_model(again, tmp_path / "resaved")             # saved again: the new spelling
        assert json.loads((tmp_path / "resaved" / "config.json").read_text())["model_type"] == raw["model_type"]


def test_minilm_round_trip_through_bertkit(tmp_path, minilm):
    model = load_model(minilm)
    save_model(model, tmp_path)
    hf, info = transformers.BertModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    ref = transformers.BertModel.from_pretrained(minilm)
    for (k, a), (_, b) in zip(sorted(hf.state_dict().items()), sorted(ref.state_dict().items())):
        assert torch.equal(a, b), k


def test_old_gamma_beta_names_and_pytorch_bin(tmp_path):
    torch.manual_seed(2)
    hf = transformers.BertForPreTraining(hf_tiny_config()).eval()
    sd = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
          for k, v in hf.state_dict().items()}
    torch.save(sd, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    ours = load_model(tmp_path).eval()
    batch = random_batch()
    with torch.no_grad():
        assert (ours(**batch)["nsp_logits"] - hf(**batch).seq_relationship_logits).abs().max() < 1e-5


@pytest.mark.parametrize("head", [None, "encoder", "masked_lm", "sequence_classification"])
def test_loaded_models_are_in_eval_mode_and_deterministic(tmp_path, head):
    """load_model is for inference: dropout off, so two calls give the same outputs (the README's
    API example once differed by up to 5.6 between calls); training sets train mode itself."""
    import bertkit

    hf = transformers.BertForPreTraining(hf_tiny_config(hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3))
    hf.save_pretrained(tmp_path)
    model = bertkit.load_model(tmp_path, head=head, new_head_ok=True)
    assert not model.training and not any(m.training for m in model.modules())
    ids = torch.randint(5, 1000, (2, 12))

    def outputs() -> list[torch.Tensor]:
        with torch.no_grad():
            out = model(ids)
        flat, todo = [], [out]
        while todo:
            x = todo.pop()
            if isinstance(x, torch.Tensor):
                flat.append(x)
            elif isinstance(x, (tuple, list)):
                todo += list(x)
            elif isinstance(x, dict):
                todo += [x[k] for k in sorted(x)]
        assert flat
        return flat

    assert all(torch.equal(x, y) for x, y in zip(outputs(), outputs()))
    model.train()                  # the check above can fail: in train mode dropout changes the outputs
    assert not all(torch.equal(x, y) for x, y in zip(outputs(), outputs()))


def test_pickled_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))
    torch.save({"x": Evil()}, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(hf_tiny_config().to_dict()))
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin: refused: .*could run code"):
        load_model(tmp_path)


def test_mismatches_are_one_clear_error(tmp_path):
    hf = transformers.BertModel(hf_tiny_config())
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    # wrong vocab size in config
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "vocab_size": 999}))
    with pytest.raises(CheckpointError, match="config.json says vocab_size 999 but embeddings.word_embeddings.weight has 1000 rows"):
        load_model(tmp_path)
    # wrong hidden size -> shapes listed by HF name
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 64}))
    with pytest.raises(CheckpointError, match=r"intermediate_size 64 but encoder.layer.0.intermediate.dense.weight has 100 rows"):
        load_model(tmp_path)
    # more layers than the checkpoint has -> missing names listed
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 4}))
    with pytest.raises(CheckpointError, match=r"num_hidden_layers is 4 but the weights hold 3 layers"):
        load_model(tmp_path)
    # asking for a head the checkpoint does not have
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="no weights for the masked_lm head"):
        load_model(tmp_path, head="masked_lm")
    assert load_model(tmp_path, head="sequence_classification", new_head_ok=True, num_labels=2).num_labels == 2
    # unknown tensors
    from safetensors.torch import load_file, save_file
    sd = load_file(str(tmp_path / "model.safetensors"))
    sd["encoder.extra.weight"] = torch.zeros(2)
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="unexpected weights.*encoder.extra.weight"):
        load_model(tmp_path)
    # not a checkpoint at all
    with pytest.raises(CheckpointError, match="no config.json"):
        load_model(tmp_path / "..")
    with pytest.raises(CheckpointError, match="no such directory"):
        load_model(tmp_path / "nope")


def test_positions_beyond_max_are_a_clear_error():
    model = BertModel(BertConfig(vocab_size=100, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                                 max_position_embeddings=8))
    with pytest.raises(ValueError, match="longer than max_position_embeddings"):
        model(torch.ones(1, 9, dtype=torch.long))


def test_causal_switch_contract():
    """Changing right-hand context changes a left token's state under bidirectional attention, not under causal."""
    for causal in (False, True):
        torch.manual_seed(0)
        cfg = preset("tiny", vocab_size=200, causal=causal, hidden_dropout=0.0, attention_dropout=0.0)
        model = init_weights(BertModel(cfg), cfg).eval()
        a = torch.tensor([[2, 10, 11, 12, 13, 3]])
        b = a.clone()
        b[0, 4] = 99                                       # change the right-hand context of token 1
        mask = torch.ones_like(a)
        with torch.no_grad():
            ha, hb = model(a, attention_mask=mask), model(b, attention_mask=mask)
            # the packed path obeys the same pattern
            flat, layout = pack(b, mask)
            hp = model(flat["input_ids"], flat["token_type_ids"], position_ids=flat["position_ids"], packed=layout)
        changed = (ha[0, 1] - hb[0, 1]).abs().max().item()
        assert (changed > 1e-4) if not causal else (changed < 1e-6), (causal, changed)
        assert (hp - hb[0]).abs().max() < 1e-5


def test_config_round_trip_and_errors():
    cfg = preset("mini", hidden_act="gelu_new")
    again = BertConfig.from_hf_dict(cfg.to_hf_dict())
    assert again == cfg
    with pytest.raises(ConfigError, match="divisible"):
        BertConfig(hidden_size=50, num_heads=3)
    with pytest.raises(ConfigError, match="did you mean 'num_layers'"):
        cfg.replace(num_layer=3)
    with pytest.raises(ConfigError, match="relative_key"):
        BertConfig.from_hf_dict({"position_embedding_type": "relative_key"})
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("huge")
    # classifier_pooling: written only when not BERT's [CLS] (ModernBERT's key), read back, checked
    assert "classifier_pooling" not in cfg.to_hf_dict()
    mean = cfg.replace(classifier_pooling="mean")
    assert mean.to_hf_dict()["classifier_pooling"] == "mean" and BertConfig.from_hf_dict(mean.to_hf_dict()) == mean
    with pytest.raises(ConfigError, match="classifier_pooling 'max'"):
        BertConfig.from_hf_dict({"classifier_pooling": "max"})


def test_mlm_loss_only_on_masked_positions():
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=300)
    model = init_weights(BertForPreTraining(cfg), cfg).eval()
    batch = random_batch(vocab=300)
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, 3], labels[2, 1] = 17, 42
    with torch.no_grad():
        out = model(**batch, mlm_labels=labels, nsp_labels=torch.tensor([0, 1, 0, 1]))
        full = model(**batch)["mlm_logits"]
    assert out["mlm_logits"].shape == (2, 300)
    assert torch.allclose(out["mlm_logits"], full[labels != -100], atol=1e-5)
    ref = torch.nn.functional.cross_entropy(full[labels != -100], labels[labels != -100])
    assert torch.allclose(out["mlm_loss"], ref, atol=1e-5)


def test_every_supported_activation_equals_transformers():
    from transformers.activations import get_activation

    from bertkit.config import ACTIVATIONS
    from bertkit.model import activation
    x = torch.linspace(-12, 12, 2001)
    for name in ACTIVATIONS:
        assert (activation(name)(x) - get_activation(name)(x)).abs().max() < 2e-6, name


def test_untied_mlm_decoder_round_trips(tmp_path):
    torch.manual_seed(4)
    hf = transformers.BertForMaskedLM(hf_tiny_config(tie_word_embeddings=False)).eval()
    with torch.no_grad():
        hf.cls.predictions.decoder.weight.normal_()
    hf.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf").eval()
    batch = random_batch()
    with torch.no_grad():
        assert (ours(**batch)["mlm_logits"] - hf(**batch).logits).abs().max() < 1e-5
    save_model(ours, tmp_path / "ours")
    again, info = transformers.BertForMaskedLM.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        assert (again.eval()(**batch).logits - hf(**batch).logits).abs().max() < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_dropout_drops_p_unbiased_and_seeded(dtype):
    """packing.dropout (the model's dropout on the CPU): drops a fraction p (rounded to 1/65,536) of
    the elements, scales the kept ones so the mean is kept, repeats under one seed, differs under
    another, and its gradient is the same mask and scale."""
    from bertkit.packing import Dropout, dropout

    x = torch.ones(1000, 1000, dtype=dtype, requires_grad=True)
    torch.manual_seed(0)
    y = dropout(x, 0.1)
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - 0.1) < 0.002           # 1e6 draws: sd 0.0003
    assert abs(y.float().mean().item() - 1) < 0.005
    torch.manual_seed(0)
    assert torch.equal(dropout(x, 0.1), y)
    assert not torch.equal(dropout(x, 0.1), y)
    y.sum().backward()
    assert torch.equal(x.grad, torch.where(kept, y.detach(), 0))         # d/dx: mask * 1 / (1 - p)
    r = torch.randn(300, 300).to(dtype)
    torch.manual_seed(2)
    got = dropout(r, 0.1)                     # the kept ones times the exact scale, rounded once (not a bf16 scale)
    assert torch.equal(got, torch.where(got != 0, r * (65536 / (65536 - round(0.1 * 65536))), 0))
    assert torch.equal(dropout(x, 0.1, training=False), x)
    assert torch.equal(dropout(x, 0.0), x)
    for p in (1e-6, 1 - 1e-6):                                          # finer than 1/65,536: F.dropout's own draw
        torch.manual_seed(1)
        want = torch.nn.functional.dropout(x, p)
        torch.manual_seed(1)
        assert torch.equal(dropout(x, p), want)
    m = Dropout(0.5).eval()
    assert torch.equal(m(x), x)
    rows = dropout(torch.ones(4, 65536), 0.5) == 0                       # no lane is biased: each of the four
    assert all(abs(rows[:, i::4].float().mean().item() - 0.5) < 0.01 for i in range(4))   # 16-bit lanes of a draw


def test_linears_is_one_gemm_under_cpu_autocast_and_each_layer_elsewhere():
    """packing.linears (the attention's Q, K, V): each layer's output; under CPU autocast from one GEMM
    on the layers' weights side by side, within bf16 rounding of the layers one by one, and every
    layer's weight and bias get their gradient; elsewhere exactly the layers' own calls."""
    from bertkit.packing import linears

    torch.manual_seed(0)
    layers = [torch.nn.Linear(32, n) for n in (32, 32, 16)]
    x = torch.randn(2, 5, 32, requires_grad=True)
    assert all(torch.equal(a, f(x)) for a, f in zip(linears(x, *layers), layers))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linears(x, *layers)
        alone = [f(x) for f in layers]
    assert [t.shape for t in fused] == [(2, 5, 32), (2, 5, 32), (2, 5, 16)] and fused[0].dtype == torch.bfloat16
    for a, b in zip(fused, alone):
        torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -7, atol=1e-2)
    sum(t.float().sum() for t in fused).backward()
    assert all(f.weight.grad is not None and f.bias.grad is not None for f in layers) and x.grad is not None


def test_cpu_dropout_under_torch_compile_is_one_graph():
    """Under torch.compile (train.compile) dropout is F.dropout, which the compiler draws itself: the
    NumPy draw of eager mode would break the graph at every dropout layer."""
    import torch._dynamo

    from bertkit.packing import Dropout

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), Dropout(0.1), torch.nn.Linear(16, 16))
    torch.compile(m, backend="eager")(torch.randn(4, 16)).sum().backward()
    assert not torch._dynamo.utils.counters["graph_break"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_cross_entropy_is_torch_s_a_few_rows_at_a_time(dtype):
    """packing.cross_entropy (the MLM loss): F.cross_entropy(logits.float(), targets)'s loss and gradient
    to fp32 rounding, for row counts around CE_ROWS, without touching the logits; the gradient written
    in the forward scaled by the loss's own (a halved loss: half the gradient), the same loss without
    autograd; targets with an ignore_index go to F.cross_entropy."""
    import torch.nn.functional as F

    from bertkit.packing import CE_ROWS, cross_entropy

    torch.manual_seed(0)
    for m in (1, CE_ROWS - 1, CE_ROWS, 3 * CE_ROWS + 5):
        x = (torch.randn(m, 700) * 4).to(dtype).requires_grad_()
        before = x.detach().clone()
        t = torch.randint(0, 700, (m,))
        ours = cross_entropy(x, t)
        ours.backward()
        got, x.grad = x.grad, None
        want = F.cross_entropy(x.float(), t)
        want.backward()
        assert torch.equal(x.detach(), before) and ours.dtype == torch.float32 and got.dtype == dtype
        assert abs(ours.item() - want.item()) < 1e-5
        tol = 2e-6 if dtype == torch.float32 else 2 ** -7           # fp32 rounding; one bf16 step (8 bits)
        torch.testing.assert_close(got.float(), x.grad.float(), rtol=tol, atol=1e-7)
        half = x.detach().clone().requires_grad_()         # a loss scaled as under gradient accumulation
        (cross_entropy(half, t) / 2).backward()
        torch.testing.assert_close(half.grad.float(), got.float() / 2, rtol=tol, atol=1e-7)
        with torch.no_grad():                               # no gradient written: the same loss
            assert torch.equal(cross_entropy(x, t), ours.detach())
    t[0] = -100
    assert torch.equal(cross_entropy(x, t), F.cross_entropy(x.float(), t))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_cross_entropy_ignores_padding_rows_and_survives_an_underflowing_target(dtype):
    """Logits with more rows than targets (the MLM head's GEMM padding, `on_gemm_rows(cut=False)`): the
    loss and gradient of the first M rows, a gradient of exactly 0 on the rest (also where the padding
    crosses a CE_ROWS step); a target whose softmax underflows fp32 (300 below the row's top) gets
    its true loss (~300), not inf, and a finite gradient."""
    import torch.nn.functional as F

    from bertkit.packing import CE_ROWS, cross_entropy

    torch.manual_seed(1)
    M, rows = CE_ROWS + 3, 2 * CE_ROWS + 1
    x = (torch.randn(rows, 500) * 3).to(dtype)
    t = torch.randint(0, 500, (M,))
    x[2, t[2]] = x[2].max() - 300                           # exp(-300) is 0 in fp32
    x = x.requires_grad_()
    ours = cross_entropy(x, t)
    ours.backward()
    ref = x.detach()[:M].clone().requires_grad_()
    want = F.cross_entropy(ref.float(), t)
    want.backward()
    assert want.item() > 300 / M and abs(ours.item() - want.item()) < 1e-4 * want.item()
    assert torch.isfinite(x.grad.float()).all() and not x.grad[M:].any()
    tol = 2e-6 if dtype == torch.float32 else 2 ** -7
    torch.testing.assert_close(x.grad[:M].float(), ref.grad.float(), rtol=tol, atol=1e-7)


@pytest.mark.parametrize("name,head,args", HEAD_CASES)
@pytest.mark.parametrize("variant", [{}, {"position_embedding_type": "alibi"}])
def test_loading_for_inference_skips_the_random_init_and_gives_the_same_model(tmp_path, name, head, args, variant):
    """load_model(random_init=False), as the Predictor loads: every weight equal to the default load's
    (tied MLM decoder still tied, ALiBi slopes real), and nothing drawn from torch's random generator."""
    cfg = BertConfig(vocab_size=1000, hidden_size=48, num_layers=3, num_heads=3, intermediate_size=100,
                     max_position_embeddings=64, **variant)
    save_model(bertkit.checkpoint.build(head, cfg, **args), tmp_path)
    ref = load_model(tmp_path)
    torch.manual_seed(1)
    model = load_model(tmp_path, random_init=False)
    drawn = torch.rand(3)
    torch.manual_seed(1)
    assert torch.equal(drawn, torch.rand(3))                          # the generator untouched
    assert type(model) is type(ref)
    got, want = model.state_dict(), ref.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    if hasattr(model, "mlm"):
        assert model.mlm.decoder.weight is model.bert.embeddings.word.weight
    for a, b in zip(model.modules(), ref.modules()):                  # the one tensor that is not a weight
        slopes = getattr(a, "slopes", None)
        assert (slopes is None) == (getattr(b, "slopes", None) is None)
        assert slopes is None or (not slopes.is_meta and torch.equal(slopes, b.slopes))
    with pytest.raises(CheckpointError, match="has no weights"):        # a missing head is still refused
        load_model(tmp_path, head="question_answering" if head != "question_answering" else "token_classification",
                   random_init=False)
