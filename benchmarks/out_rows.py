"""One prefill step with and without out_rows (ember/layers/decoder.py), the model's forward alone, in one process.

A step samples from each sequence's last token. With out_rows the last layer runs its MLP and the final norm on the
sampled rows alone, and Gemma 4's trailing KV-shared layers (which write no KV) run on them alone, as a decode
step's queries. This times the forward of one prompt of --tokens tokens both ways (medians of --runs, alternated)
for qwen3-8b and for gemma4-default with its last --shared layers KV-shared (Gemma 3n / Gemma 4's E-models share
the KV of their last layers; the default shape shares none). Random weights (load_format="dummy").

    python benchmarks/out_rows.py [--shapes qwen3-8b,gemma4-default] [--tokens 8192] [--shared 10] [--out PREFIX]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ember import LLM, SamplingParams
from ember.demo import dummy_model_dir
from ember.engine.scheduler import ScheduledSeq, SchedulerOutput


def time_forward(llm: LLM, tokens: int, runs: int, device: torch.device) -> dict:
    runner = llm.engine.runner
    ids = torch.randint(3, 30000, (tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    blocks = list(range(1, -(-tokens // runner.block_size) + 1))
    groups = [blocks for _ in runner.kv_groups[1:]] or None
    seq = ScheduledSeq("x", ids, 0, blocks, True, SamplingParams(), 0, ids, [], [], None, groups)
    inputs = runner._prepare(SchedulerOutput([seq], tokens, []))
    times: dict[str, list[float]] = {"all rows": [], "out_rows": []}

    def forward(rows):
        with torch.inference_mode():
            return runner.model(inputs.input_ids, inputs.positions, inputs.meta, rows)

    for _ in range(2):  # warm-up: kernels compile
        forward(None), forward(inputs.sample_idx)
    for _ in tqdm(range(runs), desc=f"{tokens} tokens", leave=False):
        for name, rows in (("all rows", None), ("out_rows", inputs.sample_idx)):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            forward(rows)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    return dict(all_rows_ms=ms["all rows"], out_rows_ms=ms["out_rows"], speedup=ms["all rows"] / ms["out_rows"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qwen3-8b,gemma4-default")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--shared", type=int, default=10, help="gemma4's trailing KV-shared layers")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None, help="path prefix: writes PREFIX.json")
    args = ap.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    results = []
    for shape in args.shapes.split(","):
        model_dir = dummy_model_dir(shape)
        if shape.startswith("gemma4"):
            cfg_path = Path(model_dir) / "config.json"
            cfg = json.loads(cfg_path.read_text())
            cfg["num_kv_shared_layers"] = args.shared
            cfg_path.write_text(json.dumps(cfg))
        llm = LLM(str(model_dir), load_format="dummy", dtype="bfloat16" if device.type == "cuda" else "float32",
                  device=str(device), max_model_len=args.tokens + 16, kv_cache_gb=4, progress=False,
                  max_num_batched_tokens=args.tokens, max_num_seqs=8)
        r = dict(shape=shape, device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                 tokens=args.tokens, shared=args.shared if shape.startswith("gemma4") else 0,
                 **time_forward(llm, args.tokens, args.runs, device))
        print(json.dumps(r), flush=True)
        results.append(r)
        del llm
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for r in results:
        print(f"{r['shape']:16s} {r['tokens']} tokens ({r['shared']} KV-shared layers): all rows {r['all_rows_ms']:.1f} ms, "
              f"out_rows {r['out_rows_ms']:.1f} ms, {r['speedup']:.3f}x")
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
