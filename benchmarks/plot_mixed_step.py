"""Plots a hybrid's mixed step (qwen3_5-default: k running sequences' decode tokens and one new prompt, the step every
running sequence waits on while a request is admitted) from the committed results of benchmarks/mixed_step.py
(NOTES-gpu.md v22, one H100 in one call): graphed ms by k, session 27's code (each decode row a 64-token chunk)
against session 28's (decode rows through the recurrent kernel), with the eager step and 256 graph slots.

    python benchmarks/plot_mixed_step.py [--out benchmarks/results/2026-12-06-h100-v22-mixed.png]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
RUNS = {"v21 graphed (decode rows as chunks)": ("2026-12-06-h100-v22-mixed-old.json", "graphed_ms"),
        "v22 graphed, 64 slots": ("2026-12-06-h100-v22-mixed-new.json", "graphed_ms"),
        "v22 graphed, 256 slots": ("2026-12-06-h100-v22-mixed-256.json", "graphed_ms"),
        "v22 eager": ("2026-12-06-h100-v22-mixed-new.json", "eager_ms")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS / "2026-12-06-h100-v22-mixed.png"))
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lens = (128, 512)
    fig, axes = plt.subplots(1, len(lens), figsize=(10, 4), sharey=True)
    for ax, n in zip(axes, lens):
        for i, (label, (name, key)) in enumerate(RUNS.items()):
            rows = [r for r in json.loads((RESULTS / name).read_text()) if r["prompt_len"] == n and r[key]]
            if rows:
                ax.plot([r["decodes"] for r in rows], [r[key] for r in rows], marker="o", label=label, color=f"C{i}",
                        ls="--" if "eager" in label else "-")
        ax.set(title=f"qwen3_5-default, {n}-token prompt", xlabel="running sequences' decode tokens in the step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mixed step, ms (H100)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
