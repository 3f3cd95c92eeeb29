"""The batched (varlen) chunked Gated DeltaNet prefill (ember.ops.gated_delta.gated_delta_prefill) against the
recurrent form run token by token (conv step + delta rule step per token, the decode path's reference ops):
outputs, the states written into working and snapshot slots, and the Triton chunk scan against the torch one.

The Triton scan runs on CPU tensors under TRITON_INTERPRET=1 here and compiled on CUDA."""
from __future__ import annotations

import functools

import pytest
import torch

from ember.ops import gated_delta as gd
from tests.ops.kernel_checks import DEVICE, DTYPES, TRITON_MIN_VERSION, assert_close

NUM_SLOTS = 12


def make_layer(hk: int, hv: int, dk: int, dv: int, kernel: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    conv_dim = 2 * hk * dk + hv * dv
    weight = 0.5 * torch.randn(conv_dim, kernel, generator=g)
    conv_state = torch.randn(NUM_SLOTS, conv_dim, kernel - 1, generator=g)
    ssm_state = 0.3 * torch.randn(NUM_SLOTS, hv, dk, dv, generator=g)
    return weight, conv_state, ssm_state


def make_tokens(num_tokens: int, conv_dim: int, hv: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    mixed = torch.randn(num_tokens, conv_dim, generator=g)
    log_decay = -torch.rand(num_tokens, hv, generator=g)
    beta = torch.rand(num_tokens, hv, generator=g)
    return mixed, log_decay, beta


def token_by_token(mixed, weight, g, beta, conv_state, ssm_state, starts, reads, writes, snapshots, hk):
    """The oracle: every sequence one token at a time through the decode step, copying the slots due."""
    conv_state, ssm_state = conv_state.clone(), ssm_state.clone()
    conv_before, ssm_before = conv_state.clone(), ssm_state.clone()  # reads see the states before the step
    outs = []
    for i, (s, e) in enumerate(zip(starts[:-1], starts[1:])):
        if e == s:
            continue
        due = {n: [slot] for n, slot in snapshots[i]}
        due.setdefault(e - s, []).append(writes[i])
        conv = conv_before[reads[i]][None] if reads[i] >= 0 else torch.zeros_like(conv_before[:1])
        ssm = ssm_before[reads[i]][None] if reads[i] >= 0 else torch.zeros_like(ssm_before[:1])
        for slot in due.get(0, []):
            conv_state[slot], ssm_state[slot] = conv[0], ssm[0]
        for t in range(s, e):
            out, conv = gd.causal_conv1d_step(mixed[t:t + 1], weight, conv)
            q, kk, v = gd.split_heads(out, hk, ssm.shape[2], ssm.shape[1], ssm.shape[3])
            o, ssm = gd.recurrent_gated_delta_step(q, kk, v, g[t:t + 1], beta[t:t + 1], ssm)
            outs.append(o[0])
            for slot in due.get(t + 1 - s, []):
                conv_state[slot], ssm_state[slot] = conv[0], ssm[0]
    return torch.stack(outs), conv_state, ssm_state


CASES = [
    # lengths, reads, writes, snapshots ((offset, slot), ...) per sequence
    ([5], [-1], [0], [()]),
    ([64, 65, 1], [-1, 3, 4], [2, 3, 5], [(), ((64, 7),), ()]),  # a chunk boundary, read == write
    ([130, 7, 0, 40], [1, -1, 9, 6], [0, 2, 9, 4], [((100, 8),), ((7, 10),), (), ((0, 11),)]),  # end, start, none
    ([200], [2], [1], [((64, 5),)]),
    # a mixed step: decode rows (one token, read == write, a snapshot after it, fresh) through the recurrent step,
    # beside a prompt and a one-token sequence whose state is due before its token (a chunk takes that one)
    ([1, 70, 1, 1, 1], [3, -1, -1, 6, 9], [3, 0, 1, 2, 9], [((1, 7),), (), (), ((0, 8),), ()]),
    ([1, 1], [2, -1], [2, 4], [(), ((1, 5),)]),  # every sequence one token: no chunk at all
]


@pytest.mark.parametrize("lengths,reads,writes,snapshots", CASES)
@pytest.mark.parametrize("shape", [(2, 4, 8, 16, 4), (1, 3, 12, 20, 3)])
def test_chunked_prefill_matches_token_by_token(lengths, reads, writes, snapshots, shape):
    hk, hv, dk, dv, kernel = shape
    weight, conv_state, ssm_state = make_layer(hk, hv, dk, dv, kernel, seed=sum(lengths))
    mixed, g, beta = make_tokens(sum(lengths), weight.shape[0], hv, seed=len(lengths))
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    want_out, want_conv, want_ssm = token_by_token(mixed, weight, g, beta, conv_state, ssm_state, starts, reads,
                                                   writes, snapshots, hk)
    plan = gd.ChunkPlan.build(starts, reads, writes, snapshots, kernel - 1, torch.device("cpu"))
    out = gd.gated_delta_prefill(mixed, weight, g, beta, conv_state, ssm_state, plan, hk)
    assert out.shape == (sum(lengths), hv, dv)
    assert_close(out, want_out, 1e-4)
    assert_close(ssm_state, want_ssm, 1e-4)  # the slots due changed, every other slot is untouched
    assert torch.equal(conv_state, want_conv)


def test_varlen_conv_one_buffer_equals_per_sequence():
    """The GPU's single conv over the whole buffer and the CPU's conv per sequence give the same outputs."""
    weight, conv_state, _ = make_layer(2, 4, 8, 16, 4, seed=1)
    mixed, _, _ = make_tokens(107, weight.shape[0], 4, seed=2)
    plan = gd.ChunkPlan.build([0, 40, 40, 101, 107], [3, -1, 5, -1], [0, 1, 2, 4], [(), (), ((30, 6),), ()], 3,
                              torch.device("cpu"))
    states = conv_state.clone(), conv_state.clone()
    whole, buf = gd.varlen_causal_conv1d(mixed, weight, states[0], plan,
                                         windows=functools.partial(gd.conv_windows, per_sequence=False))
    each, buf2 = gd.varlen_causal_conv1d(mixed, weight, states[1], plan,
                                         windows=functools.partial(gd.conv_windows, per_sequence=True))
    assert whole.shape == mixed.shape and torch.equal(buf, buf2) and torch.equal(*states)
    torch.testing.assert_close(whole, each, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32])
def test_triton_conv_windows_match_reference(dtype):
    """The conv-window kernels against the torch conv over the same buffer: sequences shorter than the window,
    fresh and carried states, channels over more than one program block (300 > 256); the windows due written into
    their slots (a slot one sequence reads and another writes read first), spare entries (-1) skipped."""
    pytest.importorskip("triton", minversion=TRITON_MIN_VERSION)
    from ember.ops import triton as tri
    weight, conv_state, _ = make_layer(2, 5, 12, 36, 4, seed=6)  # conv_dim 228
    weight = torch.cat([weight, weight[:72]]).to(DEVICE, dtype)  # 300 channels
    conv_state = torch.cat([conv_state, conv_state[:, :72]], dim=1).to(DEVICE, dtype)
    mixed = make_tokens(70, 300, 1, seed=7)[0].to(DEVICE, dtype)
    plan = gd.ChunkPlan.build([0, 2, 3, 50, 70], [4, -1, 1, -1], [0, 1, 2, 3], [(), (), ((20, 6),), ()], 3,
                              torch.device(DEVICE))
    plan.save_slots = torch.cat([plan.save_slots, plan.save_slots.new_full((2,), -1)])  # as a captured plan's
    plan.save_cols = torch.cat([plan.save_cols, plan.save_cols[:2]])
    states = conv_state.clone(), conv_state.clone()
    want, buf = gd.varlen_causal_conv1d(mixed, weight, states[0], plan,
                                        windows=functools.partial(gd.conv_windows, per_sequence=False))
    got, buf2 = gd.varlen_causal_conv1d(mixed, weight, states[1], plan, windows=tri.gated_delta_conv_windows)
    assert torch.equal(buf, buf2) and got.dtype == want.dtype == dtype
    assert torch.equal(*states) and not torch.equal(states[0][6], conv_state[6])  # the snapshot was taken
    assert_close(got, want, 1e-6 if dtype == torch.float32 else 1e-2)


def test_chunk_plan_layout():
    """Cuts where states are due, each piece padded to whole chunks; rows saved at each cut's last chunk."""
    plan = gd.ChunkPlan.build([0, 100, 103], [-1, 4], [0, 1], [((64, 5), (70, 6)), ((3, 7),)], 3,
                              torch.device("cpu"), chunk_size=64)
    # sequence 0: pieces [0, 64) -> 1 chunk, [64, 70) -> 1, [70, 100) -> 1; sequence 1: [0, 3) -> 1
    assert plan.seq_chunks_cpu == [0, 3, 4]
    assert plan.save_after_cpu == [0, 1, 2, 3]
    assert plan.save_slots.tolist() == [5, 6, 0, 7, 1] and plan.row_slots.tolist() == [[5, -1], [6, -1], [0, -1], [7, 1]]
    assert plan.token_pos[:64].tolist() == list(range(64))
    assert plan.token_pos[64:70].tolist() == list(range(64, 70)) and plan.token_pos[70:100].tolist() == list(
        range(128, 158))
    assert plan.token_pos[100:].tolist() == [192, 193, 194]
    assert plan.chunk_first.tolist() == [0, 64, 70, 100] and plan.chunk_len.tolist() == [64, 6, 30, 3]
    # conv buffer: [3 state cols | 100 tokens] [3 state cols | 3 tokens]; a window due after n tokens ends at n
    assert plan.state_cols.tolist() == [[0, 1, 2], [103, 104, 105]]
    assert plan.save_cols[0].tolist() == [64, 65, 66] and plan.save_cols[3].tolist() == [106, 107, 108]
    assert plan.buffer_len == 109 and plan.fresh.flatten().tolist() == [True, False]
    assert plan.buffer_starts_cpu == [0, 103, 109]
    assert plan.step_rows.numel() == 0


def test_chunk_plan_one_token_sequences_take_the_recurrent_step():
    """Decode rows (one token, states due only after it) get no chunk and no saved row: the recurrent step takes
    them (step_rows), with every slot due; their conv windows are saved as any sequence's. A one-token sequence with
    a state due before its token stays a chunk."""
    plan = gd.ChunkPlan.build([0, 1, 41, 42, 43], [3, -1, 5, 6], [3, 0, 1, 2], [((1, 7),), (), (), ((0, 8),)], 3,
                              torch.device("cpu"), chunk_size=64)
    assert plan.seq_chunks_cpu == [0, 0, 1, 1, 2] and plan.chunk_first.tolist() == [1, 42]
    assert plan.step_rows.tolist() == [0, 41] and plan.step_reads.tolist() == [3, 5]
    assert plan.step_slots.tolist() == [[7, 3], [1, -1]]
    assert plan.token_pos.tolist() == [-1, *range(40), -1, 64]
    assert plan.row_slots.tolist() == [[0], [8], [2]]  # the prompt's end; the last one's start and end
    assert plan.save_slots.tolist() == [7, 3, 0, 1, 8, 2]  # conv windows: every state due
    assert plan.save_cols[:2].tolist() == [[1, 2, 3]] * 2 and plan.save_cols[3].tolist() == [48, 49, 50]


@pytest.mark.parametrize("lengths,reads,writes,snapshots,kernels,block_v",
                         [(*case, kernels, 0) for case in (CASES[1], CASES[2], CASES[4])
                          for kernels in ("prepare", "scan", "conv", "step", "all")] + [(*CASES[5], "all", 0)]
                         + [(*CASES[2], "scan", 16), (*CASES[2], "scan", 64)])
def test_triton_chunk_kernels_match_reference(lengths, reads, writes, snapshots, kernels, block_v, monkeypatch):
    """The Triton prepare, scan, conv-window and delta rule step kernels, each alone and all four, in place of the
    torch parts of the prefill; the scan with its default Dv slice (32: two programs over Dv = 40), and 16 (three)
    and 64 (one, masked)."""
    pytest.importorskip("triton", minversion=TRITON_MIN_VERSION)
    from ember.ops import triton as tri
    from ember.ops.triton import gated_delta_prefill as tri_prefill
    monkeypatch.setattr(tri_prefill, "SCAN_BLOCK_V", block_v)
    hk, hv, dk, dv, kernel = 2, 4, 8, 40, 4  # Dv over two scan program blocks
    weight, conv_state, ssm_state = make_layer(hk, hv, dk, dv, kernel, seed=3)
    mixed, g, beta = make_tokens(sum(lengths), weight.shape[0], hv, seed=4)
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    args = [x.to(DEVICE) for x in (mixed, weight, g, beta)]
    plan = gd.ChunkPlan.build(starts, reads, writes, snapshots, kernel - 1, torch.device(DEVICE))
    states = [(conv_state.to(DEVICE).clone(), ssm_state.to(DEVICE).clone()) for _ in range(2)]
    prepare = tri.gated_delta_chunk_prepare if kernels in ("prepare", "all") else gd.chunk_prepare
    scan = tri.gated_delta_chunk_scan if kernels in ("scan", "all") else gd.chunk_scan
    windows = tri.gated_delta_conv_windows if kernels in ("conv", "all") else gd.conv_windows
    step = tri.gated_delta_step_rows if kernels in ("step", "all") else gd.step_rows
    want = gd.gated_delta_prefill(*args, *states[0], plan, hk)
    out = gd.gated_delta_prefill(*args, *states[1], plan, hk, prepare=prepare, scan=scan, windows=windows, step=step)
    assert_close(out, want, 1e-5)
    assert_close(states[1][1], states[0][1], 1e-5)
    assert torch.equal(states[1][0], states[0][0])


@pytest.mark.parametrize("case", [2, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_prefill_in_model_dtype(dtype, case):
    """All four kernels with the model's activations in `dtype` (on CUDA also bf16, where the prepare kernel's
    dots run in tf32) against the torch parts on the same inputs (which compute in float32)."""
    pytest.importorskip("triton", minversion=TRITON_MIN_VERSION)
    from ember.ops import triton as tri
    hk, hv, dk, dv, kernel = 2, 4, 32, 64, 4
    lengths, reads, writes, snapshots = CASES[case]
    weight, conv_state, ssm_state = make_layer(hk, hv, dk, dv, kernel, seed=8)
    mixed, g, beta = make_tokens(sum(lengths), weight.shape[0], hv, seed=9)
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    args = [mixed.to(DEVICE, dtype), weight.to(DEVICE, dtype), g.to(DEVICE), beta.to(DEVICE, dtype)]
    plan = gd.ChunkPlan.build(starts, reads, writes, snapshots, kernel - 1, torch.device(DEVICE))
    states = [(conv_state.to(DEVICE, dtype).clone(), ssm_state.to(DEVICE).clone()) for _ in range(2)]
    want = gd.gated_delta_prefill(*args, *states[0], plan, hk)
    out = gd.gated_delta_prefill(*args, *states[1], plan, hk, prepare=tri.gated_delta_chunk_prepare,
                                 scan=tri.gated_delta_chunk_scan, windows=tri.gated_delta_conv_windows,
                                 step=tri.gated_delta_step_rows)
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert_close(out, want, tol)
    assert_close(states[1][1], states[0][1], tol / 10)  # the fp32 state: tf32's error, not bf16's
    assert torch.equal(states[1][0], states[0][0])


def test_triton_chunk_prepare_matches_reference():
    """Each of the prepare kernel's outputs against the torch part, over chunks that end early (padding)."""
    pytest.importorskip("triton", minversion=TRITON_MIN_VERSION)
    from ember.ops import triton as tri
    hk, hv, dk, dv = 1, 3, 12, 20
    conv_dim = 2 * hk * dk + hv * dv
    x, g, beta = (t.to(DEVICE) for t in make_tokens(100, conv_dim + 7, hv, seed=5))
    x = x[:, :conv_dim]  # rows with a stride, as the conv output is not
    plan = gd.ChunkPlan.build([0, 70, 100], [-1, -1], [0, 1], [((10, 2),), ()], 3, torch.device(DEVICE))
    want = gd.chunk_prepare(x, g, beta, plan, hk, dk, dv)
    got = tri.gated_delta_chunk_prepare(x, g, beta, plan, hk, dk, dv)
    for name, a, b in zip(("w", "u", "q", "k", "intra", "chunk_decay"), got, want):
        assert a.shape == b.shape, name
        assert_close(a, b, 1e-5)


def test_auto_precision_follows_the_model_dtype(monkeypatch):
    """tf32 dots in the prepare kernel for half-precision models only; float32 models keep fp32's error."""
    pytest.importorskip("triton", minversion=TRITON_MIN_VERSION)
    from ember.ops.triton import gated_delta_prefill as tri_prefill
    monkeypatch.setattr(tri_prefill, "PRECISION", "auto")
    assert [tri_prefill._precision(d) for d in (torch.bfloat16, torch.float16, torch.float32)] == [
        "tf32", "tf32", "tf32x3"]
    monkeypatch.setattr(tri_prefill, "PRECISION", "ieee")
    assert tri_prefill._precision(torch.bfloat16) == "ieee"
