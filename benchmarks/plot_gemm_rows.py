"""Plots what a padded CUDA graph costs: qwen3-8b's four projections of a layer (qkv, o, gate/up, down; cuBLAS, the
weights as checkpoints store them) by row count, from the committed results of benchmarks/weight_layout.py
(NOTES-gpu.md v23, one H200), with the step sizes a batch is padded to before and after v23 marked: the time a
step spends on rows it pads up to.

    python benchmarks/plot_gemm_rows.py [--out benchmarks/results/2026-12-06-h200-v23-gemm-rows.png]
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
SOURCE = RESULTS / "2026-12-06-h200-v23-gemm-rows.json"
OLD_SIZES = (128, 192, 256, 384, 512, 768)  # decode batches to 256, then mixed-step token counts
NEW_SIZES = (128, 144, 160, 176, 192, 208, 224, 240, 256, 320, 384, 448, 512, 640, 768)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS / "2026-12-06-h200-v23-gemm-rows.png"))
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_layer: dict[int, float] = defaultdict(float)
    for r in json.loads(SOURCE.read_text())["rows"]:
        if r["proj"] != "lm_head":
            per_layer[r["m"]] += r["tn_us"]
    rows = sorted(per_layer)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(rows, [per_layer[m] for m in rows], marker="o", color="C0", label="qkv + o + gate/up + down, measured")
    for sizes, color, label in ((OLD_SIZES, "C3", "graph sizes before v23"), (NEW_SIZES, "C2", "graph sizes in v23")):
        for i, m in enumerate(s for s in sizes if rows[0] <= s <= rows[-1]):
            ax.axvline(m, color=color, alpha=0.35, ls="--" if color == "C3" else ":", label=label if i == 0 else None)
    ax.set(xlabel="rows (sequences of a decode step, tokens of a mixed step)", ylabel="us per layer (H200)",
           title="qwen3-8b: a layer's GEMMs by rows, and where a step is padded to")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(args.out)


if __name__ == "__main__":
    main()
