"""Plots the GPU targets of issue 4 across the measured versions (benchmarks/NOTES-gpu.md), from the committed
results: one panel per target with its threshold line. A version measured more than once (several runs or
machines) shows the median with a whisker from its lowest to its highest run.

    python benchmarks/plot_versions.py [--out benchmarks/results/2026-12-05-h200-versions.png]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
# label, results: a gpu_decode.py JSON file, or several; an A/B file ({"runs": {name: gpu_decode JSON}}) as
# (file, run-name prefixes to take, None for all)
VERSIONS = [
    ("v1", "2026-12-02-h200-gpu_decode.json"), ("v3", "2026-12-02-h200-gpu_decode-nodetok.json"),
    ("v4", "2026-12-03-h200-gpu_decode-v4b.json"), ("v5", "2026-12-03-h200-gpu_decode-v5.json"),
    ("v5b", "2026-12-03-h200-gpu_decode-v5b.json"), ("v6", "2026-12-03-h200-gpu_decode-v6.json"),
    ("v7", "2026-12-03-h200-gpu_decode-v7.json"), ("v8\n206 ms GC", "2026-12-03-h200-gpu_decode-v8.json"),
    ("v9", ("2026-12-03-h200-gpu_decode-v9.json", "2026-12-03-h200-gpu_decode-v9-b1.json")),
    ("v10", "2026-12-03-h200-gpu_decode-v10.json"), ("v11", "2026-12-03-h200-gpu_decode-v11.json"),
    ("v12", "2026-12-03-h200-gpu_decode-v12.json"),
    ("v13", ("2026-12-04-h200-gpu_decode-v13.json", "2026-12-04-h200-gpu_decode-v13-a.json",
             "2026-12-04-h200-gpu_decode-v13-b.json")),
    ("v14\n4 machines", ("2026-12-04-h200-gpu_decode-v14.json", ("2026-12-04-h200-v14b-gpu_decode.json", None),
                         ("2026-12-04-h200-v14a-fused-decode-ab.json", ("8b-def", "06b-def")),
                         ("2026-12-04-h200-v14c-prepare-qkv-ab.json", ("8b-def",)))),
    ("v15\nmachine E", ("2026-12-04-h200-gpu_decode-v15a-1.json", "2026-12-04-h200-gpu_decode-v15a-2.json",
             "2026-12-04-h200-gpu_decode-v15a-3.json", "2026-12-04-h200-gpu_decode-v15f-batch1.json")),
]
TARGETS = [  # title, shape, batch, metric, threshold
    ("qwen3-8b, batch 1: decode tok/s", "qwen3-8b", 1, "decode_tok_s", 215),
    ("qwen3-0.6b, batch 1: decode tok/s", "qwen3-0.6b", 1, "decode_tok_s", 1200),
    ("qwen3-8b, 256 sequences: tok/s incl. prefill", "qwen3-8b", 256, "e2e_tok_s", 20000),
    ("qwen3-8b, 8k-token prefill: % of matmul peak", "qwen3-8b", "prefill", "pct_matmul_peak", 50),
]


def values(rows: list[dict], shape: str, batch: int, metric: str) -> list[float]:
    out = []
    for r in rows:
        if r.get("engine") != "ember" or r.get("shape") != shape or metric not in r:
            continue
        if batch == "prefill" and r.get("kind") == "prefill" and r.get("prefill_tokens") == 8192:
            out.append(r[metric])
        elif r.get("batch") == batch and r.get("prompt_len") == 128:
            out.append(r[metric])
    return out


def load_rows(spec) -> list[dict]:
    specs = (spec,) if isinstance(spec, str) else spec
    rows = []
    for item in specs:
        name, prefixes = (item, None) if isinstance(item, str) else item
        d = json.loads((RESULTS / name).read_text())
        if isinstance(d, dict) and "runs" in d:
            for run, result in d["runs"].items():
                if prefixes is None or run.startswith(tuple(prefixes)):
                    rows += result["rows"]
        else:
            rows += d["rows"] if isinstance(d, dict) else d
    return rows


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS / "2026-12-05-h200-versions.png"))
    args = ap.parse_args()
    data = {label: load_rows(spec) for label, spec in VERSIONS}
    fig, axes = plt.subplots(2, 2, figsize=(14, 8))
    for ax, (title, shape, batch, metric, threshold) in zip(axes.flat, TARGETS):
        labels = [label for label, _ in VERSIONS if values(data[label], shape, batch, metric)]
        runs = [values(data[label], shape, batch, metric) for label in labels]
        mids = [statistics.median(v) for v in runs]
        ax.bar(labels, mids, color=["tab:green" if m >= threshold else "tab:blue" for m in mids])
        for i, (m, v) in enumerate(zip(mids, runs)):
            if len(v) > 1:  # several runs or machines: lowest to highest
                ax.errorbar(i, m, yerr=[[m - min(v)], [max(v) - m]], fmt="none", ecolor="black", capsize=3,
                            linewidth=1)
            ax.annotate(f"{m:,.0f}", (i, max(v)), textcoords="offset points", xytext=(0, 3), ha="center",
                        fontsize=7)
        ax.axhline(threshold, color="tab:red", linestyle="--", label=f"target {threshold:,}")
        ax.set_ylim(0, 1.12 * max([max(v) for v in runs] + [threshold]))
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelsize=7)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle("ember on one H200 (benchmarks/gpu_decode.py, random bf16 weights, prompt 128, 256 tokens out)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
