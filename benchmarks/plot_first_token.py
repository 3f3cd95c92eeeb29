"""Plots the time to the first token at batch 1 before and after the mixed-step CUDA graphs (benchmarks/NOTES-gpu.md,
v20 for qwen3-0.6b / qwen3-8b, v21 for qwen3_5-default; each pair from one H100 in one call) from the committed
results of benchmarks/first_token.py: per shape, the wall time of generate(max_tokens=1) by prompt length, eager
prefill steps against graphed ones, with the device time of the graphed step.

    python benchmarks/plot_first_token.py [--out benchmarks/results/2026-12-06-h100-first-token.png]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
# label: the result files it is read from (shapes from one or the other)
RUNS = {"eager prefill": ["2026-12-06-h100-first_token-v20b-old.json",
                          "2026-12-06-h100-first_token-v21-qwen3_5-eager.json"],
        "mixed-step graphs": ["2026-12-06-h100-first_token-v20b-new.json",
                              "2026-12-06-h100-first_token-v21-qwen3_5-graphs.json"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS / "2026-12-06-h100-first-token.png"))
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {label: [r for name in names for r in json.loads((RESULTS / name).read_text())]
            for label, names in RUNS.items()}
    shapes = list(dict.fromkeys(r["shape"] for rows in runs.values() for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4))
    for ax, shape in zip(axes, shapes):
        width = 0.8 / len(runs)
        for i, (label, rows) in enumerate(runs.items()):
            rows = [r for r in rows if r["shape"] == shape]
            xs = [j + i * width for j in range(len(rows))]
            ax.bar(xs, [r["ttft_ms"] for r in rows], width, label=f"{label}: wall", color=f"C{i}")
            if i == len(runs) - 1:
                ax.scatter(xs, [r["device_ms"] for r in rows], color="k", marker="_", s=200, zorder=3,
                           label=f"{label}: device")
        lens = [r["prompt_len"] for r in runs[next(iter(runs))] if r["shape"] == shape]
        ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(lens))], [f"{n} tokens" for n in lens])
        ax.set_ylabel("ms to the first token (batch 1)")
        ax.set_title(f"{shape}, H100")
        ax.margins(y=0.3)  # room for the legend above the bars
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
