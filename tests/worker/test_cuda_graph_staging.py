"""What a captured graph reads, checked without CUDA: CudaGraphRunner(use_graphs=False) stages each decode step
into its static buffers (every KV group's slot mapping and block table, the state slots, padding rows) and runs
the forward on them. Hybrid models must generate exactly the eager path's greedy tokens: batch 3 padded to 4,
decodes crossing block boundaries (decode snapshots), then a follow-up turn resuming from the cached prefix.
Mixed steps (prompt chunks with decodes among them) go through the same buffers padded to a captured token count,
with a padding sequence and empty sequence slots; Qwen3.5's chunk plans through the static plan buffers."""
from __future__ import annotations

import os

import pytest
import torch

from ember import LLM, SamplingParams, ops
from ember.engine.scheduler import ScheduledSeq
from ember.kv.state_pool import StateStep
from ember.ops import gated_delta as gd
from ember.worker.cuda_graph import StaticChunkPlans
from tests.helpers import count_graph_steps

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when ember.ops.triton's kernels are defined

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=0)
PROMPT_LENS = (29, 45, 14)
TOL = 1e-4


def make_llm(model_dir, **kwargs) -> LLM:
    return LLM(str(model_dir), dtype="float32", device="cpu", progress=False, **kwargs)


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def tokens_and_logprobs(outputs) -> list[tuple[list[int], list[float]]]:
    return [(o.outputs[0].token_ids, [row[t].logprob for row, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
            for o in outputs]


def two_turns(llm: LLM) -> tuple[list, int]:
    """Three prompts batched (29 + 24 tokens cross the block boundaries at 32 and 48 while decoding), then a
    follow-up turn of the first, 49 tokens long: it resumes from the state snapshot its decode took at 48, and its
    first token depends on that state. Returns each output's (token ids, logprobs) and the follow-up's cached tokens."""
    prompts = [prompt(n, seed) for seed, n in enumerate(PROMPT_LENS)]
    first = llm.generate(prompts, GREEDY)
    follow_up = llm.generate([prompts[0] + first[0].outputs[0].token_ids[:20]], GREEDY)[0]
    return tokens_and_logprobs(first + [follow_up]), follow_up.num_cached_tokens


def assert_same(ours: list, ref: list) -> None:
    """The same tokens, and logprobs within TOL."""
    assert [tokens for tokens, _ in ours] == [tokens for tokens, _ in ref]
    for (_, a), (_, b) in zip(ours, ref):
        assert max(abs(x - y) for x, y in zip(a, b)) <= TOL


def with_static_buffers(llm: LLM) -> list[int]:
    """Routes the runner's decode steps through a non-captured graph runner (sizes 1, 2, 4); returns the batch
    sizes it ran."""
    runner = llm.engine.runner
    runner.graphs = runner.make_graph_runner(4, use_graphs=False)
    return count_graph_steps(runner.graphs)


def with_static_mixed_buffers(llm: LLM, token_sizes=(16, 32, 64)) -> list[tuple[int, int]]:
    """Routes decode and mixed steps through a non-captured graph runner (mixed steps padded to token_sizes);
    returns (sequences, tokens) of every mixed step it ran."""
    runner = llm.engine.runner
    runner.graphs = graphs = runner.make_graph_runner(4, use_graphs=False, token_sizes=token_sizes)
    steps: list[tuple[int, int]] = []
    run = graphs.run_mixed

    def spy(seqs: list[ScheduledSeq], t: int, num_tokens: int):
        assert num_tokens == sum(len(s.token_ids) for s in seqs) <= t  # the scheduler's count, the graph's size
        steps.append((len(seqs), num_tokens))
        logits = run(seqs, t, num_tokens)
        assert not logits.numel() or logits.data_ptr() == graphs.logits.data_ptr()  # where decode steps write too
        return logits

    graphs.run_mixed = spy
    return steps


def assert_same_states(ours: LLM, ref: LLM) -> None:
    """Every slot of the pool, working and snapshot, holds the same state: padding rows wrote only the scratch
    slot past the pool's ids, and decode snapshots were copied (a padded batch's GEMMs round differently)."""
    a, b = ours.engine.runner.state_cache, ref.engine.runner.state_cache
    for i, tensors in a.layers.items():
        for name, t in tensors.items():
            torch.testing.assert_close(t[:a.num_slots], b.layers[i][name][:a.num_slots], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", ["qwen3_5", "gemma4"])
def test_static_buffer_decode_equals_eager(name, hybrid_models):
    model_dir, _ = hybrid_models(name)
    eager, staged = make_llm(model_dir), make_llm(model_dir)
    sizes = with_static_buffers(staged)
    (ref, ref_cached), (ours, cached) = two_turns(eager), two_turns(staged)
    assert_same(ours, ref)
    assert 3 in sizes and 1 in sizes  # padded to 4, and the follow-up alone
    assert cached == ref_cached == 48  # the follow-up resumed at the last block boundary its decode crossed
    cold, _ = two_turns(make_llm(model_dir, enable_prefix_caching=False))
    assert_same(cold[-1:], ref[-1:])  # the follow-up, computed from scratch
    assert_same_states(staged, eager)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interprets the kernel on CPU tensors; with CUDA, tests/gpu "
                    "runs the compiled kernel in the graphed engine")
def test_static_buffer_decode_with_triton_op(hybrid_models, monkeypatch):
    """The Triton decode-step kernel (interpreted on CPU) in place of the reference, in a shorter batch whose
    decodes still cross block boundaries (snapshots at 32 and 16)."""
    from tests.ops.kernel_checks import TRITON_MIN_VERSION

    pytest.importorskip("triton", minversion=TRITON_MIN_VERSION)
    from ember.ops import triton as tri

    model_dir, _ = hybrid_models("qwen3_5")
    prompts = [prompt(n, seed) for seed, n in enumerate(PROMPT_LENS)]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
    eager, staged = make_llm(model_dir), make_llm(model_dir)
    sizes = with_static_buffers(staged)
    monkeypatch.setattr(ops, "gated_delta_decode", tri.gated_delta_decode)
    ours, ref = staged.generate(prompts, params), eager.generate(prompts, params)
    assert_same(tokens_and_logprobs(ours), tokens_and_logprobs(ref))
    assert 3 in sizes
    assert_same_states(staged, eager)


@pytest.mark.parametrize("name", ["qwen3", "gemma4", "qwen3_5"])
def test_static_buffer_mixed_steps_equal_eager(name, hf_models, hybrid_models):
    """Prompts chunked by a 48-token budget (decodes join the later chunks' steps), a long prompt alone (its first
    chunk samples nothing), then all of them again (cached prefixes: chunks that start mid-sequence): every step
    runs padded through the static buffers, with the eager path's tokens. Qwen3.5's chunk plans go through the
    static plan buffers (snapshots at block boundaries inside chunks, the padding sequence's state into the scratch
    slot): every slot ends up holding the eager run's state."""
    model_dir, _ = (hf_models if name == "qwen3" else hybrid_models)(name)
    prompts = [prompt(n, seed) for seed, n in enumerate((29, 45, 14, 70))]

    def run(llm: LLM) -> list:
        outs = llm.generate(prompts[:3], GREEDY) + llm.generate(prompts[3:], GREEDY)
        return tokens_and_logprobs(outs + llm.generate(prompts, GREEDY))

    eager = make_llm(model_dir, max_num_batched_tokens=48)
    staged = make_llm(model_dir, max_num_batched_tokens=48)
    assert staged.engine.runner.make_graph_runner(4, use_graphs=False).token_sizes == [16, 32, 48]
    steps = with_static_mixed_buffers(staged, (16, 32, 48))
    assert_same(run(staged), run(eager))
    assert any(n > 1 for n, _ in steps) and any(t == 48 for _, t in steps) and any(t % 16 for _, t in steps)
    assert (1, 48) in steps  # the first chunk of the 70-token prompt alone: nothing sampled
    if name == "qwen3_5":
        assert_same_states(staged, eager)


def test_hybrid_mixed_graphs_need_the_chunked_state_kernels(hf_models, hybrid_models, monkeypatch):
    """A chunked Gated DeltaNet op kept on its torch reference (EMBER_TRITON_SKIP) plans on the host: a hybrid
    model then captures no mixed-step graphs, while a model without recurrent state still does."""
    hybrid = make_llm(hybrid_models("qwen3_5")[0], max_num_batched_tokens=48).engine.runner
    plain = make_llm(hf_models("qwen3")[0], max_num_batched_tokens=48).engine.runner
    assert hybrid.mixed_token_sizes(64) == plain.mixed_token_sizes(64) == (16, 32, 48)
    monkeypatch.setattr(ops, "SKIPPED", frozenset({"gated_delta_chunk_scan"}))
    assert hybrid.mixed_token_sizes(64) == () and plain.mixed_token_sizes(64) == (16, 32, 48)
    assert hybrid.make_graph_runner(4, use_graphs=False).token_sizes == []


def test_graph_sizes_from_the_environment(monkeypatch):
    """EMBER_GRAPH_BATCH_SIZES / EMBER_GRAPH_TOKEN_SIZES: ascending positive integers, or a message naming the
    variable and what it takes."""
    from ember.worker.cuda_graph import _sizes_from_env

    assert _sizes_from_env("EMBER_TEST_SIZES", (1, 2)) == (1, 2)
    monkeypatch.setenv("EMBER_TEST_SIZES", " 1,8,24 ")
    assert _sizes_from_env("EMBER_TEST_SIZES", (1, 2)) == (1, 8, 24)
    for bad, message in (("1,x", "comma-separated integers"), ("4,2", "ascending"), ("0,2", "positive")):
        monkeypatch.setenv("EMBER_TEST_SIZES", bad)
        with pytest.raises(ValueError, match=message):
            _sizes_from_env("EMBER_TEST_SIZES", (1, 2))


def state_seq(n: int, read: int, write: int, snapshots=()) -> ScheduledSeq:
    state = StateStep(read, write, snapshots)
    return ScheduledSeq(f"r{write}", [1] * n, 0, [], True, GREEDY, 0, [1] * n, [], [], state)


def test_static_chunk_plans_are_valid_before_the_first_step():
    """Capture runs every graph's forward on the plans as they are before any step: each must be an empty plan
    whose indices stay inside its buffers (a conv window reaching before the buffer's first row read out of
    bounds on an H100)."""
    width, scratch = 3, 9
    plans = StaticChunkPlans({16: 5, 96: 17}, width, scratch, torch.device("cpu"), is_pinned=False)
    for t, plan in plans.plans.items():
        assert plan.token_cols.shape == (t,) and plan.token_cols.min() >= width
        assert plan.token_cols.max() < plan.buffer_len and plan.state_cols.max() < plan.buffer_len
        assert plan.seq_chunks.eq(0).all()  # no sequence runs a chunk
        assert plan.save_slots.eq(-1).all() and plan.row_slots.eq(-1).all() and plan.step_rows.eq(-1).all()
        assert plan.scan_seqs.eq(-1).all()
        assert plan.save_cols.max() < plan.buffer_len and plan.reads.min() >= 0


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_static_chunk_plan_equals_the_steps_own(kernels):
    """A mixed step's sequences (decodes, one taking a snapshot after its token, a fresh prompt chunk with a
    snapshot inside, a continued chunk) through graph t's static plan, padded to t with the padding sequence and
    empty slots, give the outputs and slot states of their own ChunkPlan; the Triton kernels (interpreted on CPU)
    skip the plan's spare chunks and recurrent steps. Steps that do not fit the plan are refused."""
    from tests.ops.kernel_checks import DEVICE, TRITON_MIN_VERSION, assert_close
    from tests.ops.test_gated_delta_prefill import NUM_SLOTS, make_layer, make_tokens

    hk, hv, dk, dv, kernel, t = 2, 4, 16, 16, 4, 96
    scratch = NUM_SLOTS - 1
    seqs = [state_seq(1, 2, 2, ((1, 7),)), state_seq(70, -1, 3, ((48, 8),)), state_seq(20, 4, 4), state_seq(1, 5, 5),
            state_seq(1, -1, 6)]
    plans = StaticChunkPlans({t: 6}, kernel - 1, scratch, torch.device(DEVICE), is_pinned=False)
    num_tokens = 93
    assert plans.fits(seqs, t, num_tokens)
    plan, copies = plans.stage(seqs, t, [0, 1, 71, 91, 92, num_tokens, t])
    for dst, src in copies:
        dst.copy_(src)
    assert plan.num_chunks == plans.chunks[t] == 2 + 6 + 2
    assert plan.step_rows.tolist() == [0, 91, 92, -1, -1, -1]  # the decodes; the padding sequence has 3 tokens
    assert plan.scan_seqs.tolist() == [1, 2, 5, -1, -1, -1]  # the scan's: the prompt chunks and the padding
    own = gd.ChunkPlan.build([0, 1, 71, 91, 92, 93], [2, -1, 4, 5, -1], [2, 3, 4, 5, 6],
                             [((1, 7),), ((48, 8),), (), (), ()], kernel - 1, torch.device(DEVICE))
    weight, conv_state, ssm_state = make_layer(hk, hv, dk, dv, kernel, seed=11)
    mixed, g, beta = (x.to(DEVICE) for x in make_tokens(t, weight.shape[0], hv, seed=12))
    weight = weight.to(DEVICE)
    fns = {}
    if kernels == "triton":
        pytest.importorskip("triton", minversion=TRITON_MIN_VERSION)
        from ember.ops import triton as tri
        fns = dict(prepare=tri.gated_delta_chunk_prepare, scan=tri.gated_delta_chunk_scan,
                   windows=tri.gated_delta_conv_windows, step=tri.gated_delta_step_rows)
    states = [(conv_state.to(DEVICE).clone(), ssm_state.to(DEVICE).clone()) for _ in range(2)]
    n = num_tokens
    want = gd.gated_delta_prefill(mixed[:n], weight, g[:n], beta[:n], *states[0], own, hk, **fns)
    got = gd.gated_delta_prefill(mixed, weight, g, beta, *states[1], plan, hk, **fns)
    assert_close(got[:num_tokens], want, 1e-5)
    for (conv_a, ssm_a), (conv_b, ssm_b) in [(states[1], states[0])]:
        assert_close(ssm_a[:scratch], ssm_b[:scratch], 1e-5)  # the padding wrote only the scratch slot
        assert torch.equal(conv_a[:scratch], conv_b[:scratch])
    assert not torch.equal(states[1][1][7], ssm_state.to(DEVICE)[7])  # the snapshots were taken

    def fits(plans: StaticChunkPlans, seqs: list[ScheduledSeq]) -> bool:
        return plans.fits(seqs, t, sum(len(s.token_ids) for s in seqs))

    assert not fits(plans, seqs + [state_seq(1, 9, 9)])  # 6 sequences: no slot left for the padding
    assert not fits(plans, [state_seq(4, 2, 2, ((0, 7),))])  # a state due before the first token
    assert not fits(plans, [state_seq(30, 2, 2, ((10, 7), (20, 8)))])  # two snapshots in one chunk
    assert not fits(plans, [state_seq(18, -1, i, ((3, 6 + i),)) for i in range(5)])  # 2 x 5 + 1 chunks > 10
    few = StaticChunkPlans({t: 6}, kernel - 1, scratch, torch.device(DEVICE), is_pinned=False, chunked=3)
    assert fits(few, seqs) and few.chunks[t] == 2 + 3 + 2  # 2 prompt chunks and the padding; decodes take none
    assert not fits(few, seqs[:3] + [state_seq(2, 5, 5), seqs[4]])  # 3 prompt chunks and the padding
    # a padding sequence of one token is a recurrent step, not a chunk
    assert fits(plans, [state_seq(19, -1, i, ((3, 6 + i),)) for i in range(5)])


