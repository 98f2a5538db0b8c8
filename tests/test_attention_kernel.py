"""The training attention kernels (`packing.attention`): the written-out formula ('math') computes
what SDPA computes, forward and backward, in every mask form the model passes; it runs only while
autograd records; the measured choice reaches the layers of a training run and its run card."""
import json

import pytest
import torch
import torch.nn.functional as F

from bertkit import hardware
from bertkit.checkpoint import build
from bertkit.config import preset
from bertkit.model import set_attention_kernel
from bertkit.packing import alibi_bias, attention, pack

B, H, T, D = 3, 2, 10, 8


def _qkv(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g).to(dtype).requires_grad_() for _ in range(3)]


def _masks():
    keys = torch.ones(B, T, dtype=torch.bool)
    keys[1, 7:] = False
    keys[2, 4:] = False
    allowed = keys[:, None, None, :]                                        # (B, 1, 1, T)
    alibi = alibi_bias(torch.tensor([1.0, 0.5]), T, torch.zeros(1))[None]   # (1, H, T, T)
    return {"none": (None, False), "keys": (allowed, False), "causal": (None, True),
            "alibi": (alibi, False), "alibi+keys": (alibi.masked_fill(~allowed, float("-inf")), False)}


@pytest.mark.parametrize("form", list(_masks()))
def test_math_kernel_equals_sdpa_forward_and_backward(form):
    mask, causal = _masks()[form]
    grads = {}
    for kernel in ("sdpa", "math"):
        q, k, v = _qkv()
        y = attention(q, k, v, mask, is_causal=causal, kernel=kernel)
        y.backward(torch.linspace(-1, 1, y.numel()).view_as(y))
        grads[kernel] = (y.detach(), q.grad, k.grad, v.grad)
    for a, b in zip(grads["sdpa"], grads["math"]):      # fp32: only the order of the sums differs
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_math_kernel_in_bf16_keeps_fp32_softmax_accuracy():
    """bf16 inputs: Q K^T and P V are bf16 GEMMs, the scores, ALiBi bias and softmax fp32; the
    result is as close to the fp32 reference as SDPA's own bf16 result is."""
    mask = _masks()["alibi+keys"][0]
    q32, k32, v32 = _qkv()
    ref = F.scaled_dot_product_attention(q32, k32, v32, attn_mask=mask)
    q, k, v = _qkv(torch.bfloat16)
    err = {kernel: (attention(q, k, v, mask.bfloat16(), kernel=kernel).float() - ref).abs().max().item()
           for kernel in ("sdpa", "math")}
    assert attention(q, k, v, mask.bfloat16(), kernel="math").dtype == torch.bfloat16
    assert err["math"] <= 2 * err["sdpa"] + 1e-3, err


def test_math_kernel_runs_only_while_autograd_records(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    q, k, v = _qkv()
    attention(q, k, v, kernel="math")
    assert calls == []                                   # training: the formula
    with torch.no_grad():
        attention(q, k, v, kernel="math")
    assert calls == [1]                                  # evaluation, inference: SDPA's forward
    attention(*(t.detach() for t in (q, k, v)), kernel="math")
    assert calls == [1, 1]                               # nothing to differentiate: SDPA too


def test_math_kernel_dropout_drops_and_scales():
    q, k, v = (torch.ones(1, 1, 64, 4, requires_grad=True) for _ in range(3))
    torch.manual_seed(0)
    y = attention(q, k, v, dropout_p=0.5, kernel="math")
    # every key has the same value 1: a row's output is the kept share of probability, rescaled
    assert not torch.allclose(y, torch.ones_like(y))
    assert abs(y.mean().item() - 1.0) < 0.1


@pytest.mark.parametrize("form", list(_masks()))
def test_chunked_kernel_on_a_padded_batch_is_sdpa_then_math_under_autograd(form, monkeypatch):
    mask, causal = _masks()[form]
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    q, k, v = (t.detach() for t in _qkv())
    with torch.inference_mode():
        got = attention(q, k, v, mask, is_causal=causal, kernel="chunked")
    assert calls == [1]
    qg, kg, vg = _qkv()                                  # while autograd records: the 'math' formula, differentiable
    y = attention(qg, kg, vg, mask, is_causal=causal, kernel="chunked")
    y.sum().backward()
    assert qg.grad is not None and calls == [1]
    torch.testing.assert_close(y.detach(), got, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_kernel_on_packed_tokens_runs_each_sequence_on_views(dtype, monkeypatch):
    """On packed tokens without autograd the 'chunked' kernel computes each sequence's attention
    on views of Q, K and V (no SDPA call, no padded buffer): SDPA's result on the padded batch, in
    fp32 to reordering and in bf16 within SDPA's own bf16 error; rows past the layout stay 0; with
    ALiBi and causal masks too."""
    from bertkit import packing

    keys = torch.arange(13)[None, :] < torch.tensor([13, 1, 6, 9])[:, None]
    lay = packing.packing(keys)
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(int(keys.sum()) + 2, 3, H, D, generator=g).unbind(1)    # 2 rows past the layout
    with torch.inference_mode():
        exact = packing.packed_attention(q, k, v, lay)                             # fp32 SDPA, padded
        calls = []
        real = F.scaled_dot_product_attention
        monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
        lowp = [t.to(dtype) for t in (q, k, v)]
        fresh = packing.packing(keys)
        got = packing.packed_attention(*lowp, fresh, kernel="chunked")
        assert calls == [] and list(fresh.scratch) == ["cu"]                      # no padded buffers made
        assert got.dtype == dtype and not got[-2:].any()
        if dtype == torch.float32:
            torch.testing.assert_close(got, exact, atol=1e-5, rtol=1e-4)
        else:
            sdpa = packing.packed_attention(*lowp, lay, kernel="sdpa")
            err = lambda y: float((y.float() - exact).abs().max())
            assert err(got) <= 2 * err(sdpa) + 1e-3, (err(got), err(sdpa))
        for kw in ({"causal": True}, {"slopes": torch.tensor([1.0, 0.5])}, {"causal": True, "slopes": torch.tensor([1.0, 0.5])}):
            fresh = packing.packing(keys)
            y = packing.packed_attention(q, k, v, fresh, kernel="chunked", **kw)        # a bias, still no buffers
            assert "q" not in fresh.scratch and any(key[0] == "bias" for key in fresh.scratch)
            torch.testing.assert_close(y, packing.packed_attention(q, k, v, packing.packing(keys), **kw),
                                       atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_a_model_trains_the_same_through_either_kernel(layout):
    """The encoder's loss and gradients with every layer on 'math' equal SDPA's (fp32), in the
    padded and the padding-free layout, with ALiBi and a key mask."""
    cfg = preset("tiny", vocab_size=100, position_embedding_type="alibi", hidden_dropout=0.0,
                 attention_dropout=0.0)
    torch.manual_seed(0)
    model = build("pretraining", cfg, nsp=False)
    ids = torch.randint(5, 100, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 8:] = 0
    labels = torch.full((3, 12), -100)
    labels[:, 2] = ids[:, 2]
    labels[0, 9] = ids[0, 9]
    results = {}
    for kernel in ("sdpa", "math"):
        set_attention_kernel(model, kernel)
        model.zero_grad()
        if layout == "packed":
            flat, lay = pack(ids, mask, torch.zeros_like(ids), labels=labels)
            out = model(flat["input_ids"], flat["token_type_ids"], None, mlm_labels=flat["labels"], packed=lay,
                        position_ids=flat["position_ids"])
        else:
            out = model(ids, torch.zeros_like(ids), mask, mlm_labels=labels)
        out["loss"].backward()
        results[kernel] = (out["loss"].detach(), model.bert.blocks[0].attn.query.weight.grad.clone())
    assert all(m.kernel == "math" for m in model.modules() if hasattr(m, "kernel"))
    with pytest.raises(ValueError, match="attention kernel"):
        set_attention_kernel(model, "flash")
    for a, b in zip(results["sdpa"], results["math"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_attention_kernel_is_measured_or_forced(monkeypatch):
    cpu, small = torch.device("cpu"), preset("tiny", vocab_size=100, num_heads=2, hidden_size=32)
    monkeypatch.setenv(hardware.ATTENTION_ENV, "math")
    assert hardware.attention_kernel(cpu, torch.bfloat16, small) == ("math", "BERTKIT_ATTENTION=math")
    monkeypatch.setenv(hardware.ATTENTION_ENV, "fast")
    with pytest.raises(hardware.BertkitError, match="BERTKIT_ATTENTION"):
        hardware.attention_kernel(cpu, torch.bfloat16, small)
    monkeypatch.setenv(hardware.ATTENTION_ENV, "auto")
    kernel, why = hardware.attention_kernel(cpu, torch.float32, small, 16)
    assert kernel in ("sdpa", "math") and "(measured once on this machine)" in why
    speedup = float(why.split("the math kernel ")[1].split("x")[0])
    assert (kernel == "math") == (speedup >= hardware.MIN_ATTENTION_SPEEDUP)
    # a GPU keeps SDPA (flash / memory-efficient kernels), nothing measured
    assert hardware.attention_kernel(torch.device("cuda"), torch.bfloat16, small) == ("sdpa", "SDPA on cuda")


def test_the_run_card_says_which_kernel_trained(tmp_path, monkeypatch):
    from test_pretrain import make_data, tiny_config
    from bertkit.train import pretrain
    import bertkit.packing as packing

    data = make_data(tmp_path / "data", (64,))[64]
    seen = []
    real = packing.F.scaled_dot_product_attention
    monkeypatch.setattr(packing.F, "scaled_dot_product_attention",
                        lambda *a, **k: seen.append(torch.is_grad_enabled()) or real(*a, **k))
    for kernel in ("math", "sdpa"):
        monkeypatch.setenv(hardware.ATTENTION_ENV, kernel)
        seen.clear()
        card = pretrain(tiny_config(data, tmp_path / kernel, **{"train.max_steps": 2, "train.eval_every": 0,
                                                                "train.precision": "fp32", "train.packed": "false"}))
        assert card["attention_kernel"] == kernel and card["attention_kernel_reason"] == f"BERTKIT_ATTENTION={kernel}"
        saved = json.loads((tmp_path / kernel / "run_card.json").read_text())
        assert saved["attention_kernel"] == kernel
        assert "| attention_kernel | " + kernel in (tmp_path / kernel / "run_card.md").read_text()
        # training steps go through SDPA only when it is the kernel; the held-out evaluations (no
        # autograd) run SDPA's forward either way
        assert any(not g for g in seen)
        assert any(seen) == (kernel == "sdpa"), seen


def test_gpu_training_with_a_mask_leaves_out_cudnn_attention():
    """cuDNN attention's backward returns NaN in dQ at lengths 64 mod 128 with a mask (torch >= 2.11 on
    H100/H200, pytorch/pytorch#196678): the GPU grid's fine-tuning went NaN the update after every
    batch padded to 64. Training on a GPU with a mask runs without it; everything else is torch's choice."""
    from torch.nn.attention import SDPBackend
    from bertkit.packing import sdpa_backends
    chosen = sdpa_backends("cuda", masked=True, grad=True)
    assert SDPBackend.CUDNN_ATTENTION not in chosen and SDPBackend.EFFICIENT_ATTENTION in chosen
    assert sdpa_backends("cuda", masked=False, grad=True) is None      # flash takes no mask anyway
    assert sdpa_backends("cuda", masked=True, grad=False) is None      # forward only: cuDNN is right
    assert sdpa_backends("cpu", masked=True, grad=True) is None


@pytest.mark.parametrize("form", ["keys", "alibi"])
def test_the_kernels_left_after_cudnn_compute_sdpa(form):
    """The restricted kernel list runs (on this machine's device) and computes what torch's own choice does."""
    from torch.nn.attention import sdpa_kernel
    from bertkit.packing import _NOT_CUDNN
    mask, _ = _masks()[form]
    q, k, v = _qkv()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with sdpa_kernel(list(_NOT_CUDNN)):
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_masked_attention_backward_at_length_64_is_finite_on_a_gpu():
    """The upstream report's inputs (every score ~ -120, so each row's log-sum-exp is below ln(FLT_MAX))
    at length 64 with an all-True mask: through `attention` every gradient is finite."""
    import math
    g = torch.Generator(device="cuda").manual_seed(0)
    L, Dh = 64, 32
    q, k, v = (torch.randn(2, 2, L, Dh, device="cuda", generator=g, dtype=torch.bfloat16) * 0.1 for _ in range(3))
    q[..., 0], k[..., 0] = 1.0, -120 * math.sqrt(Dh)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    mask = torch.ones(L, L, dtype=torch.bool, device="cuda")[None, None]
    attention(q, k, v, mask).float().backward(torch.randn(2, 2, L, Dh, device="cuda"))
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_the_kernel_is_timed_with_the_model_s_dropout_on_a_fork_of_torch_s_generator(monkeypatch, tmp_path):
    """The choice times a training step as it runs, attention dropout included (SDPA draws it from
    torch's scalar Bernoulli), and its draws leave torch's generator where it was: a run that measures
    and a run that reads the measurement go on with the same random numbers."""
    import dataclasses

    monkeypatch.setenv(hardware.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(hardware.ATTENTION_ENV, "auto")
    monkeypatch.setattr(hardware, "_session", {})
    cpu, small = torch.device("cpu"), preset("tiny", vocab_size=100, num_heads=2, hidden_size=32)
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    kernel, why = hardware.attention_kernel(cpu, torch.float32, small, 16)            # measured now
    assert torch.equal(torch.rand(3), want)
    assert f"with dropout {small.attention_dropout:g}, padding mask:" in why and "measured" in (tmp_path / "measurements.json").read_text()
    none = dataclasses.replace(small, attention_dropout=0.0)
    assert "with dropout" not in hardware.attention_kernel(cpu, torch.float32, none, 16)[1]


def test_the_kernel_is_timed_with_the_model_s_mask(monkeypatch, tmp_path):
    """A plain BERT trains with a boolean padding mask, an ALiBi one with an additive bias of its own
    slopes: timing both on a slope-1 ALiBi bias (fp32 denormals, slow for both kernels) picked SDPA for
    fp32 BERT where the written-out kernel trains it 1.4x faster."""
    import dataclasses

    from bertkit.model import alibi_slopes

    monkeypatch.setenv(hardware.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(hardware.ATTENTION_ENV, "auto")
    monkeypatch.setattr(hardware, "_session", {})
    seen, measure = [], hardware.measure_attention_speedup
    monkeypatch.setattr(hardware, "measure_attention_speedup",
                        lambda *a, slopes=None, **k: seen.append(slopes) or 1.5)
    cpu, plain = torch.device("cpu"), preset("tiny", vocab_size=100, num_heads=2, hidden_size=32)
    alibi = dataclasses.replace(plain, position_embedding_type="alibi")
    assert "padding mask: the math kernel 1.5x" in hardware.attention_kernel(cpu, torch.float32, plain, 16)[1]
    assert "ALiBi bias: the math kernel 1.5x" in hardware.attention_kernel(cpu, torch.float32, alibi, 16)[1]
    assert seen[0] is None and torch.equal(seen[1], alibi_slopes(alibi))         # two keys, two measurements
    # the measurement itself: a padded batch's boolean mask, or the bias of the slopes with -inf on the padding
    masks = []
    monkeypatch.setattr(hardware, "attention", lambda q, k, v, mask, p, kernel: masks.append(mask) or q.clone())
    measure(2, 16, 8, torch.float32, batch=4, rounds=1)
    measure(2, 16, 8, torch.float32, batch=4, rounds=1, slopes=alibi_slopes(alibi))
    padding, bias = masks[0], masks[-1]
    assert padding.dtype == torch.bool and padding.shape == (4, 1, 1, 8)
    assert padding[0].all() and padding[-1, 0, 0].tolist() == [True] * 4 + [False] * 4
    assert bias.shape == (4, 2, 8, 8) and torch.isinf(bias[-1, :, :, 4:]).all() and torch.isfinite(bias[0]).all()
    assert bias[0, 1, 0, 2] == -0.5 * 2                                     # slope 1/2 x distance 2
    measure(2, 16, 8, torch.float32, batch=4, rounds=1, causal=True)         # a next-token model's: causal too
    causal = masks[-1]
    assert causal.dtype == torch.bool and causal.shape == (4, 1, 8, 8)
    assert torch.equal(causal[0, 0], torch.ones(8, 8, dtype=torch.bool).tril()) and not causal[-1, 0, 7, 4:].any()
    clm = dataclasses.replace(plain, causal=True)
    assert "causal padding mask: the math kernel 1.5x" in hardware.attention_kernel(cpu, torch.float32, clm, 16)[1]
