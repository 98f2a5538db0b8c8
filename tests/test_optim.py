"""Optimisers against the update rules written out in numpy, and the pure learning-rate schedule."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from bertkit import preset
from bertkit.errors import BertkitError
from bertkit.model import BertForPreTraining
from bertkit.optim import build_optimizer, lr_at, param_groups


def _model():
    torch.manual_seed(0)
    return BertForPreTraining(preset("tiny", vocab_size=50, num_layers=1, hidden_size=16, num_heads=2,
                                     intermediate_size=32, max_position_embeddings=16))


def test_param_groups_exclude_bias_and_layernorm_and_count_tied_once():
    model = _model()
    names = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = param_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    d = {names[id(p)] for p in decay["params"]}
    nd = {names[id(p)] for p in no_decay["params"]}
    assert "bert.embeddings.word.weight" in d and "bert.blocks.0.attn.query.weight" in d and "nsp.weight" in d
    assert "bert.embeddings.norm.weight" in nd and "bert.blocks.0.norm1.weight" in nd and "mlm.norm.weight" in nd
    assert "mlm.bias" in nd and "bert.blocks.0.mlp.up.bias" in nd
    assert not any("norm" in n or n.endswith("bias") for n in d)
    unique = {id(p) for p in model.parameters()}
    assert len(decay["params"]) + len(no_decay["params"]) == len(unique)   # tied decoder counted once


def _run(opt_name, steps=3, **kw):
    """Apply `steps` updates with fixed fake gradients; return the parameters before, after and the grads."""
    model = _model()
    opt = build_optimizer(model, opt_name, lr=1e-2, weight_decay=0.1, **kw)
    before = {n: p.detach().clone().double().numpy() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    grads = []
    for _ in range(steps):
        g = {n: torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}
        for n, p in model.named_parameters():
            p.grad = g[n].clone()
        opt.step()
        grads.append({n: t.double().numpy() for n, t in g.items()})
    after = {n: p.detach().double().numpy() for n, p in model.named_parameters()}
    return model, before, grads, after


def _decayed(model):
    decay, _ = param_groups(model, 1.0)
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)] for p in decay["params"]}


def test_adamw_google_is_adam_without_bias_correction():
    model, before, grads, after = _run("adamw_google")
    decayed = _decayed(model)
    for name, p in before.items():
        m = v = 0.0
        for g in grads:
            g = g[name]
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            update = m / (np.sqrt(v) + 1e-6)                 # no bias correction, eps 1e-6
            if name in decayed:
                update = update + 0.1 * p
            p = p - 1e-2 * update
        np.testing.assert_allclose(after[name], p, rtol=1e-5, atol=1e-6, err_msg=name)


def test_adamw_is_torch_adamw_with_eps_1e8():
    model, before, grads, after = _run("adamw")
    decayed = _decayed(model)
    opt = build_optimizer(model, "adamw", lr=1e-3)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["eps"] == 1e-8
    for name, p in before.items():
        m = v = 0.0
        for t, g in enumerate(grads, 1):
            g = g[name]
            if name in decayed:
                p = p * (1 - 1e-2 * 0.1)
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            p = p - 1e-2 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
        np.testing.assert_allclose(after[name], p, rtol=1e-5, atol=1e-6, err_msg=name)


def test_lamb_scales_each_tensor_by_its_trust_ratio():
    model, before, grads, after = _run("lamb", steps=2)
    decayed = _decayed(model)
    for name, p in before.items():
        m = v = 0.0
        for t, g in enumerate(grads, 1):
            g = g[name]
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            update = (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-6)
            if name in decayed:
                update = update + 0.1 * p
            wn, un = np.linalg.norm(p), np.linalg.norm(update)
            trust = wn / un if wn > 0 and un > 0 else 1.0
            p = p - 1e-2 * trust * update
        np.testing.assert_allclose(after[name], p, rtol=1e-4, atol=1e-6, err_msg=name)


def test_unknown_optimizer_is_an_error():
    with pytest.raises(BertkitError, match="adamw_google"):
        build_optimizer(_model(), "adam")


def test_lr_schedules_are_pure_functions():
    # warm-up: peak * step / warmup from 0 (as HF get_linear_schedule_with_warmup)
    assert [lr_at(s, 100, 10, 1.0) for s in (0, 5, 10)] == [0.0, 0.5, 1.0]
    assert lr_at(55, 100, 10, 1.0) == pytest.approx(0.5)
    assert lr_at(100, 100, 10, 1.0) == 0.0 and lr_at(150, 100, 10, 1.0) == 0.0
    assert lr_at(55, 100, 10, 1.0, "cosine") == pytest.approx(0.5)
    assert lr_at(10, 100, 10, 1.0, "cosine") == pytest.approx(1.0)
    assert lr_at(32.5, 100, 10, 1.0, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_at(99, 100, 10, 2.0, "constant") == 2.0
    assert lr_at(100, 100, 0, 1.0, end_lr=0.1) == pytest.approx(0.1)
    assert lr_at(0, 100, 0, 1.0) == 1.0                          # no warm-up
    assert lr_at(90.0, 1800.0, 180.0, 1e-3) == pytest.approx(5e-4)  # seconds of a time budget
    # the same as transformers' scheduler, step by step
    transformers = pytest.importorskip("transformers")
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=3e-4)
    sched = transformers.get_linear_schedule_with_warmup(opt, 7, 50)
    for step in range(55):
        assert opt.param_groups[0]["lr"] == pytest.approx(lr_at(step, 50, 7, 3e-4), abs=1e-12)
        opt.step()
        sched.step()
    with pytest.raises(BertkitError, match="schedule"):
        lr_at(0, 10, 1, 1.0, "step")


def test_fused_adamw_is_the_same_update():
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    b = copy.deepcopy(a)
    opt_a, opt_b = build_optimizer(a, "adamw", lr=1e-2), build_optimizer(b, "adamw", lr=1e-2, fused=True)
    assert opt_b.param_groups[0]["fused"]
    for _ in range(3):
        x = torch.randn(4, 8)
        for m, o in ((a, opt_a), (b, opt_b)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


def test_layer_wise_lr_decay_scales_each_depth_and_covers_every_parameter_once():
    """layer_decay d: the head and pooler at the full rate, block l (1..L) at d^(L+1-l), the
    embeddings at d^(L+1); weight decay split as without it; d = 1 is the plain two groups."""
    from bertkit.checkpoint import build

    cfg = preset("tiny", vocab_size=50, num_layers=3)
    model = build("sequence_classification", cfg, num_labels=2)
    d = 0.5
    groups = param_groups(model, 0.01, layer_decay=d)
    scale = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    wd = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert len(scale) == sum(len(g["params"]) for g in groups) == len(named)      # each once
    for name, p in named.items():
        want = (d ** 4 if name.startswith("bert.embeddings.") else
                d ** (3 - int(name.split(".")[2])) if name.startswith("bert.blocks.") else 1.0)
        assert scale[id(p)] == pytest.approx(want), name
    plain = param_groups(model, 0.01)
    assert len(plain) == 2 and all("lr_scale" not in g for g in plain)
    assert wd == {id(p): g["weight_decay"] for g in plain for p in g["params"]}
