"""The panels the plot_* scripts share: decode attention per layer as grouped bars by case, and 256-sequence
end-to-end runs as points over bars against issue 4's 20,000 tok/s."""
from __future__ import annotations

import json
from pathlib import Path

TARGET_TOK_S = 20000
RESULTS = Path(__file__).parent / "results"


def result_rows(prefix: str, name: str) -> list[dict]:
    """The rows of results/PREFIX-NAME.json, as attention.py and gpu_decode.py write them."""
    return json.loads((RESULTS / f"{prefix}-{name}.json").read_text())["rows"]


def attention_bars(ax, series: dict[str, dict[str, float]], cases: list[str], colors: list[str],
                   alphas: list[float], ylabel: str, title: str) -> None:
    """series -> case ("SEQSxCTX") -> us per layer, one bar group per case."""
    width = 0.8 / len(series)
    for i, (name, us) in enumerate(series.items()):
        ax.bar([c + i * width for c in range(len(cases))], [us[c] for c in cases], width, label=name,
               color=colors[i], alpha=alphas[i])
    ax.set_xticks([c + width * (len(series) - 1) / 2 for c in range(len(cases))],
                  [f"{c.split('x')[0]} seqs x {c.split('x')[1]}" for c in cases])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)


def runs_against_target(ax, runs: dict[str, list[float]], colors: list[str], alphas: list[float],
                        ylim: tuple[float, float], ylabel: str, title: str) -> None:
    """label -> the e2e tok/s of each run: one column each, its runs as points over a bar to the best."""
    for i, values in enumerate(runs.values()):
        ax.scatter([i] * len(values), values, zorder=3, color=colors[i])
        ax.bar(i, max(values), 0.6, alpha=alphas[i], color=colors[i])
    ax.axhline(TARGET_TOK_S, color="k", ls="--", lw=1, label="issue 4 target (set for an H200)")
    ax.set_xticks(range(len(runs)), list(runs))
    ax.set_ylim(*ylim)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
