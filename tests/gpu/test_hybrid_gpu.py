"""Hybrid models (Gated DeltaNet state slots, sliding-window KV groups, shared KV) on CUDA against the CPU float32
path: the same greedy tokens and logprobs, cold and from a prefix-cache hit that restores recurrent state."""
from __future__ import annotations

import pytest
import torch

from ember import LLM, SamplingParams
from tests.gpu.test_gpu_path import bf16_against_cpu
from tests.helpers import assert_greedy_agrees, count_graph_steps
from tests.parity.hybrid_models import build_bf16_model, build_hybrid_model
from tests.parity.models import build_hf_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _run(llm: LLM, prompts: list[list[int]]):
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True, logprobs=0)
    return [o.outputs[0] for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("name", ["qwen3_5", "gemma4", "gemma4-k-eq-v", "mistral-window"])
def test_cuda_float32_matches_cpu(name, tmp_path):
    (build_hf_model if name == "mistral-window" else build_hybrid_model)(name, tmp_path)
    g = torch.Generator().manual_seed(0)
    base = torch.randint(3, 500, (70,), generator=g).tolist()
    prompts = [base, base[:37], base + [5, 6, 7]]  # the last two hit the first's cached prefix
    cpu = LLM(str(tmp_path), dtype="float32", device="cpu", progress=False)
    gpu = LLM(str(tmp_path), dtype="float32", device="cuda", progress=False, kv_cache_gb=1)
    ref = [_run(cpu, [p])[0] for p in prompts]
    ours = [_run(gpu, [p])[0] for p in prompts]
    for a, b in zip(ours, ref):
        assert a.token_ids == b.token_ids
        for row_a, row_b, t in zip(a.logprobs, b.logprobs, a.token_ids):
            assert abs(row_a[t].logprob - row_b[t].logprob) <= 1e-3
    assert [o.token_ids for o in _run(gpu, prompts)] == [o.token_ids for o in ref]  # batched


def _graph_turns(llm: LLM) -> tuple[list, int]:
    """Three prompts batched (a graph of 4 with a padding row; decodes cross block boundaries, taking snapshots),
    then a follow-up turn of the first that resumes from its decode snapshot at 48."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (29, 45, 14)]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True, logprobs=2)
    first = [o.outputs[0] for o in llm.generate(prompts, params)]
    follow_up = llm.generate([prompts[0] + first[0].token_ids[:20]], params)[0]
    return first + [follow_up.outputs[0]], follow_up.num_cached_tokens


@pytest.mark.parametrize("name", ["qwen3_5", "gemma4"])
def test_cuda_graphs_match_eager_bf16(name, tmp_path, monkeypatch):
    """Decode graphs of hybrid models (state slots, several KV groups, padding rows, decode snapshots) against
    EMBER_CUDA_GRAPHS=0 in bf16, including a follow-up turn restored from a decode snapshot."""
    build_hybrid_model(name, tmp_path)
    graphs = LLM(str(tmp_path), dtype="bfloat16", device="cuda", progress=False, kv_cache_gb=1)
    runner = graphs.engine.runner
    assert runner.graphs is not None
    sizes = count_graph_steps(runner.graphs)
    monkeypatch.setenv("EMBER_CUDA_GRAPHS", "0")
    eager = LLM(str(tmp_path), dtype="bfloat16", device="cuda", progress=False, kv_cache_gb=1)
    assert eager.engine.runner.graphs is None
    (ours, cached), (ref, ref_cached) = _graph_turns(graphs), _graph_turns(eager)
    assert 3 in sizes and cached == ref_cached == 48
    for a, b in zip(ours[:3], ref[:3]):
        assert_greedy_agrees(a, b)
    if ours[0].token_ids[:20] == ref[0].token_ids[:20]:  # the same follow-up prompt
        assert_greedy_agrees(ours[3], ref[3])


@pytest.mark.parametrize("name,state_dtype", [("qwen3_5", "float32"), ("qwen3_5", "bfloat16"), ("gemma4", "float32")])
def test_cuda_bf16_matches_cpu_fp32_teacher_forced(name, state_dtype, tmp_path):
    """The hybrids at real head sizes in bf16 (tests/parity/hybrid_models.BF16_CONFIGS): the chunked delta-rule
    prefill kernels (tf32 prepare), the conv windows and decode kernels, sliding windows and per-layer inputs, in
    graphs, against CPU float32; the same bar as the Llama family's (tests/gpu/test_gpu_path.py)."""
    build_bf16_model(name, tmp_path)
    bf16_against_cpu(tmp_path, ssm_state_dtype=state_dtype)


@pytest.mark.parametrize("num_k_heads,num_v_heads", [(16, 32), (16, 48)])
def test_gated_delta_decode_kernel_bf16_qwen3_5_shapes(num_k_heads, num_v_heads):
    """ops.gated_delta_decode on CUDA (the Triton kernels) against the torch reference at Qwen3.5's head dims
    (128, several Dv blocks per head), bf16 activations and fp32 state, two steps on the same slots."""
    from ember import ops
    from ember.ops import gated_delta as ref

    g = torch.Generator().manual_seed(num_v_heads)
    num_seqs, num_slots, dk, dv, kernel = 6, 16, 128, 128, 4
    conv_dim = 2 * num_k_heads * dk + num_v_heads * dv
    weight = (0.5 * torch.randn(conv_dim, kernel, generator=g)).cuda().bfloat16()
    conv = torch.randn(num_slots, conv_dim, kernel - 1, generator=g).cuda().bfloat16()
    ssm = (0.3 * torch.randn(num_slots, num_v_heads, dk, dv, generator=g)).cuda()
    writes = torch.randperm(num_slots, generator=g)[:num_seqs].cuda()
    reads = writes.clone()
    reads[1] = -1  # a fresh sequence
    reads[4] = next(s for s in range(num_slots) if s not in writes.tolist())  # a snapshot nobody writes
    ref_conv, ref_ssm = conv.clone(), ssm.clone()
    for step in range(2):
        mixed = torch.randn(num_seqs, conv_dim, generator=g).cuda().bfloat16()
        log_decay = (-2 * torch.rand(num_seqs, num_v_heads, generator=g)).cuda()
        beta = torch.rand(num_seqs, num_v_heads, generator=g).cuda().bfloat16()
        read = reads if step == 0 else writes
        out = ops.gated_delta_decode(mixed, weight, log_decay, beta, conv, ssm, read, writes)
        expected = ref.gated_delta_decode(mixed, weight, log_decay, beta, ref_conv, ref_ssm, read, writes)
        for a, b in ((out, expected), (conv[writes], ref_conv[writes]), (ssm[writes], ref_ssm[writes])):
            err = ((a.float() - b.float()).norm() / b.float().norm()).item()
            assert err < 2e-2, f"step {step}: relative error {err:.2e}"
