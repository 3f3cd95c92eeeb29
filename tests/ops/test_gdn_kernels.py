"""The Triton kernels around the Gated DeltaNet delta rule (ember.ops.triton.gdn) against their torch references:
the gates (ember.ops.activation.gdn_gating) and the gated output norm (ember.ops.norm.gated_rms_norm).

Without CUDA they run on CPU tensors in float32 under TRITON_INTERPRET=1; with CUDA compiled, in float32 and bf16.
exp and log are not torch's (numpy's in the interpreter, the approximate PTX ones compiled), so float32 results are
held to a few ulp per element; in bf16 nearly every element must round to the reference's bits."""
from __future__ import annotations

import pytest
import torch

from tests.ops.kernel_checks import DEVICE, DTYPES, TRITON_MIN_VERSION

pytest.importorskip("triton", minversion=TRITON_MIN_VERSION)

from ember.ops import activation as ref_act  # noqa: E402
from ember.ops import norm as ref_norm  # noqa: E402
from ember.ops import triton as tri  # noqa: E402


def assert_matches(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Per element: a few float32 ulp; in bf16, at most one bf16 ulp and bit-equal in all but a few elements (one
    rounding more or fewer than the reference's would put a sizeable share off by an ulp)."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=2e-6, atol=1e-7)
        return
    torch.testing.assert_close(out, ref, rtol=8e-3, atol=1e-5)
    if out.numel():
        assert (out == ref).float().mean().item() > 0.99


def rand(shape: tuple[int, ...], g: torch.Generator, dtype: torch.dtype, scale: float = 1.0,
         is_strided: bool = False) -> torch.Tensor:
    """Random values on DEVICE; is_strided: rows sit in wider rows (as the outputs of a fused projection's split)."""
    if not is_strided:
        return (torch.randn(shape, generator=g) * scale).to(DEVICE, dtype)
    wide = (torch.randn(*shape[:-1], shape[-1] + 7, generator=g) * scale).to(DEVICE, dtype)
    return wide[..., 3:3 + shape[-1]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens,num_heads", [(0, 4), (1, 4), (5, 32), (7, 48), (300, 6), (3, 1500)])
@pytest.mark.parametrize("is_strided", [False, True])
def test_gdn_gating_matches_reference(dtype, num_tokens, num_heads, is_strided):
    g = torch.Generator().manual_seed(num_tokens * 100 + num_heads)
    a = rand((num_tokens, num_heads), g, dtype, 6.0, is_strided)
    b = rand((num_tokens, num_heads), g, dtype, 4.0, is_strided)
    if num_tokens >= 2:  # softplus's branches: above the threshold of 20, at it, and where 1 + exp(x) rounds to 1
        a[0, :3] = torch.tensor([30.0, 20.0, -30.0])[:num_heads]
        a[1, :2] = torch.tensor([-100.0, 100.0])[:num_heads]
    assert num_tokens < 2 or a.is_contiguous() != is_strided
    a_log, dt_bias = rand((num_heads,), g, dtype), rand((num_heads,), g, dtype)
    out_g, out_beta = tri.gdn_gating(a, b, a_log, dt_bias)
    ref_g, ref_beta = ref_act.gdn_gating(a, b, a_log, dt_bias)
    assert out_g.dtype == torch.float32 and out_beta.dtype == dtype
    torch.testing.assert_close(out_g, ref_g, rtol=2e-6, atol=1e-30)  # atol: a subnormal exp(a) may flush to 0
    assert_matches(out_beta, ref_beta)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens,num_heads,head_dim", [
    (0, 4, 16),  # an empty step
    (1, 4, 16),  # the tiny parity model's shape, one decode token
    (6, 3, 20),  # a head dim that is not a power of two
    (5, 2, 100),
    (257, 5, 24),  # several rows a program, with a partly masked last program
])
def test_gated_rms_norm_matches_reference(dtype, num_tokens, num_heads, head_dim):
    """x [T, H, D] contiguous (the delta rule's output), the gate a [T, H, D] view of a wider projection output."""
    g = torch.Generator().manual_seed(num_tokens * 100 + head_dim)
    x = rand((num_tokens, num_heads, head_dim), g, dtype)
    fused = rand((num_tokens, 11 + num_heads * head_dim), g, dtype, 3.0)  # [T, qkv | z]
    gate = fused[:, 11:].unflatten(-1, (num_heads, head_dim))
    weight = 1 + 0.1 * rand((head_dim,), g, dtype)
    assert num_tokens < 2 or not gate.is_contiguous()
    out = tri.gated_rms_norm(x, gate, weight, 1e-6)
    assert_matches(out, ref_norm.gated_rms_norm(x, gate, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_rms_norm_on_strided_rows(dtype):
    """x and gate as [rows, D] with row strides wider than D, and x as a 1-row vector; the output is contiguous."""
    g = torch.Generator().manual_seed(3)
    x, gate = rand((40, 36), g, dtype, is_strided=True), rand((40, 36), g, dtype, 3.0, is_strided=True)
    weight = 1 + 0.1 * rand((36,), g, dtype)
    assert not x.is_contiguous() and not gate.is_contiguous()
    out = tri.gated_rms_norm(x, gate, weight, 1e-5)
    assert out.is_contiguous()
    assert_matches(out, ref_norm.gated_rms_norm(x, gate, weight, 1e-5))
    row = tri.gated_rms_norm(x[3], gate[3], weight, 1e-5)
    assert_matches(row, ref_norm.gated_rms_norm(x[3], gate[3], weight, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_rms_norm_with_a_float32_weight(dtype):
    """A weight wider than x: weight * normed is not rounded to x's dtype before the gate multiplies it."""
    g = torch.Generator().manual_seed(5)
    x, gate = rand((9, 4, 32), g, dtype), rand((9, 4, 32), g, dtype)
    weight = 1 + 0.1 * rand((32,), g, torch.float32)
    assert_matches(tri.gated_rms_norm(x, gate, weight, 1e-6), ref_norm.gated_rms_norm(x, gate, weight, 1e-6))
