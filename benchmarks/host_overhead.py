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
on with the start-up heap frozen (gc.collect + gc.freeze, as `ember serve` does; since 2026-12-03 LLM.generate
freezes the heap for each call too, so the other rows no longer walk it either, and the older result files
predate that). Each
row runs twice: the serial engine (async_scheduling=False) and the overlapped one (the default), where update is
Scheduler.advance + Scheduler.complete and output is EngineCore._process without complete.

Step time with a simulated device: the stub then also plays a device that takes --device-ms per step, in launch
order (a step starts when the one before it has ended), and the handle's result() waits until its step has ended.
Reported: wall ms per full decode step (driver included) of the serial and the overlapped engine, which hides
the host work behind the device: serial ~ host + device, overlapped ~ max(host, device) + what cannot overlap.

    python benchmarks/host_overhead.py [--repeats 10] [--device-ms 0.5 1.27 10.4] [--profile] [--out FILE]
"""
from __future__ import annotations

import argparse
import cProfile
import contextlib
import gc
import inspect
import io
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

BATCH, PROMPT_LEN, OUTPUT_LEN = 256, 128, 256
SHAPE = "qwen3-8b"
PHASES = ("schedule", "runner", "update", "output", "rest", "driver", "gc")


class StubHandle:
    def __init__(self, output, ready_at: float) -> None:
        self.output, self.ready_at = output, ready_at

    def result(self):
        while time.perf_counter() < self.ready_at:  # the simulated device is still running this step
            pass
        return self.output


class StubRunner:
    """Stands in for ModelRunner: a pool of num_blocks and a token per sampled sequence, no model; optionally a
    device that takes device_ms per step, one step after the other."""

    supports_async_scheduling = True
    num_blocks_for_bench = 0  # set by make_llm before the engine is built
    num_token_ids = 0  # sampled ids lie in [0, this): the tokenizer's vocabulary when detokenizing
    device_ms = 0.0

    def __init__(self, model_cfg, cache_cfg, progress: bool = True) -> None:
        self.num_blocks = cache_cfg.num_blocks = self.num_blocks_for_bench
        self.vocab_size = model_cfg.hf_config["vocab_size"]
        self.num_token_ids = self.num_token_ids or self.vocab_size
        self._device_free_at = 0.0

    def launch(self, out):
        from ember.worker.model_runner import ModelRunnerOutput

        # a deterministic token that depends on the position, so the stream is not constant (placeholders are
        # never read: the token is a function of the position only)
        v = self.num_token_ids
        output = ModelRunnerOutput({s.req_id: (s.start_pos * 7919 + 11) % v for s in out.seqs if s.do_sample})
        self._device_free_at = max(time.perf_counter(), self._device_free_at) + self.device_ms * 1e-3
        return StubHandle(output, self._device_free_at)

    def execute(self, out):
        return self.launch(out).result()


@contextlib.contextmanager
def stub_model_runner(num_blocks: int, num_token_ids: int):
    import ember.engine.core as core

    StubRunner.num_blocks_for_bench, StubRunner.num_token_ids = num_blocks, num_token_ids
    real, core.ModelRunner = core.ModelRunner, StubRunner
    try:
        yield
    finally:
        core.ModelRunner = real


def make_llm(model_dir: str, prefix_caching: bool, is_async: bool = False):
    from ember import LLM
    from ember.tokenizer.demo import DEMO_VOCAB_SIZE

    blocks_per_seq = -(-(PROMPT_LEN + OUTPUT_LEN) // 16)
    detok = (Path(model_dir) / "tokenizer.json").is_file()
    # trees from before async scheduling are serial and lack the argument
    kwargs = {"async_scheduling": is_async} if "async_scheduling" in inspect.signature(LLM).parameters else {}
    assert kwargs or not is_async, "this tree has no async scheduling"
    with stub_model_runner(int(1.1 * BATCH * blocks_per_seq) + 1, DEMO_VOCAB_SIZE if detok else 0):
        return LLM(model_dir, load_format="dummy", dtype="bfloat16", device="cpu", max_model_len=8192 + 256,
                   max_num_seqs=BATCH, max_num_batched_tokens=8192, enable_prefix_caching=prefix_caching,
                   progress=False, **kwargs)


class PhaseTimer:
    """Wraps schedule / launch / advance / complete / _process / step on the instances and records phase times per
    step. The clock is this thread's CPU time (wall time on an idle machine; on a shared one it leaves out other
    processes' turns), stopped while the cyclic garbage collector runs; GC time is its own column. Each step's
    wall time (end to end, driver included) is recorded too. Trees from before async scheduling have update and
    execute instead of advance / complete / launch and no _process (output is then the step after update)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.steps: list[dict] = []
        self._gc_s, self._gc_start = 0.0, 0.0
        self._last_end: tuple[float, float, float] | None = None
        sched, runner = engine.scheduler, engine.runner
        is_split = hasattr(sched, "advance")
        targets = [(sched, "schedule", "schedule"), (runner, "launch" if is_split else "execute", "runner")]
        if is_split:
            targets += [(sched, "advance", "advance"), (sched, "complete", "complete"), (engine, "_process", "process")]
        else:
            targets += [(sched, "update", "complete")]
        self._wrapped = [(obj, attr) for obj, attr, _ in targets]
        for obj, attr, name in targets:
            setattr(obj, attr, self._wrap(getattr(obj, attr), name))
        self._step_fn, engine.step = engine.step, self._step
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)
        for obj, attr in self._wrapped + [(self.engine, "step")]:
            delattr(obj, attr)  # the class's method again

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
            self._cur[name] = self._cur.get(name, 0.0) + end - start
            self._cur[name + "_end"] = end
            if name == "schedule":
                seqs = result.seqs
                self._cur["is_decode"] = len(seqs) == BATCH and all(len(s.token_ids) == 1 for s in seqs)
            return result
        return timed

    def _step(self):
        start, gc_start = self._clock(), self._gc_s
        prev_end, prev_gc, prev_wall = self._last_end or (start, gc_start, time.perf_counter())
        self._cur = {"driver": start - prev_end}
        deltas = self._step_fn()
        end, wall = self._clock(), time.perf_counter()
        self._last_end = (end, self._gc_s, wall)
        cur = self._cur
        cur["update"] = cur.get("advance", 0.0) + cur.get("complete", 0.0)
        if "process" in cur:
            cur["output"] = cur["process"] - cur.get("complete", 0.0)
        else:  # the serial-only tree: output is what follows update
            cur["output"] = end - cur["complete_end"] if "complete_end" in cur else 0.0
        inner = cur["output"] + sum(cur.get(k, 0.0) for k in ("schedule", "runner", "update"))
        cur["rest"] = end - start - inner
        cur["gc"] = self._gc_s - prev_gc  # during the driver's loop and this step
        cur["wall"] = wall - prev_wall
        self.steps.append(cur)
        return deltas

    def decode_means_ms(self) -> dict[str, float]:
        # the first full step's driver time includes the prefill steps' deltas; skip it
        rows = [s for s in self.steps if s.get("is_decode")][1:]
        means = {k: 1e3 * statistics.fmean(s.get(k, 0.0) for s in rows) for k in (*PHASES, "wall")}
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


def table(results: dict[tuple[str, str], dict]) -> str:
    head = f"{'config':<17}{'engine':<8}" + "".join(f"{k:>9}" for k in (*PHASES, "host")) + f"{'steps':>7}{'gen s':>7}"
    lines = ["host ms per full decode step (256 decodes), mean over steps and runs; runner = stub, "
             "not in host", head]
    for (name, mode), r in results.items():
        lines.append(f"{name:<17}{mode:<8}" + "".join(f"{r[k]:>9.3f}" for k in (*PHASES, "host"))
                     + f"{int(r['num_steps']):>7}{r['generate_s']:>7.2f}")
    return "\n".join(lines)


def device_table(results: dict[float, dict[str, dict]], host: dict[str, dict]) -> str:
    lines = ["wall ms per full decode step with a simulated device of D ms per step (prefix cache on, gc frozen), "
             "mean over steps and runs",
             f"{'device ms':>10}{'serial':>9}{'async':>9}{'serial-D':>10}{'async-D':>9}{'speed-up':>10}"]
    for device_ms, r in results.items():
        serial, ours = r["serial"]["wall"], r["async"]["wall"]
        lines.append(f"{device_ms:>10.2f}{serial:>9.3f}{ours:>9.3f}{serial - device_ms:>10.3f}{ours - device_ms:>9.3f}"
                     f"{serial / ours:>9.2f}x")
    lines.append("(host ms per step of the same config, no device: " +
                 ", ".join(f"{mode} {r['host']:.3f}" for mode, r in host.items()) + ")")
    return "\n".join(lines)


def measure(path: Path, caching: bool, freeze: bool, is_async: bool, repeats: int) -> dict[str, float]:
    llm = make_llm(str(path), caching, is_async)
    if freeze:  # as `ember serve` does (engine.core.freeze_gc_heap, inlined so older trees run too)
        gc.collect()
        gc.freeze()
    run_once(llm, seed=0)  # warm-up
    result = mean_runs([run_once(llm, seed=1 + i) for i in range(repeats)])
    gc.unfreeze()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--device-ms", type=float, nargs="*", default=[0.5, 1.27, 10.4],
                    help="simulated device ms per step for the step-time table (none: skip it)")
    ap.add_argument("--device-repeats", type=int, default=3)
    ap.add_argument("--serial-only", action="store_true", help="only the serial engine (trees before async)")
    ap.add_argument("--profile", action="store_true", help="print cProfile's top functions of one run")
    ap.add_argument("--out", default=None, help="write the table to this file")
    args = ap.parse_args()
    from ember.demo import dummy_model_dir

    with_tokenizer, model_dir = dummy_model_dir(SHAPE, tokenizer=True), dummy_model_dir(SHAPE)
    rows = [("prefix-cache off", model_dir, False, False), ("prefix-cache on", model_dir, True, False),
            ("on, detokenize", with_tokenizer, True, False), ("on, gc frozen", model_dir, True, True)]
    modes = {"serial": False} if args.serial_only else {"serial": False, "async": True}
    results = {(name, mode): measure(path, caching, freeze, is_async, args.repeats)
               for name, path, caching, freeze in rows for mode, is_async in modes.items()}
    text = (f"CPU: {platform.machine()}, {platform.processor() or '?'}, python {sys.version.split()[0]}, "
            f"{SHAPE} config, batch {BATCH}, prompt {PROMPT_LEN}, output {OUTPUT_LEN}, {args.repeats} runs\n"
            + table(results))
    if args.device_ms and not args.serial_only:
        by_device = {}
        for device_ms in args.device_ms:
            StubRunner.device_ms = device_ms
            by_device[device_ms] = {mode: measure(model_dir, True, True, is_async, args.device_repeats)
                                    for mode, is_async in modes.items()}
        StubRunner.device_ms = 0.0
        host = {mode: results[("on, gc frozen", mode)] for mode in modes}
        text += f"\n\n{args.device_repeats} runs per device time\n" + device_table(by_device, host)
    print(text)
    if args.profile:
        prof = cProfile.Profile()
        run_once(make_llm(str(model_dir), True, not args.serial_only), 0, prof)
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
        print(buf.getvalue())
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
