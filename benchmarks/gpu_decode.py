"""ember on one GPU against the bandwidth roofline and transformers `generate`, in one process.

Measures the device's copy bandwidth and bf16 matmul rate, then for each model shape (random weights, bf16):
ember decode through the real engine (scheduler, paged KV, CUDA graphs) at batch 1/8/64/256 for prompt 128 and
2048 with 256 output tokens; the device time of one captured decode step; an 8k-token prefill; and transformers
`generate` (eager, its default attention) at batch 1 and 64, prompt 128. Prints a table, writes JSON.

    python benchmarks/gpu_decode.py [--shapes qwen3-0.6b,qwen3-8b,llama-3-8b] [--out benchmarks/results/NAME]
    hybrid shapes (Gated DeltaNet state slots; sliding + full KV groups), CUDA graphs and Triton kernels too:
    --shapes qwen3_5-default,gemma4-default

Roofline: weight bytes (all parameters) / measured copy bandwidth per step, as the issue defines it; the
"w+kv" column adds the KV bytes a step must read at the mean context length (in the pool's dtype:
--kv-cache-dtype fp8 halves them) and, for hybrids, the recurrent
state each sequence reads and writes back every step (--ssm-state-dtype bfloat16 halves its matrix). "read" is
"w+kv" without the tables a step only gathers rows of (an untied input embedding, Gemma 4's 4 GB of per-layer
input embeddings): the bytes a step streams, where "w" can pass 100%.

Each decode row also records the SM clock and board power over its run (`clocks`: nvidia-smi sampled every 50 ms,
where it exists): H200s differ in the clock the 700 W cap allows under sustained load, and with it in tok/s.
"""
from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import subprocess
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import torch

OUTPUT_LEN = 256
HF_OUTPUT_LEN = 64  # transformers is slow; its tok/s is measured over fewer tokens


def device_time_ms(fn, warmup: int = 3, iters: int = 10) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth() -> float:
    """bytes read + written per second of a 4 GiB device-to-device copy."""
    src = torch.randn(2**31 // 2, device="cuda", dtype=torch.bfloat16).view(torch.int16)
    dst = torch.empty_like(src)
    ms = device_time_ms(lambda: dst.copy_(src))
    nbytes = 2 * src.numel() * src.element_size()
    del src, dst
    return nbytes / ms * 1e3


def matmul_tflops(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = device_time_ms(lambda: a @ b)
    return 2 * n**3 / ms * 1e-9


def make_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab - 10, (batch, length), generator=g).tolist()


class ClockSampler:
    """The GPU's SM clock (MHz) and board power (W) from `nvidia-smi --loop-ms` while the `with` block runs;
    summary(t0, t1) keeps this process's GPU's samples between two time.time() stamps, None where nvidia-smi is
    missing or gave none in that window."""

    def __init__(self, interval_ms: int = 50) -> None:
        self.interval_ms, self.proc, self.text = interval_ms, None, ""

    def __enter__(self) -> "ClockSampler":
        exe = shutil.which("nvidia-smi")
        if exe is not None:
            try:
                self.proc = subprocess.Popen(
                    [exe, "--query-gpu=timestamp,uuid,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                     f"--loop-ms={self.interval_ms}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:  # the measurement goes on without clocks
                self.proc = None
            else:
                time.sleep(0.3)  # its first sample comes ~0.1 s after it starts
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.text = self.proc.communicate(timeout=5)[0]
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.text = self.proc.communicate()[0]

    def summary(self, t0: float, t1: float) -> dict | None:
        if not self.text:
            return None
        try:
            uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        except Exception:  # an older torch without .uuid: summarize_clocks then needs a single GPU's lines
            uuid = None
        return summarize_clocks(self.text, t0, t1, uuid)


def _uuid_key(uuid: str) -> str:
    uuid = uuid.strip().lower()
    return uuid[4:] if uuid.startswith("gpu-") else uuid


def summarize_clocks(text: str, t0: float, t1: float, uuid: str | None = None) -> dict | None:
    """Median / min SM clock and median / max power over nvidia-smi lines "YYYY/MM/DD HH:MM:SS.fff, uuid, MHz, W"
    stamped between t0 and t1 (time.time(); nvidia-smi prints local time), of the GPU `uuid` (None: the lines must
    all be of one GPU); malformed lines are skipped."""
    samples = []
    for line in text.splitlines():
        try:
            stamp, gpu, clock, power = (x.strip() for x in line.split(","))
            when = datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((when, _uuid_key(gpu), float(clock), float(power)))
        except ValueError:
            continue
    gpus = {gpu for _, gpu, _, _ in samples}
    want = _uuid_key(uuid) if uuid else (gpus.pop() if len(gpus) == 1 else None)
    kept = [(mhz, w) for when, gpu, mhz, w in samples if gpu == want and t0 <= when <= t1]
    if not kept:
        return None
    mhz, watts = zip(*kept)
    return dict(sm_mhz_median=statistics.median(mhz), sm_mhz_min=min(mhz), power_w_median=statistics.median(watts),
                power_w_max=max(watts), samples=len(kept))


class StepTimer:
    """Wraps EngineCore.step: wall time of each step and whether the runner saw a decode-only batch (the batch
    launched in that step; with async scheduling the step waits on the one before, of the same kind when steady)."""

    def __init__(self, engine) -> None:
        self.engine, self.steps, self.graph_events, self.launch_events = engine, [], [], []
        self._step, self._launch = engine.step, engine.runner.launch
        engine.runner.launch = self._run
        engine.step = self._timed_step
        self.graphs = engine.runner.graphs
        if self.graphs is not None:
            self._graph_run = self.graphs.run
            self.graphs.run = self._timed_graph_run

    def _timed_graph_run(self, seqs):
        # device time of the input copies + replay, from events: no sync inside the step
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        logits = self._graph_run(seqs)
        end.record()
        self.graph_events.append((len(seqs), start, end))
        return logits

    def graph_ms(self, batch: int) -> float | None:
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for n, s, e in self.graph_events if n == batch]
        return statistics.median(times) if times else None

    def _run(self, out):
        self._kind = ("decode", len(out.seqs)) if all(len(s.token_ids) == 1 for s in out.seqs) else ("mixed", 0)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        handle = self._launch(out)
        end.record()
        self.launch_events.append((self._kind[0], sum(len(s.token_ids) for s in out.seqs), start, end))
        return handle

    def timeline(self, run_start: torch.cuda.Event, run_end: torch.cuda.Event) -> dict:
        """Device time of the run by step kind, and the idle time between steps (the device waiting on the host)."""
        torch.cuda.synchronize()
        ev = self.launch_events
        busy = {"mixed": 0.0, "decode": 0.0}
        gaps = []
        for i, (kind, tokens, start, end) in enumerate(ev):
            busy[kind] += start.elapsed_time(end)
            prev = ev[i - 1][3] if i else run_start
            gaps.append((prev.elapsed_time(start), i, kind, tokens))
        tail = ev[-1][3].elapsed_time(run_end) if ev else 0.0
        worst = sorted(gaps, reverse=True)[:5]
        return dict(device_ms=run_start.elapsed_time(run_end), mixed_ms=busy["mixed"], decode_ms=busy["decode"],
                    num_mixed=sum(k == "mixed" for k, *_ in ev), idle_ms=sum(g for g, *_ in gaps) + tail,
                    first_idle_ms=gaps[0][0] if gaps else 0.0, tail_ms=tail,
                    worst_idle=[dict(ms=round(g, 2), step=i, kind=k, tokens=t) for g, i, k, t in worst])

    def _timed_step(self):
        self._kind = ("none", 0)  # a step that only finishes the one in flight launches nothing
        start = time.perf_counter()
        deltas = self._step()
        self.steps.append((*self._kind, time.perf_counter() - start))
        return deltas

    def close(self) -> None:
        self.engine.step, self.engine.runner.launch = self._step, self._launch
        if self.graphs is not None:
            self.graphs.run = self._graph_run


def bench_ember_decode(llm, batch: int, prompt_len: int, vocab: int, gc_heaps: bool = False) -> dict:
    from ember import SamplingParams

    params = SamplingParams(max_tokens=OUTPUT_LEN, temperature=0, ignore_eos=True)
    prompts = make_prompts(batch, prompt_len, vocab, seed=batch * 7 + prompt_len)
    timer = StepTimer(llm.engine)
    collections = []  # Python garbage collections during the run: (generation, ms)
    gen2_heaps = []  # what a full collection walks: object count, the most common types, the freeze count

    def on_gc(phase, info, t=[0.0]):
        if phase == "start":
            # what a full collection walks, listed before its clock starts; the listing stalls the host too (it cost a
            # v9/v10 run 13.6 ms of device idle), hence opt-in
            if gc_heaps and info["generation"] == 2:
                objs = gc.get_objects(2)
                gen2_heaps.append(dict(objects=len(objs), frozen=gc.get_freeze_count(),
                                       top=Counter(type(o).__name__ for o in objs).most_common(8)))
                del objs
            t[0] = time.perf_counter()
        else:
            collections.append((info["generation"], 1e3 * (time.perf_counter() - t[0])))

    gc.callbacks.append(on_gc)
    run_start, run_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with ClockSampler() as clocks:
        torch.cuda.synchronize()
        wall_start, start = time.time(), time.perf_counter()
        run_start.record()
        outs = llm.generate(prompts, params)
        run_end.record()
        total = time.perf_counter() - start
        wall_end = time.time()
    graph_ms = timer.graph_ms(batch)
    gc.callbacks.remove(on_gc)
    timeline = timer.timeline(run_start, run_end)
    timeline["gc"] = {f"gen{g}": dict(count=sum(x == g for x, _ in collections),
                                      ms=round(sum(ms for x, ms in collections if x == g), 2)) for g in (0, 1, 2)}
    timeline["gc"]["gen2_heaps"] = gen2_heaps
    timer.close()
    assert all(len(o.outputs[0].token_ids) == OUTPUT_LEN for o in outs)
    # full decode steps; with async scheduling a step's wall time includes waiting on the step before, so the
    # first one after a mixed step (all of a one-step prefill: 730 ms) is left out
    full = [(n, t) for (kind, n, t), (prev, _, _) in zip(timer.steps[1:], timer.steps)
            if kind == "decode" and n == batch and prev == "decode"]
    decode_tok_s = sum(n for n, _ in full) / sum(t for _, t in full) if full else float("nan")
    return dict(e2e_tok_s=batch * OUTPUT_LEN / total, decode_tok_s=decode_tok_s, total_s=total,
                num_decode_steps=len(full), step_ms_median=1e3 * statistics.median(t for _, t in full) if full else None,
                graph_step_ms=graph_ms, timeline=timeline, clocks=clocks.summary(wall_start, wall_end))


def profile_graph_step(llm, batch: int, log) -> None:
    """Per-kernel device time of one captured decode step (CUPTI sees the kernels inside graph replays)."""
    graphs = llm.engine.runner.graphs
    if graphs is None or batch not in graphs.graphs:
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            graphs.graphs[batch].replay()
        torch.cuda.synchronize()
    # a burst of 5 replays against 300 back to back: sustained load may lower the clocks (power limit)
    for count in (5, 300):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(count):
            graphs.graphs[batch].replay()
        end.record()
        torch.cuda.synchronize()
        log(f"batch {batch}: {count} replays back to back, {start.elapsed_time(end) / count:.3f} ms each")
    log(f"profile of 5 replays, batch {batch}:\n"
        + prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=70))


def profile_host(llm, batch: int, vocab: int, log) -> None:
    """Python time of a short decode run at this batch (cProfile, top functions by own time)."""
    import cProfile
    import io
    import pstats

    from ember import SamplingParams

    prompts = make_prompts(batch, 128, vocab, seed=5)
    prof = cProfile.Profile()
    prof.enable()
    llm.generate(prompts, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    log(f"host profile, batch {batch}, 32 steps:\n" + text.getvalue())


def profile_run(llm, batch: int, vocab: int, log) -> None:
    """Per-kernel device time over one real run at this batch (prompt 128, 256 output tokens): the kernels the
    scheduler's steps launch at their real context lengths and at the clocks the sustained load allows."""
    from torch.profiler import ProfilerActivity, profile

    from ember import SamplingParams

    params = SamplingParams(max_tokens=OUTPUT_LEN, temperature=0, ignore_eos=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(make_prompts(batch, 128, vocab, seed=11), params)
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e3
    log(f"real run, batch {batch}: {wall * 1e3:.0f} ms wall (profiled), {busy:.0f} ms of kernels\n"
        + events.table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))


def bench_prefill(llm, prompt_len: int, vocab: int) -> dict:
    from ember import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    llm.generate(make_prompts(1, prompt_len, vocab, seed=1), params)  # warm-up: kernel compiles at this shape
    times = []
    for i in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        llm.generate(make_prompts(1, prompt_len, vocab, seed=2 + i), params)
        times.append(time.perf_counter() - start)
    t = statistics.median(times)
    return dict(prefill_tokens=prompt_len, prefill_s=t, prefill_tok_s=prompt_len / t)


def prefill_flops(cfg: dict, num_params_body: int, n: int, last_mlp_params: int = 0) -> float:
    """Matmul FLOPs of the body for n tokens + causal attention + one row of logits, less the last layer's MLP
    for the n - 1 rows nothing samples from (the engine skips it: out_rows in ember/layers/decoder.py). Hybrid
    configs count attention for their full-attention layers only (linear-attention layers are linear in n; sliding
    layers are left out, so their % of peak is a lower bound)."""
    types = cfg.get("layer_types") or ["full_attention"] * cfg["num_hidden_layers"]
    num_full = sum(t == "full_attention" for t in types)
    attn = 2 * n * n * cfg["num_attention_heads"] * cfg["head_dim"] * num_full  # QK^T + PV, causal
    skipped = 2 * last_mlp_params * (n - 1)
    return 2 * num_params_body * n - skipped + attn + 2 * cfg["hidden_size"] * cfg["vocab_size"]


def model_sizes(model) -> tuple[int, int, int]:
    """(bytes of all weights, parameters outside embedding / lm_head, bytes a decode step reads in full): the last
    leaves out the tables a step only gathers rows of, the input embedding (unless it is also the LM head) and
    Gemma 4's per-layer input embeddings."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    body = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name and "lm_head" not in name)
    tied = getattr(model, "lm_head", None) is None
    gathered = sum(p.numel() * p.element_size() for name, p in model.named_parameters()
                   if "embed_tokens" in name and not (tied and name.endswith("model.embed_tokens.weight")))
    return total, body, total - gathered


def bench_transformers(model_dir: str, batch: int, prompt_len: int, vocab: int) -> float:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(model_dir)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.tensor(make_prompts(batch, prompt_len, vocab, seed=3), device="cuda")
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    model.generate(ids[:, :16], max_new_tokens=4, **kw)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(ids, min_new_tokens=HF_OUTPUT_LEN, max_new_tokens=HF_OUTPUT_LEN, **kw)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    assert out.shape[1] == prompt_len + HF_OUTPUT_LEN
    del model
    return batch * HF_OUTPUT_LEN / elapsed


def free_memory() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def bench_shape(shape: str, args, ceil: dict, log) -> list[dict]:
    from ember import LLM
    from ember.demo import SHAPES, dummy_model_dir

    cfg = SHAPES[shape]
    vocab = cfg["vocab_size"]
    model_dir = str(dummy_model_dir(shape))  # no tokenizer: token ids in and out
    max_model_len = min(cfg["max_position_embeddings"], args.prefill_len + 256)
    prompt_lens = [int(x) for x in args.prompt_lens.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    from ember.cli.info import model_summary

    info = model_summary(model_dir, "bfloat16", kv_cache_dtype=args.kv_cache_dtype)
    # every attention layer at full length: exact for full attention, an upper bound for sliding layers
    kv_per_token = sum(info["kv_bytes_per_token_by_kind"].values())
    tokens = max(max(batches) * (max(prompt_lens) + OUTPUT_LEN), args.prefill_len + 16)
    kv_gb = 1.1 * tokens * kv_per_token / 2**30
    if info["state_bytes_per_sequence"] or info["sliding_kv_bytes_per_sequence"]:
        kv_gb = None  # hybrids: fixed per-request state and windows on top; size from free memory instead
    t0 = time.perf_counter()
    llm = LLM(model_dir, load_format="dummy", dtype="bfloat16", max_model_len=max_model_len, kv_cache_gb=kv_gb,
              max_num_seqs=max(batches),
              max_num_batched_tokens=args.max_batched_tokens and max(args.max_batched_tokens, args.prefill_len),
              enable_prefix_caching=False, progress=False, async_scheduling=not args.serial,
              ssm_state_dtype=args.ssm_state_dtype, kv_cache_dtype=args.kv_cache_dtype)
    log(f"{shape}: loaded + captured in {time.perf_counter() - t0:.1f}s, "
        f"max_num_batched_tokens {llm.engine.sched_cfg.max_num_batched_tokens}")
    from ember import SamplingParams  # warm-up: the prefill kernels compile on first use, outside the timings
    llm.generate(make_prompts(8, 64, vocab, seed=0), SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    weight_bytes, body_params, read_bytes = model_sizes(llm.engine.runner.model)
    from ember.kv.spec import state_bytes_per_slot
    runner = llm.engine.runner
    state_per_seq = state_bytes_per_slot(runner.cache_specs, runner.dtype)  # read and written once per step
    rows = []
    for prompt_len in prompt_lens:
        for batch in batches:
            r = dict(shape=shape, engine="ember", batch=batch, prompt_len=prompt_len, output_len=OUTPUT_LEN,
                     max_num_batched_tokens=llm.engine.sched_cfg.max_num_batched_tokens)
            try:
                r.update(bench_ember_decode(llm, batch, prompt_len, vocab, args.gc_heaps))
            except Exception as e:  # keep measuring the rest; the error is reported in the table
                r["error"] = repr(e)
            kv_bytes = batch * (prompt_len + OUTPUT_LEN / 2) * kv_per_token + batch * 2 * state_per_seq
            r["roofline_tok_s"] = batch * ceil["bandwidth"] / weight_bytes
            r["roofline_wkv_tok_s"] = batch * ceil["bandwidth"] / (weight_bytes + kv_bytes)
            r["roofline_read_tok_s"] = batch * ceil["bandwidth"] / (read_bytes + kv_bytes)
            rows.append(r)
            log(json.dumps(r))
    if args.profile:
        for batch in (1, max(batches)):
            profile_graph_step(llm, batch, log)
        profile_host(llm, max(batches), vocab, log)
    if args.profile_run:
        profile_run(llm, max(batches), vocab, log)
    try:
        p = bench_prefill(llm, min(args.prefill_len, max_model_len - 1), vocab)
        last_mlp = sum(t.numel() for t in runner.model.model.layers[-1].mlp.parameters())
        flops = prefill_flops(cfg, body_params, p["prefill_tokens"], last_mlp)
        p.update(shape=shape, engine="ember", kind="prefill", tflops=flops / p["prefill_s"] * 1e-12)
        p["pct_matmul_peak"] = 100 * p["tflops"] / ceil["matmul_tflops"]
        rows.append(p)
        log(json.dumps(p))
    except Exception as e:
        rows.append(dict(shape=shape, engine="ember", kind="prefill", error=repr(e)))
    del llm
    free_memory()
    if not args.skip_hf:
        for batch in (1, 64):
            r = dict(shape=shape, engine="transformers", batch=batch, prompt_len=128, output_len=HF_OUTPUT_LEN)
            try:
                r["e2e_tok_s"] = bench_transformers(model_dir, batch, 128, vocab)
            except Exception as e:
                r["error"] = repr(e)
            free_memory()
            rows.append(r)
            log(json.dumps(r))
    for r in rows:
        r["weight_gb"] = weight_bytes / 1e9
    return rows


def table(rows: list[dict], ceil: dict) -> str:
    hf = {(r["shape"], r["batch"]): r.get("e2e_tok_s") for r in rows if r.get("engine") == "transformers"}
    lines = [f"device: {ceil['device']}  copy bandwidth {ceil['bandwidth'] / 1e12:.2f} TB/s  "
             f"bf16 matmul {ceil['matmul_tflops']:.0f} TFLOP/s",
             f"{'shape':<11} {'batch':>5} {'prompt':>6} {'e2e tok/s':>10} {'decode tok/s':>12} {'step ms':>8} "
             f"{'graph ms':>8} {'%roof(w)':>8} {'%roof(w+kv)':>11} {'%roof(read)':>10} {'x HF':>6} {'SM MHz':>6}"]
    for r in rows:
        if r.get("kind") == "prefill":
            if "error" in r:
                lines.append(f"{r['shape']:<11} prefill ERROR {r['error'][:90]}")
            else:
                lines.append(f"{r['shape']:<11} prefill {r['prefill_tokens']} tokens: {r['prefill_tok_s']:,.0f} tok/s, "
                             f"{r['tflops']:.0f} TFLOP/s = {r['pct_matmul_peak']:.0f}% of the measured matmul peak")
            continue
        if "error" in r:
            lines.append(f"{r['shape']:<11} {r['batch']:>5} {r['prompt_len']:>6} {r['engine']} ERROR {r['error'][:80]}")
            continue
        if r["engine"] == "transformers":
            lines.append(f"{r['shape']:<11} {r['batch']:>5} {r['prompt_len']:>6} {r['e2e_tok_s']:>10,.1f}  (transformers)")
            continue
        ref = hf.get((r["shape"], r["batch"])) if r["prompt_len"] == 128 else None
        g = r.get("graph_step_ms")
        read = 100 * r["decode_tok_s"] / r["roofline_read_tok_s"] if "roofline_read_tok_s" in r else float("nan")
        lines.append(
            f"{r['shape']:<11} {r['batch']:>5} {r['prompt_len']:>6} {r['e2e_tok_s']:>10,.0f} {r['decode_tok_s']:>12,.0f} "
            f"{r['step_ms_median'] or float('nan'):>8.2f} {g if g is not None else float('nan'):>8.2f} "
            f"{100 * r['decode_tok_s'] / r['roofline_tok_s']:>7.1f}% {100 * r['decode_tok_s'] / r['roofline_wkv_tok_s']:>10.1f}% "
            f"{read:>10.1f}% "
            f"{(r['e2e_tok_s'] / ref) if ref else float('nan'):>6.1f} "
            f"{r['clocks']['sm_mhz_median'] if r.get('clocks') else float('nan'):>6.0f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qwen3-0.6b,qwen3-8b,llama-3-8b")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--prompt-lens", default="128,2048")
    ap.add_argument("--prefill-len", type=int, default=8192)
    ap.add_argument("--max-batched-tokens", type=int, default=None,
                    help="the scheduler's token budget per step, at least --prefill-len (default: the engine's "
                         "for the device, 32768 on an H200)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--ssm-state-dtype", default="float32", help="hybrids' recurrent state matrix dtype")
    ap.add_argument("--kv-cache-dtype", default="auto", help="auto (bf16) or fp8: the KV pool's dtype")
    ap.add_argument("--serial", action="store_true", help="no async scheduling: the host waits for every step")
    ap.add_argument("--profile", action="store_true", help="log per-kernel times of captured decode steps")
    ap.add_argument("--profile-run", action="store_true", help="log per-kernel times over one real run at the largest batch")
    ap.add_argument("--gc-heaps", action="store_true", help="list the objects each full garbage collection walks "
                    "(stalls the host while it lists them)")
    ap.add_argument("--out", default=None, help="path prefix: writes PREFIX.txt and PREFIX.json")
    args = ap.parse_args()
    log_path = Path(args.out + ".log") if args.out else None

    def log(msg: str) -> None:
        print(msg, flush=True)
        if log_path:
            with log_path.open("a") as f:
                f.write(msg + "\n")

    ceil = dict(device=torch.cuda.get_device_name(), bandwidth=copy_bandwidth(), matmul_tflops=matmul_tflops(),
                torch=torch.__version__, kv_cache_dtype=args.kv_cache_dtype)
    log(json.dumps(ceil))
    rows = []
    for shape in args.shapes.split(","):
        try:
            rows += bench_shape(shape, args, ceil, log)
        except Exception as e:  # e.g. out of memory: report it, measure the next shape
            log(f"{shape}: FAILED {e!r}")
        free_memory()
    text = table(rows, ceil)
    print(text)
    if args.out:
        Path(args.out + ".txt").write_text(text + "\n")
        Path(args.out + ".json").write_text(json.dumps(dict(ceilings=ceil, rows=rows), indent=1))


if __name__ == "__main__":
    main()
