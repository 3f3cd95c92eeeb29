"""Plots the GPU targets of issue 4 across the measured versions (benchmarks/NOTES-gpu.md), from the committed
results: one panel per target with its threshold line.

    python benchmarks/plot_versions.py [--out benchmarks/results/2026-12-03-h200-versions.png]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
VERSIONS = [  # label, results file (JSON written by gpu_decode.py)
    ("v1", "2026-12-02-h200-gpu_decode.json"), ("v3", "2026-12-02-h200-gpu_decode-nodetok.json"),
    ("v4", "2026-12-03-h200-gpu_decode-v4b.json"), ("v5", "2026-12-03-h200-gpu_decode-v5.json"),
    ("v5b", "2026-12-03-h200-gpu_decode-v5b.json"), ("v6", "2026-12-03-h200-gpu_decode-v6.json"),
    ("v7", "2026-12-03-h200-gpu_decode-v7.json"), ("v8\n206 ms GC", "2026-12-03-h200-gpu_decode-v8.json"),
    ("v9", ("2026-12-03-h200-gpu_decode-v9.json", "2026-12-03-h200-gpu_decode-v9-b1.json")),
    ("v10", "2026-12-03-h200-gpu_decode-v10.json"), ("v11", "2026-12-03-h200-gpu_decode-v11.json"),
    ("v12", "2026-12-03-h200-gpu_decode-v12.json"),
]
TARGETS = [  # title, shape, batch, metric, threshold
    ("qwen3-8b, batch 1: decode tok/s", "qwen3-8b", 1, "decode_tok_s", 215),
    ("qwen3-0.6b, batch 1: decode tok/s", "qwen3-0.6b", 1, "decode_tok_s", 1200),
    ("qwen3-8b, 256 sequences: tok/s incl. prefill", "qwen3-8b", 256, "e2e_tok_s", 20000),
    ("qwen3-8b, 8k-token prefill: % of matmul peak", "qwen3-8b", "prefill", "pct_matmul_peak", 50),
]


def value(rows: list[dict], shape: str, batch: int, metric: str) -> float | None:
    for r in rows:
        if r.get("engine") != "ember" or r.get("shape") != shape or metric not in r:
            continue
        if batch == "prefill" and r.get("kind") == "prefill" and r.get("prefill_tokens") == 8192:
            return r[metric]
        if r.get("batch") == batch and r.get("prompt_len") == 128:
            return r[metric]
    return None


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS / "2026-12-03-h200-versions.png"))
    args = ap.parse_args()
    data = {}
    for label, names in VERSIONS:
        data[label] = []
        for name in (names,) if isinstance(names, str) else names:
            d = json.loads((RESULTS / name).read_text())
            data[label] += d["rows"] if isinstance(d, dict) else d
    fig, axes = plt.subplots(1, len(TARGETS), figsize=(4.6 * len(TARGETS), 3.6))
    for ax, (title, shape, batch, metric, threshold) in zip(axes, TARGETS):
        labels = [label for label, _ in VERSIONS if value(data[label], shape, batch, metric) is not None]
        values = [value(data[label], shape, batch, metric) for label in labels]
        bars = ax.bar(labels, values, color=["tab:green" if v >= threshold else "tab:blue" for v in values])
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=7)
        ax.axhline(threshold, color="tab:red", linestyle="--", label=f"target {threshold:,}")
        ax.set_ylim(0, 1.12 * max(values + [threshold]))
        ax.set_title(title, fontsize=10)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle("ember on one H200 (benchmarks/gpu_decode.py, random bf16 weights, prompt 128, 256 tokens out)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
