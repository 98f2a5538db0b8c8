"""PrepackedLinear pads its rows to few GEMM sizes (bounded oneDNN kernel memory) and still
answers exactly what F.linear does for every row count."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertkit.infer.prepack import PrepackedLinear, can_prepack, gemm_rows


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


def test_warm_gemm_shapes_runs_each_distinct_layer_at_each_size():
    lin = torch.nn.Linear(8, 12)
    if not can_prepack(lin):
        pytest.skip("no oneDNN prepacked Linear in this torch build")
    from bertkit.infer.prepack import warm_gemm_shapes

    model = torch.nn.ModuleList([PrepackedLinear(lin), PrepackedLinear(torch.nn.Linear(8, 12)),
                                 PrepackedLinear(torch.nn.Linear(12, 8)), PrepackedLinear(lin, "gelu", "tanh")])
    sizes = {gemm_rows(n) for n in range(1, 41)}
    assert len(sizes) == 34                             # 1..32, 36, 40
    assert warm_gemm_shapes(model, 40) == 3 * 34       # (8->12), (12->8), (8->12 + GELU)


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
