"""Plots v28's two measurements (benchmarks/NOTES-gpu.md, v28; one H100): per layer of qwen3-8b, a 256-sequence
decode step as the engine runs it against two half batches in turn and with each half's attention beside the other
half's GEMMs (`attention.py --overlap-cases`); and the decode tile sweep (`attention.py --sweep`), every tile's time
over the default's, bf16 and fp8 pools.

    python benchmarks/plot_overlap.py [--out benchmarks/results/2026-12-07-h100-v28-overlap-sweep.png]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from plot_panels import RESULTS, attention_bars, result_rows  # noqa: E402

PREFIX = "2026-12-07-h100-v28"


def load(name: str) -> list[dict]:
    return result_rows(PREFIX, name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS / f"{PREFIX}-overlap-sweep.png"))
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    rows = {f"{r['batch']}x{r['ctx']}": r for r in load("attention-overlap")}
    cases = list(rows)
    series = {"one batch of 256 (the engine's step)": {c: rows[c]["step_us"] for c in cases},
              "two halves of 128 in turn": {c: rows[c]["half_gemms_us"] + rows[c]["half_attention_us"] for c in cases},
              "  of which the halves' GEMMs": {c: rows[c]["half_gemms_us"] for c in cases},
              "each half's attention beside the other's GEMMs": {c: rows[c]["overlapped_us"] for c in cases}}
    attention_bars(a, series, cases, ["C0", "C1", "C1", "C3"], [1.0, 1.0, 0.4, 1.0],
                   "us per layer (GEMMs + decode attention)", "two-batch overlap, qwen3-8b, H100")
    a.set_ylim(0, 560)  # room for the legend above the bars
    for i, pool in enumerate(("bf16", "fp8")):
        for j, r in enumerate(load(f"attention-sweep-{pool}")):
            ratios = sorted(t["us"] / r["us"] for t in r["sweep"])
            b.plot(range(1, len(ratios) + 1), ratios, marker=".", color=f"C{i}", ls="-" if j == 0 else ":",
                   label=f"{pool}, {r['batch']} seqs x {r['ctx']}")
    b.axhline(1.0, color="k", lw=1, ls="--", label="the default tile (32 keys, 1 warp, 2 stages)")
    b.set_xlabel("tiles, fastest first (of 48: 16-128 keys x 1-8 warps x 2-4 stages)")
    b.set_ylabel("time / the default's")
    b.set_title("decode attention tile sweep, qwen3-8b heads, H100")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
