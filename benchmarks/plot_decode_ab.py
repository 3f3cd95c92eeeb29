"""Plots v26's A/B of the decode kernel (benchmarks/NOTES-gpu.md, v26; one H100, one session): the layer's
attention from its qkv rows (prepare_qkv + the decode kernel, as the engine runs it) with the kernel before
session 30 (c881387) and after it, over bf16 and fp8 pools, plus the fp8 candidate of v24; and qwen3-8b's
256-sequence end-to-end throughput of each, from the committed results.

    python benchmarks/plot_decode_ab.py [--out benchmarks/results/2026-12-07-h100-v26-decode-ab.png]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from plot_panels import RESULTS, attention_bars, runs_against_target, result_rows  # noqa: E402

PREFIX = "2026-12-07-h100-v26"
CASES = ["256x128", "256x256", "256x384", "64x2048"]
ATTENTION = {"bf16, before": ["old-bf16", "old-bf16-2"], "bf16, after": ["new-bf16", "new-bf16-2"],
             "fp8, before": ["old-fp8"], "fp8, after": ["new-fp8"], "fp8, candidate": ["fp8-candidate"]}
E2E = {"bf16\nbefore": "old-bf16", "bf16\nafter": "new-bf16", "fp8\nbefore": "old-fp8", "fp8\nafter": "new-fp8"}


def load(name: str) -> list[dict]:
    return result_rows(PREFIX, name)


def attention_us() -> dict[str, dict[str, float]]:
    """series -> case -> us per layer from the qkv rows, the mean over the series' runs."""
    series = {}
    for label, names in ATTENTION.items():
        runs = [{f"{r['batch']}x{r['ctx']}": r["unfused_us"] for r in load(f"attention-{n}")} for n in names]
        series[label] = {c: sum(run[c] for run in runs) / len(runs) for c in CASES}
    return series


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS / f"{PREFIX}-decode-ab.png"))
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw=dict(width_ratios=[3, 2]))
    series = attention_us()
    attention_bars(a, series, CASES, [f"C{i // 2}" for i in range(len(series))],
                   [0.5 if "before" in name else 1.0 for name in series],
                   "us per layer, from the qkv rows (qwen3-8b heads)",
                   "decode attention, H100: before / after session 30's kernel")
    runs = {label: [r["e2e_tok_s"] for n in (1, 2) for r in load(f"gpu_decode-{name}-{n}") if r.get("batch") == 256]
            for label, name in E2E.items()}
    runs_against_target(b, runs, [f"C{i // 2}" for i in range(len(runs))],
                        [0.25 if "before" in label else 0.5 for label in runs], (17500, 20500),
                        "output tok/s incl. prefill (two runs each)", "qwen3-8b, 256 x 128 -> 256, H100")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
