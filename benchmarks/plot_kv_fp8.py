"""Plots the fp8 KV cache's measurements of 2026-12-06 (benchmarks/NOTES-gpu.md, v19; one H100 per call) from
the committed results: decode attention per layer over a bf16 pool and over an fp8 pool (dots in bf16, then in
fp16), and qwen3-8b's 256-sequence end-to-end throughput with each pool against the issue's 20,000 tok/s.

    python benchmarks/plot_kv_fp8.py [--out benchmarks/results/2026-12-06-h100-fp8-kv.png]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from plot_panels import attention_bars, runs_against_target  # noqa: E402

RESULTS = Path(__file__).parent / "results"
CASES = ["256x256", "256x128", "64x2048"]


def attention_us() -> dict[str, dict[str, float]]:
    """series -> case -> us per layer: the bf16 pool and fp8 with bf16 dots from v19a's JSON, both fp8 kernels of
    v19b's A/B (one call) from its text."""
    series: dict[str, dict[str, float]] = {"bf16 pool": {}}
    for row in json.loads((RESULTS / "2026-12-06-h100-attention-v19a-bf16.json").read_text())["rows"]:
        series["bf16 pool"][f"{row['batch']}x{row['ctx']}"] = row["us"]
    name = None
    for line in (RESULTS / "2026-12-06-h100-attention-v19b-fp16-dots-ab.txt").read_text().splitlines():
        if line.startswith("=="):
            name = "fp8 pool, bf16 dots" if "bf16 dots" in line else "fp8 pool, fp16 dots"
            series[name] = {}
        elif m := re.match(r"B= *(\d+) C= *(\d+) NHD: *([\d.]+) us", line):
            series[name][f"{m[1]}x{m[2]}"] = float(m[3])
    return series


def e2e() -> dict[str, list[float]]:
    """kv_cache_dtype -> the 256-sequence e2e tok/s of every run (final code for fp8: v19b)."""
    runs = {"bf16 KV": ["v19a-8b-auto-1", "v19a-8b-auto-2", "v19b-8b-auto"],
            "fp8 KV, bf16 dots": ["v19a-8b-fp8-1", "v19a-8b-fp8-2"], "fp8 KV, fp16 dots": ["v19b-8b-fp8"]}
    out = {}
    for label, names in runs.items():
        out[label] = [r["e2e_tok_s"] for n in names
                      for r in json.loads((RESULTS / f"2026-12-06-h100-gpu_decode-{n}.json").read_text())["rows"]
                      if r.get("batch") == 256]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS / "2026-12-06-h100-fp8-kv.png"))
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    series = attention_us()
    attention_bars(a, series, CASES, [f"C{i}" for i in range(len(series))], [1.0] * len(series),
                   "us per layer (qwen3-8b heads)", "decode attention, H100")
    runs = e2e()
    runs_against_target(b, runs, [f"C{i}" for i in range(len(runs))], [0.3] * len(runs), (17000, 21000),
                        "output tok/s incl. prefill", "qwen3-8b, 256 x 128 -> 256, H100")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
