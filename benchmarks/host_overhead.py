"""Host (Python) time per decode step of the engine at 256 concurrent sequences, with the model taken out.

The real `LLM` / `EngineCore` (scheduler, KV block manager, output processor, the `generate` loop) runs the
workload of `gpu_decode.py`'s largest batch: 256 requests, prompt 128, output 256, greedy, ignore_eos, no
tokenizer (so no detokenization), qwen3-8b config. The `ModelRunner` is replaced by a stub that sizes the block
pool and returns one token per sampled sequence at once: no weights, no forward, no device. What is left is the
engine's host work, which on a GPU is paid on top of the model's device time every step (on an H200, 11.84 ms
per step against a 10.06 ms graph replay at this batch). The runner's own host work (building inputs, the CUDA
graph's staging copies, the sampled-token sync) is not measured here.

Per full decode step (256 decodes) it reports the mean over the steps of --repeats runs (a mean, not a median:
full GC passes come about once in one or two runs, and their cost is spread over every step):
  schedule  Scheduler.schedule (budget, block allocation, ScheduledSeq records)
  runner    the stub's execute (excluded from the host total; shown to bound the wrapper cost)
  update    Scheduler.update (computed counts, token append, stop checks, prefix-cache registration, frees)
  output    EngineCore.step after update: OutputProcessor.process / delta per request, finished removal
  rest      the remainder of EngineCore.step (step total minus the above)
  driver    LLM.generate's loop between steps (applying each delta to the RequestOutputs)
  gc        the cyclic garbage collector, wherever it ran (the columns above exclude it); mostly the rare
            full collections, whose cost grows with everything alive in the process (torch, the engine)
  host      schedule + update + output + rest + driver + gc

Rows: prefix caching off (gpu_decode's setting) and on; on with the demo tokenizer kept, so each new token is
detokenized (the stub then samples ids inside its 4k vocabulary): what a server streaming text pays on top;
on with the start-up heap frozen (gc.collect + gc.freeze, as `ember serve` does; the LLM API does not).

    python benchmarks/host_overhead.py [--repeats 10] [--profile] [--out benchmarks/results/NAME.txt]
"""
from __future__ import annotations

import argparse
import cProfile
import contextlib
import gc
import io
import platform
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

BATCH, PROMPT_LEN, OUTPUT_LEN = 256, 128, 256
SHAPE = "qwen3-8b"
PHASES = ("schedule", "runner", "update", "output", "rest", "driver", "gc")


class StubRunner:
    """Stands in for ModelRunner: a pool of num_blocks and a token per sampled sequence, no model."""

    num_blocks_for_bench = 0  # set by make_llm before the engine is built
    num_token_ids = 0  # sampled ids lie in [0, this): the tokenizer's vocabulary when detokenizing

    def __init__(self, model_cfg, cache_cfg, progress: bool = True) -> None:
        self.num_blocks = cache_cfg.num_blocks = self.num_blocks_for_bench
        self.vocab_size = model_cfg.hf_config["vocab_size"]
        self.num_token_ids = self.num_token_ids or self.vocab_size

    def execute(self, out):
        from ember.worker.model_runner import ModelRunnerOutput

        # a deterministic token that depends on the position, so the stream is not constant
        v = self.num_token_ids
        return ModelRunnerOutput({s.req_id: (s.start_pos * 7919 + 11) % v for s in out.seqs if s.do_sample})


@contextlib.contextmanager
def stub_model_runner(num_blocks: int, num_token_ids: int):
    import ember.engine.core as core

    StubRunner.num_blocks_for_bench, StubRunner.num_token_ids = num_blocks, num_token_ids
    real, core.ModelRunner = core.ModelRunner, StubRunner
    try:
        yield
    finally:
        core.ModelRunner = real


def make_llm(model_dir: str, prefix_caching: bool):
    from ember import LLM
    from ember.tokenizer.demo import DEMO_VOCAB_SIZE

    blocks_per_seq = -(-(PROMPT_LEN + OUTPUT_LEN) // 16)
    detok = (Path(model_dir) / "tokenizer.json").is_file()
    with stub_model_runner(int(1.1 * BATCH * blocks_per_seq) + 1, DEMO_VOCAB_SIZE if detok else 0):
        return LLM(model_dir, load_format="dummy", dtype="bfloat16", device="cpu", max_model_len=8192 + 256,
                   max_num_seqs=BATCH, max_num_batched_tokens=8192, enable_prefix_caching=prefix_caching,
                   progress=False)


class PhaseTimer:
    """Wraps schedule / execute / update / step on the instances and records phase times per step. The clock is
    this thread's CPU time (wall time on an idle machine; on a shared one it leaves out other processes' turns),
    stopped while the cyclic garbage collector runs; GC time is its own column."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.steps: list[dict] = []
        self._gc_s, self._gc_start = 0.0, 0.0
        self._last_end: tuple[float, float] | None = None
        self._orig = (engine.scheduler.schedule, engine.runner.execute, engine.scheduler.update, engine.step)
        sched, run, upd, _ = self._orig
        engine.scheduler.schedule = self._wrap(sched, "schedule")
        engine.runner.execute = self._wrap(run, "runner")
        engine.scheduler.update = self._wrap(upd, "update")
        engine.step = self._step
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)
        e = self.engine
        e.scheduler.schedule, e.runner.execute, e.scheduler.update = self._orig[:3]
        del e.step  # the class's step again

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.thread_time()
        else:
            self._gc_s += time.thread_time() - self._gc_start

    def _clock(self) -> float:
        return time.thread_time() - self._gc_s

    def _wrap(self, fn, name: str):
        def timed(*args):
            start = self._clock()
            result = fn(*args)
            end = self._clock()
            self._cur[name] = end - start
            self._cur[name + "_end"] = end
            if name == "schedule":
                seqs = result.seqs
                self._cur["is_decode"] = len(seqs) == BATCH and all(len(s.token_ids) == 1 for s in seqs)
            return result
        return timed

    def _step(self):
        start, gc_start = self._clock(), self._gc_s
        prev_end, prev_gc = self._last_end or (start, gc_start)
        self._cur = {"driver": start - prev_end}
        deltas = self._orig[3]()
        end = self._clock()
        self._last_end = (end, self._gc_s)
        cur = self._cur
        cur["output"] = end - cur["update_end"] if "update_end" in cur else 0.0
        cur["rest"] = end - start - sum(cur.get(k, 0.0) for k in ("schedule", "runner", "update", "output"))
        cur["gc"] = self._gc_s - prev_gc  # during the driver's loop and this step
        self.steps.append(cur)
        return deltas

    def decode_means_ms(self) -> dict[str, float]:
        # the first full step's driver time includes the prefill steps' deltas; skip it
        rows = [s for s in self.steps if s.get("is_decode")][1:]
        means = {k: 1e3 * statistics.fmean(s.get(k, 0.0) for s in rows) for k in PHASES}
        means["host"] = sum(means[k] for k in PHASES if k != "runner")
        means["num_steps"] = len(rows)
        return means


def prompts(vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab - 10, (BATCH, PROMPT_LEN), generator=g).tolist()


def run_once(llm, seed: int, profile: cProfile.Profile | None = None) -> dict[str, float]:
    """One generate of the workload; new prompts per seed, so a prefix cache only ever misses."""
    from ember import SamplingParams

    params = SamplingParams(max_tokens=OUTPUT_LEN, temperature=0, ignore_eos=True)
    batch = prompts(llm.engine.runner.vocab_size, seed)
    timer = PhaseTimer(llm.engine)
    if profile is not None:
        profile.enable()
    start = time.perf_counter()
    outs = llm.generate(batch, params)
    total = time.perf_counter() - start
    if profile is not None:
        profile.disable()
    timer.close()
    assert all(len(o.outputs[0].token_ids) == OUTPUT_LEN for o in outs)
    assert llm.engine.kv.pool.num_used_blocks == 0
    return {**timer.decode_means_ms(), "generate_s": total}


def mean_runs(runs: list[dict]) -> dict[str, float]:
    return {k: statistics.fmean(r[k] for r in runs) for k in runs[0]}  # every run has as many decode steps


def table(results: dict[str, dict]) -> str:
    head = f"{'config':<16}" + "".join(f"{k:>9}" for k in (*PHASES, "host")) + f"{'steps':>7}{'gen s':>7}"
    lines = ["host ms per full decode step (256 decodes), mean over steps and runs; runner = stub, "
             "not in host", head]
    for name, r in results.items():
        lines.append(f"{name:<16}" + "".join(f"{r[k]:>9.3f}" for k in (*PHASES, "host"))
                     + f"{int(r['num_steps']):>7}{r['generate_s']:>7.2f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--profile", action="store_true", help="print cProfile's top functions of one run")
    ap.add_argument("--out", default=None, help="write the table to this file")
    args = ap.parse_args()
    from ember.demo import make_demo_model

    with_tokenizer = make_demo_model(tempfile.mkdtemp(prefix="ember-host-"), SHAPE, with_weights=False)
    model_dir = make_demo_model(tempfile.mkdtemp(prefix="ember-host-"), SHAPE, with_weights=False)
    (model_dir / "tokenizer.json").unlink()  # as gpu_decode: no detokenization
    rows = [("prefix-cache off", model_dir, False, False), ("prefix-cache on", model_dir, True, False),
            ("on, detokenize", with_tokenizer, True, False), ("on, gc frozen", model_dir, True, True)]
    results = {}
    for name, path, caching, freeze in rows:
        llm = make_llm(str(path), caching)
        if freeze:  # as `ember serve` does (engine.core.freeze_gc_heap, inlined so older trees run too)
            gc.collect()
            gc.freeze()
        run_once(llm, seed=0)  # warm-up
        results[name] = mean_runs([run_once(llm, seed=1 + i) for i in range(args.repeats)])
        gc.unfreeze()
    text = (f"CPU: {platform.machine()}, {platform.processor() or '?'}, python {sys.version.split()[0]}, "
            f"{SHAPE} config, batch {BATCH}, prompt {PROMPT_LEN}, output {OUTPUT_LEN}, {args.repeats} runs\n"
            + table(results))
    print(text)
    if args.profile:
        prof = cProfile.Profile()
        run_once(make_llm(str(model_dir), True), 0, prof)
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
        print(buf.getvalue())
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
