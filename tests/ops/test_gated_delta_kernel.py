"""The Triton Gated DeltaNet decode step (ember.ops.triton.gated_delta) against the torch reference
(ember.ops.gated_delta.gated_delta_decode): outputs and the conv/ssm state written into the slots.

Without CUDA it runs on CPU tensors in float32 under TRITON_INTERPRET=1; with CUDA compiled, in float32 and bf16."""
from __future__ import annotations

import pytest
import torch

from tests.ops.kernel_checks import DEVICE, DTYPES, TRITON_MIN_VERSION, assert_close

pytest.importorskip("triton", minversion=TRITON_MIN_VERSION)

from ember.ops import gated_delta as ref  # noqa: E402
from ember.ops import triton as tri  # noqa: E402

NUM_SLOTS = 9


def make_inputs(num_seqs: int, hk: int, hv: int, dk: int, dv: int, kernel: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    conv_dim = 2 * hk * dk + hv * dv
    mixed = torch.randn(num_seqs, conv_dim + 5, generator=g)[:, :conv_dim]  # strided rows, as after the split
    weight = 0.5 * torch.randn(conv_dim, 1, kernel, generator=g)
    log_decay = -torch.rand(num_seqs, hv, generator=g) * 2
    beta = torch.rand(num_seqs, hv, generator=g)
    conv_state = torch.randn(NUM_SLOTS, conv_dim, kernel - 1, generator=g)
    ssm_state = 0.3 * torch.randn(NUM_SLOTS, hv, dk, dv, generator=g)
    # distinct write slots; some sequences read their own slot, some a slot nobody writes (a snapshot), some
    # zeros (-1), as the scheduler plans them
    slots = torch.randperm(NUM_SLOTS, generator=g)
    writes, others = slots[:num_seqs], slots[num_seqs:]
    reads = torch.where(torch.arange(num_seqs) % 2 == 0, writes, others[torch.arange(num_seqs) % len(others)])
    reads[1::4] = -1
    return (mixed.to(DEVICE, dtype), weight.to(DEVICE, dtype)[:, 0], log_decay.to(DEVICE), beta.to(DEVICE, dtype),
            conv_state.to(DEVICE, dtype), ssm_state.to(DEVICE), reads.to(DEVICE), writes.to(DEVICE))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_seqs,hk,hv,dk,dv,kernel", [
    (5, 2, 4, 8, 16, 4),  # the tiny parity model's shape
    (6, 1, 3, 12, 20, 4),  # head dims that are not powers of two, Hv/Hk = 3
    (3, 2, 2, 16, 24, 3),  # Hv = Hk, a shorter conv
    (2, 2, 8, 32, 48, 4),  # Dv split over several program blocks on CUDA
])
def test_gated_delta_decode_matches_reference(dtype, num_seqs, hk, hv, dk, dv, kernel):
    args = make_inputs(num_seqs, hk, hv, dk, dv, kernel, dtype, seed=num_seqs * 10 + dk)
    ref_args = [a.clone() for a in args]
    out = tri.gated_delta_decode(*args)
    ref_out = ref.gated_delta_decode(*ref_args)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert out.shape == ref_out.shape == (num_seqs, hv, dv) and out.dtype == dtype
    assert_close(out, ref_out, tol)
    conv, ssm, writes = args[4], args[5], args[7]
    assert_close(conv[writes], ref_args[4][writes], tol)
    assert_close(ssm[writes], ref_args[5][writes], tol)
    untouched = torch.ones(NUM_SLOTS, dtype=torch.bool, device=DEVICE)
    untouched[writes] = False
    assert torch.equal(conv[untouched], ref_args[4][untouched]) and torch.equal(ssm[untouched], ref_args[5][untouched])


def test_gated_delta_decode_steps_compose():
    """Two steps on the same slots equal two reference steps (the state written is the state read next)."""
    args = make_inputs(4, 2, 4, 8, 16, 4, torch.float32, seed=7)
    mixed, weight, log_decay, beta, conv, ssm, reads, writes = args
    ref_conv, ref_ssm = conv.clone(), ssm.clone()
    for step in range(2):
        read = reads if step == 0 else writes
        x = mixed.roll(step, 0)
        out = tri.gated_delta_decode(x, weight, log_decay, beta, conv, ssm, read, writes)
        ref_out = ref.gated_delta_decode(x, weight, log_decay, beta, ref_conv, ref_ssm, read, writes)
        assert_close(out, ref_out, 1e-5)
    assert_close(ssm[writes], ref_ssm[writes], 1e-5)
