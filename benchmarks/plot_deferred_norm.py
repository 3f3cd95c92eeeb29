"""Plots v29 (benchmarks/NOTES-gpu.md; one H100): qwen3-8b 256 x 128 -> 256 end to end with the engine's add +
RMSNorm kernels and with the norms deferred past the projections (FlashNorm), alternated in two calls; and where a
256-row decode step's time per layer went in each form, from `gpu_decode.py --profile` (5 graph replays, the
kernels' device time over 36 layers).

    python benchmarks/plot_deferred_norm.py [--out benchmarks/results/2026-12-07-h100-v29-deferred-norm.png]
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from plot_panels import RESULTS, result_rows, runs_against_target  # noqa: E402

PREFIX = "2026-12-07-h100-v29"
LAYERS, REPLAYS = 36, 5
# kernel name (a regex on the profiler's name column) -> what it does in a qwen3-8b layer at 256 rows
KERNELS = [("attention", r"_decode_kernel"), ("gate/up", r"192x128.*coopB"), ("o + down", r"tss_128x128"),
           ("qkv", r"96x128"), ("o + down", r"128x64.*_bz_"), ("o + down", r"badd"),
           ("add + RMSNorm", r"_rms_norm_kernel"), ("SiLU-mul", r"_act_mul_kernel"), ("prepare_qkv", r"_prepare_qkv")]


def layer_us(log: Path) -> dict[str, float]:
    """us per layer of each KERNELS entry in the batch-256 profile of a gpu_decode.py --profile log (calls other
    than once per layer, the LM head's and the final norm's, are left out)."""
    text = log.read_text().split("profile of 5 replays, batch 256:")[1]
    out = {}
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 11 or not cols[-1].isdigit() or int(cols[-1]) < LAYERS * REPLAYS:
            continue
        name, total = " ".join(cols[:-10]), cols[-3]  # CUDA total
        us = float(total[:-2]) * 1e3 if total.endswith("ms") else float(total[:-2])
        for label, pattern in KERNELS:
            if re.search(pattern, name):
                out[label] = out.get(label, 0.0) + us / (LAYERS * REPLAYS)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS / f"{PREFIX}-deferred-norm.png"))
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.4))
    labels = {("A", "off"): "A: add + RMSNorm", ("A", "deferred"): "A: deferred\n(r in 1024-wide steps)",
              ("B", "off"): "B: add + RMSNorm", ("B", "deferred"): "B: deferred\n(r in one load)"}
    runs = {label: [result_rows(PREFIX, f"gpu_decode-{call}-{tag}-{i}")[0]["e2e_tok_s"] for i in (1, 2)]
            for (call, tag), label in labels.items()}
    runs_against_target(a, runs, ["C0", "C3"] * 2, [0.5] * 4, (17000, 20500), "output tok/s, end to end",
                        "qwen3-8b, 256 x 128 -> 256, H100 (two runs each)")
    forms = {"add + RMSNorm kernels": layer_us(RESULTS / f"{PREFIX}-profile-defer-off.log"),
             "norms deferred": layer_us(RESULTS / f"{PREFIX}-profile-defer-on.log")}
    labels = list(dict.fromkeys(label for label, _ in KERNELS))
    for i, (form, us) in enumerate(forms.items()):
        ys = [k + 0.4 * i for k in range(len(labels))]
        vals = [us.get(label, 0.0) for label in labels]
        b.barh(ys, vals, 0.4, color=["C0", "C3"][i], alpha=0.7, label=f"{form}: {sum(vals):.1f} us per layer")
        for y, v in zip(ys, vals):
            b.text(v + 1, y, f"{v:.1f}", va="center", fontsize=7)
    b.set_yticks([k + 0.2 for k in range(len(labels))], labels)
    b.invert_yaxis()
    b.set_xlabel("device us per layer (256 rows; 5 graph replays, 36 layers)")
    b.set_title("a 256-row decode step's layer, by kernel")
    b.set_xlim(0, 155)
    b.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
