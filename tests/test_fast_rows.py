"""PrepackedLinear pads its rows to few GEMM sizes (bounded oneDNN kernel memory) and still
answers exactly what F.linear does for every row count."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertkit.infer.prepack import PrepackedLinear, can_prepack
from bertkit.packing import gemm_rows


def test_gemm_rows_few_sizes_little_padding():
    sizes = [gemm_rows(n) for n in range(1, 8193)]
    assert all(m >= n for n, m in zip(range(1, 8193), sizes))
    assert all(m <= n + n // 8 for n, m in zip(range(1, 8193), sizes))
    assert sizes == sorted(sizes)
    assert len(set(sizes)) <= 32 + 8 * 8            # 1..32 exact, then 8 per power of two
    assert [gemm_rows(n) for n in (1, 16, 32, 33, 35, 64, 65, 1000)] == [1, 16, 32, 36, 36, 64, 72, 1024]


def test_prepacked_rows_padded_equal_plain():
    lin = torch.nn.Linear(24, 40)
    if not can_prepack(lin):
        pytest.skip("no oneDNN prepacked Linear in this torch build")
    packed = PrepackedLinear(lin)
    with torch.no_grad():
        for n in (1, 7, 33, 45, 100, 257):
            x = torch.randn(n, 24)
            got = packed(x)
            assert got.shape == (n, 40) and got.is_contiguous()
            torch.testing.assert_close(got, F.linear(x, lin.weight, lin.bias), rtol=1e-4, atol=1e-5)


def test_mlm_head_runs_on_few_row_counts_and_answers_as_on_the_masked_rows():
    """The masked positions' count changes with every batch (every position, for a next-token run):
    the head's GEMMs get it rounded to `gemm_rows` on the CPU (oneDNN keeps a kernel per row count),
    and the logits, loss and gradients are those of the head on the masked rows alone."""
    from bertkit.config import BertConfig
    from bertkit.model import BertForPreTraining

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                     max_position_embeddings=64)
    model = BertForPreTraining(cfg, nsp=False).eval()        # no dropout: two passes agree
    ids = torch.randint(5, 50, (3, 40))
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]                        # 42 labelled positions
    seen = []
    hook = model.mlm.dense.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[0]))
    out32 = model(ids, mlm_labels=labels)              # fp32: MKL's GEMMs keep nothing per shape
    want32 = model.mlm(model.bert(ids).flatten(0, 1)[(labels != -100).flatten()])
    with torch.autocast("cpu", torch.bfloat16):
        out = model(ids, mlm_labels=labels)
        h = model.bert(ids)
        want = model.mlm(h.flatten(0, 1)[(labels != -100).flatten()])
    hook.remove()
    assert seen == [42, 42, gemm_rows(42), 42] and gemm_rows(42) != 42
    torch.testing.assert_close(out32["mlm_logits"], want32, rtol=1e-5, atol=1e-5)
    assert out["mlm_logits"].shape == (42, 50)
    # bf16 outputs: another row count may pick another oneDNN kernel on another CPU kind (one bf16 ulp)
    torch.testing.assert_close(out["mlm_logits"], want, rtol=1.6e-2, atol=1e-3)
    out["mlm_loss"].backward()
    grad = model.mlm.dense.weight.grad.clone()
    model.zero_grad()
    with torch.autocast("cpu", torch.bfloat16):
        loss = F.cross_entropy(model.mlm(model.bert(ids).flatten(0, 1)[(labels != -100).flatten()]).float(),
                               ids.flatten()[(labels != -100).flatten()])
    loss.backward()
    torch.testing.assert_close(grad, model.mlm.dense.weight.grad, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("causal", [False, True])
def test_rows_past_the_packed_tokens_change_nothing(causal):
    """Training pads a packed batch's N tokens to gemm_rows(N) rows that belong to no sequence
    (`pad_rows`): the real rows' states, the mean-pooled vectors, the loss and the gradients are those
    of the N tokens alone (ALiBi, bidirectional and causal)."""
    from bertkit.config import BertConfig
    from bertkit.model import BertForPreTraining, pool_tokens
    from bertkit.packing import pack, pad_rows

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=60, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                     max_position_embeddings=64, position_embedding_type="alibi", causal=causal,
                     hidden_dropout=0.0, attention_dropout=0.0)
    model = BertForPreTraining(cfg, nsp=False)
    lengths = [37, 12, 30, 5]
    mask = torch.zeros(4, 40, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    ids = torch.randint(5, 60, (4, 40))
    labels = torch.where(torch.rand(4, 40) < 0.3, ids, torch.full_like(ids, -100)) * mask + (mask - 1) * 100
    flat, layout = pack(ids, mask, torch.zeros_like(ids), labels)
    n = flat["input_ids"].shape[0]
    assert pad_rows(flat) is flat                       # fp32: nothing to bound
    with torch.autocast("cpu", torch.bfloat16):         # bf16 GEMMs: oneDNN keeps a kernel per row count
        padded = pad_rows(flat)
    assert n == 84 and padded["input_ids"].shape[0] == 88 and (padded["labels"][n:] == -100).all()
    runs = []
    for t in (flat, padded):
        model.zero_grad()
        h = model.bert(t["input_ids"], t["token_type_ids"], position_ids=t["position_ids"], packed=layout)
        out = model.outputs(h, layout, mlm_labels=t["labels"])
        loss = F.cross_entropy(out["mlm_logits"], out["mlm_targets"])
        loss.backward()
        runs.append((h[:n], pool_tokens(h, "mean", layout), loss, model.bert.blocks[0].attn.query.weight.grad.clone()))
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_warm_gemm_shapes_runs_each_distinct_layer_at_each_size():
    lin = torch.nn.Linear(8, 12)
    if not can_prepack(lin):
        pytest.skip("no oneDNN prepacked Linear in this torch build")
    from bertkit.infer.prepack import FUSED_GELU_ROWS, PrepackedFeedForward, warm_gemm_shapes

    ffn = PrepackedFeedForward(PrepackedLinear(lin), PrepackedLinear(torch.nn.Linear(12, 8)), None, "tanh")
    model = torch.nn.ModuleList([PrepackedLinear(lin), PrepackedLinear(torch.nn.Linear(8, 12)), ffn])
    sizes = {gemm_rows(n) for n in range(1, 41)}
    assert len(sizes) == 34 and FUSED_GELU_ROWS == 32   # 1..32, 36, 40
    assert warm_gemm_shapes(model, 40) == 2 * 34 + 32   # (8->12), (12->8); (8->12 + GELU) up to 32 rows


def test_varlen_direction_follows_the_installed_signature():
    """torch 2.10's varlen_attn takes is_causal, later ones window_size: the call is built from the
    signature, so a GPU with either torch gets the right attention direction."""
    from bertkit.packing import _varlen_direction_args

    def torch_2_10(q, k, v, cu_q, cu_k, max_q, max_k, *, is_causal=False, return_aux=None):
        pass

    def torch_2_11(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)):
        pass

    assert _varlen_direction_args(torch_2_10, True) == {"is_causal": True}
    assert _varlen_direction_args(torch_2_10, False) == {"is_causal": False}
    assert _varlen_direction_args(torch_2_11, True) == {"window_size": (-1, 0)}
    assert _varlen_direction_args(torch_2_11, False) == {"window_size": (-1, -1)}
