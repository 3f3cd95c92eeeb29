"""Async scheduling end to end on tiny random models: the overlapped engine (step n+1 scheduled and launched before
step n's tokens are read; decodes feed placeholders the runner fills on the device) must equal the serial engine
(async_scheduling=False) token for token, with logprobs, through chunked prefill, arrivals mid-run, every stop,
aborts, preemption, prefix-cache hits, penalties and prompt logprobs (which run in serial order), and a hybrid
model on the CUDA-graph staging path. A spy checks that steady decode really launches step n before waiting on
step n-1."""
from __future__ import annotations

import pytest
import torch

from ember import LLM, SamplingParams
from ember.engine.outputs import CompletionOutput
from ember.request import PLACEHOLDER_TOKEN_ID

TOL = 1e-4
GREEDY = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, logprobs=2)
SEEDED = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, top_k=50, seed=7, ignore_eos=True, logprobs=2)


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def make_llm(model_dir, is_async: bool, **kwargs) -> LLM:
    return LLM(str(model_dir), dtype="float32", device="cpu", progress=False, async_scheduling=is_async, **kwargs)


@pytest.fixture(scope="module")
def qwen3(hf_models):
    return hf_models("qwen3")[0]


class Spy:
    """Records the runner's launches and the waits on their handles, in order."""

    def __init__(self, runner) -> None:
        self.events: list[tuple[str, int]] = []
        launch = runner.launch

        def spied(out):
            index = sum(kind == "launch" for kind, _ in self.events)
            self.events.append(("launch", index))
            return _SpiedHandle(launch(out), index, self.events)

        runner.launch = spied

    @property
    def num_overlapped(self) -> int:
        """Launches of step k made before step k-1's result was waited on."""
        order = {event: i for i, event in enumerate(self.events)}
        num_launches = sum(kind == "launch" for kind, _ in self.events)
        return sum(order[("launch", k)] < order.get(("result", k - 1), -1) for k in range(1, num_launches))


class _SpiedHandle:
    def __init__(self, handle, index: int, events: list) -> None:
        self.handle, self.index, self.events = handle, index, events

    def result(self):
        self.events.append(("result", self.index))
        return self.handle.result()


def drive(llm: LLM, arrivals: dict[int, list[tuple[str, list[int], SamplingParams]]],
          aborts: dict[int, list[str]] | None = None) -> dict[str, CompletionOutput]:
    """Steps the engine as a server does: requests added (or aborted) before given step() calls."""
    engine, aborts = llm.engine, aborts or {}
    outputs: dict[str, CompletionOutput] = {}
    step = 0
    while step <= max(arrivals) or engine.has_unfinished():
        for req_id, ids, params in arrivals.get(step, []):
            engine.add_request(req_id, ids, params)
            outputs[req_id] = CompletionOutput(0)
        for req_id in aborts.get(step, []):
            delta = engine.abort(req_id)
            if delta is not None:
                outputs[req_id].apply(delta)
        for delta in engine.step():
            outputs[delta.req_id].apply(delta)
        step += 1
    assert engine.kv.pool.num_used_blocks == 0 and not engine.scheduler.requests
    return outputs


def assert_same(ours: CompletionOutput, ref: CompletionOutput) -> None:
    assert (ours.token_ids, ours.text, ours.finish_reason, ours.stop_reason) == \
        (ref.token_ids, ref.text, ref.finish_reason, ref.stop_reason)
    assert PLACEHOLDER_TOKEN_ID not in ours.token_ids
    assert (ours.logprobs is None) == (ref.logprobs is None)
    for a, b, token in zip(ours.logprobs or [], ref.logprobs or [], ours.token_ids):
        assert a[token].rank == b[token].rank and abs(a[token].logprob - b[token].logprob) <= TOL
        assert len(a) == len(b)


def assert_all_same(ours: dict[str, CompletionOutput], ref: dict[str, CompletionOutput]) -> None:
    assert ours.keys() == ref.keys()
    for req_id in ref:
        assert_same(ours[req_id], ref[req_id])


def both(model_dir, arrivals, aborts=None, **kwargs) -> tuple[dict, dict, Spy, Spy]:
    llms = [make_llm(model_dir, is_async, **kwargs) for is_async in (True, False)]
    spies = [Spy(llm.engine.runner) for llm in llms]
    ours, ref = (drive(llm, arrivals, aborts) for llm in llms)
    return ours, ref, *spies


def test_greedy_and_seeded_sampling_with_chunked_prefill_and_arrivals(qwen3):
    """Mixed prompt lengths through a 16-token budget (chunked prefill), requests arriving mid-run, greedy and
    seeded top-k/top-p sampling (n=2 style: same prompt, two seeds) with logprobs."""
    arrivals = {
        0: [("a", prompt(5, 1), GREEDY), ("b", prompt(40, 2), SEEDED)],
        2: [("c", prompt(70, 3), SEEDED.replace(seed=8)), ("d", prompt(3, 4), GREEDY)],
        5: [("e", prompt(17, 5), SEEDED), ("f", prompt(17, 5), SEEDED.replace(seed=9))],
        9: [("g", prompt(33, 6), GREEDY.replace(max_tokens=7))],
    }
    ours, ref, spy, serial_spy = both(qwen3, arrivals, max_num_batched_tokens=16)
    assert_all_same(ours, ref)
    assert ours["e"].token_ids != ours["f"].token_ids
    assert spy.num_overlapped > 20 and serial_spy.num_overlapped == 0


def test_steady_decode_launches_before_waiting(qwen3):
    """The overlap must not silently degrade to serial: in steady decode every launch but the first comes before
    the wait on the step before it, and each step is waited on once."""
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    ours, ref, spy, _ = both(qwen3, {0: [(str(i), prompt(8 + i, i), params) for i in range(4)]})
    assert_all_same(ours, ref)
    launches = [k for kind, k in spy.events if kind == "launch"]
    results = [k for kind, k in spy.events if kind == "result"]
    assert len(launches) == 16 and sorted(results) == launches  # a prompt step, 15 decodes; one wait per step
    assert spy.num_overlapped == 15
    assert spy.events[:4] == [("launch", 0), ("launch", 1), ("result", 0), ("launch", 2)]


def test_stops_equal_serial(demo_dir):
    """EOS, stop token ids, stop strings (found after detokenizing, with the next step already launched),
    max_tokens of 1-3 and min_tokens."""
    base_llm = make_llm(demo_dir, False)
    text_prompt = base_llm.get_tokenizer().encode("The quick brown fox")
    base = base_llm.generate([text_prompt], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))[0]
    tokens, text = base.outputs[0].token_ids, base.outputs[0].text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    greedy = SamplingParams(max_tokens=30, temperature=0)
    requests = [
        ("eos", text_prompt, greedy),
        ("stop-id", text_prompt, greedy.replace(stop_token_ids=[tokens[5]], ignore_eos=True)),
        ("stop-id-min", text_prompt, greedy.replace(stop_token_ids=[tokens[2]], min_tokens=4, ignore_eos=True)),
        ("stop-str", text_prompt, greedy.replace(stop=stop, ignore_eos=True)),
        ("stop-str-kept", text_prompt, greedy.replace(stop=[stop, "zzz"], include_stop_str_in_output=True,
                                                      ignore_eos=True)),
        ("max-1", text_prompt, greedy.replace(max_tokens=1, ignore_eos=True)),
        ("max-2", prompt(9, 1), greedy.replace(max_tokens=2, ignore_eos=True)),
        ("max-3", prompt(20, 2), SEEDED.replace(max_tokens=3)),
    ]
    results = []
    for is_async in (True, False):
        llm = make_llm(demo_dir, is_async)
        llm.engine.eos_token_ids = [tokens[8]]  # an eos the random model does sample
        results.append(drive(llm, {0: requests[:4], 1: requests[4:]}))
    ours, ref = results
    assert_all_same(ours, ref)
    assert ours["eos"].token_ids == tokens[:9] and ours["eos"].finish_reason == "stop"
    assert ours["stop-id"].stop_reason == tokens[5] and ours["stop-str"].stop_reason == stop
    assert ours["stop-str"].text == text[:text.index(stop)]
    assert [len(ours[f"max-{n}"].token_ids) for n in (1, 2, 3)] == [1, 2, 3]


def test_abort_mid_run(qwen3):
    """Aborts of a request in flight, of one still waiting, and an id reused at once: the others are unchanged,
    the aborted ones end with what was sent (a prefix of their serial output) and free their blocks."""
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    arrivals = {0: [("a", prompt(12, 1), params), ("b", prompt(30, 2), params), ("c", prompt(7, 3), params)],
                1: [("w", prompt(50, 4), params)]}
    aborts = {4: ["b"], 1: ["w"]}
    ours, ref, _, _ = both(qwen3, arrivals, aborts, max_num_batched_tokens=32)
    full = drive(make_llm(qwen3, False), arrivals)
    for req_id in "ac":
        assert_same(ours[req_id], ref[req_id])
    for req_id in "bw":
        assert ours[req_id].finish_reason == "abort"
        assert ours[req_id].token_ids == full[req_id].token_ids[:len(ours[req_id].token_ids)]
    assert len(ours["b"].token_ids) >= 2 and ours["w"].token_ids == []

    engine = make_llm(qwen3, True).engine
    engine.add_request("x", prompt(10, 5), params)
    sent = engine.step() + engine.step()  # x's first token is back, its second in flight
    delta = engine.abort("x")
    assert [t for d in sent for t in d.new_token_ids] == drive(make_llm(qwen3, False), {0: [
        ("x", prompt(10, 5), params)]})["x"].token_ids[:1]
    assert delta.finished and delta.finish_reason == "abort" and delta.new_token_ids == []
    engine.add_request("x", prompt(6, 6), params)  # the same id, while the old request's step is in flight
    tokens = []
    while engine.has_unfinished():
        tokens += [t for d in engine.step() for t in d.new_token_ids]
    assert tokens == drive(make_llm(qwen3, False), {0: [("x", prompt(6, 6), params)]})["x"].token_ids


def test_preemption_with_a_tiny_pool(qwen3):
    """14 KV blocks for 6 requests: preemption and recompute, also of requests whose last token is in flight."""
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=1)
    arrivals = {0: [(str(i), prompt(40 + i, 10 + i), params) for i in range(6)]}
    kv_gb = 14 * 16 * 3 * 2 * 2 * 24 * 4 / 2**30
    llm = make_llm(qwen3, True, kv_cache_gb=kv_gb)
    assert llm.engine.kv.pool.num_blocks == 14
    preempted_in_flight = []
    preempt = llm.engine.scheduler._preempt
    llm.engine.scheduler._preempt = lambda r: preempted_in_flight.append(r.num_placeholders) or preempt(r)
    ours = drive(llm, arrivals)
    ref = drive(make_llm(qwen3, False), arrivals)  # a roomy pool: no preemption
    assert_all_same(ours, ref)
    assert any(preempted_in_flight)


def test_prefix_cache_hits_equal_serial(qwen3):
    """A second batch sharing prefixes with the first hits the cache as in the serial engine."""
    shared = prompt(100, 1)
    first = {0: [("a", shared + prompt(7, 2), GREEDY), ("b", prompt(20, 3), SEEDED)]}
    second = {0: [("c", shared + prompt(9, 4), GREEDY), ("d", shared[:40] + prompt(5, 5), SEEDED)]}
    cached = []
    for is_async in (True, False):
        llm = make_llm(qwen3, is_async)
        runs = [drive(llm, first), llm.generate([shared + prompt(9, 4)], GREEDY)[0], drive(llm, second)]
        cached.append((runs, runs[1].num_cached_tokens))
    (ours, ours_cached), (ref, ref_cached) = cached
    assert ours_cached == ref_cached == 96
    assert_all_same(ours[0], ref[0])
    assert_all_same(ours[2], ref[2])
    assert ours[1].outputs[0].token_ids == ref[1].outputs[0].token_ids


def test_penalties_and_prompt_logprobs_run_in_serial_order(qwen3):
    """Penalties read the token history on the host and prompt logprobs are read in the step: while such a
    request runs nothing overlaps, and the outputs equal the serial engine's."""
    penalised = SEEDED.replace(repetition_penalty=1.3, presence_penalty=0.2, frequency_penalty=0.1, max_tokens=12)
    arrivals = {0: [("p", prompt(20, 1), penalised), ("g", prompt(9, 2), GREEDY.replace(max_tokens=12))]}
    ours, ref, spy, _ = both(qwen3, arrivals)
    assert_all_same(ours, ref)
    assert spy.num_overlapped == 0

    with_prompt_lp = GREEDY.replace(prompt_logprobs=2, max_tokens=12)
    llms = [make_llm(qwen3, is_async, max_num_batched_tokens=16) for is_async in (True, False)]
    outs = [llm.generate([prompt(40, 3), prompt(5, 4)], [with_prompt_lp, GREEDY]) for llm in llms]
    for a, b in zip(*outs):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    rows = [[(next(iter(r)), r[next(iter(r))].logprob) for r in out[0].prompt_logprobs[1:]] for out in outs]
    assert [t for t, _ in rows[0]] == [t for t, _ in rows[1]] and len(rows[0]) == 39
    assert max(abs(x - y) for (_, x), (_, y) in zip(*rows)) <= TOL


def with_static_buffers(llm: LLM) -> list[int]:
    """Routes decode steps through a non-captured graph runner (the staging path); returns the number of
    placeholder rows it filled per step."""
    runner = llm.engine.runner
    graphs = runner.make_graph_runner(4, use_graphs=False)
    filled: list[int] = []
    fill = graphs.fill_placeholders

    def spied(input_ids, seqs, ends):
        filled.append(sum(s.token_ids[-1] == PLACEHOLDER_TOKEN_ID for s in seqs))
        fill(input_ids, seqs, ends)

    graphs.fill_placeholders = spied
    runner.graphs = graphs
    return filled


@pytest.mark.parametrize("name", ["qwen3_5", "gemma4"])
def test_hybrid_two_turns_on_the_staging_path(name, hybrid_models):
    """Recurrent-state (qwen3_5) and sliding-window (gemma4) models decoding through the graph runner's static
    buffers, placeholders filled there; decodes cross block boundaries (snapshots keyed once their last token is
    known), then a follow-up turn resumes from the cached prefix."""
    model_dir, _ = hybrid_models(name)
    prompts = [prompt(n, seed) for seed, n in enumerate((29, 45, 14))]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=0)
    results = []
    for is_async in (True, False):
        llm = make_llm(model_dir, is_async)
        filled = with_static_buffers(llm)
        first = drive(llm, {0: [(str(i), p, params) for i, p in enumerate(prompts)]})
        follow_up = llm.generate([prompts[0] + first["0"].token_ids[:20]], params)[0]
        results.append((first, follow_up, filled))
    (ours, ours_turn, filled), (ref, ref_turn, ref_filled) = results
    assert_all_same(ours, ref)
    assert ours_turn.outputs[0].token_ids == ref_turn.outputs[0].token_ids
    assert ours_turn.num_cached_tokens == ref_turn.num_cached_tokens == 48
    assert sum(filled) > 40 and not any(ref_filled)


def test_switches(qwen3):
    assert make_llm(qwen3, True).engine.is_async and not make_llm(qwen3, False).engine.is_async
    from ember.cli.main import build_parser
    args = build_parser().parse_args(["serve", str(qwen3), "--no-async-scheduling"])
    assert args.no_async_scheduling
