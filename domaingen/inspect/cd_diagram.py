"""The critical-difference diagram of `collect ranks` (Demšar 2006, Figure 1) for the HTML report.

An axis of average ranks (1, the best, on the left); each algorithm hangs from its average rank by
an elbow line to its name (the better half to the left, the rest to the right); a thick bar joins
algorithms whose average ranks lie within the Nemenyi critical difference, whose length is drawn
above the axis.
"""

from __future__ import annotations

import math
import re
from typing import Any

from domaingen.tables.across_datasets import Summary


def critical_difference_figure(summary: Summary, plt, dpi: int = 90) -> tuple[str, str, Any, dict[str, Any]]:
    """The file name, caption, matplotlib figure and plotted data of `summary`'s ranks, critical difference
    and groups (the fields of domaingen.inspect.report's FigureSpec)."""
    result = summary.friedman
    ranks = result.ranks.sort_values(kind="stable")
    k = len(ranks)
    half = math.ceil(k / 2)
    rows = max(half, k - half)
    height = 1.6 + 0.32 * rows + 0.18 * len(result.groups)
    fig, ax = plt.subplots(figsize=(7.5, height), dpi=dpi, layout="constrained")
    low, high = 1, max(k, math.ceil(ranks.max()))
    ax.set_xlim(low - 1.6, high + 1.6)
    ax.set_ylim(-(rows + 1 + 0.5 * len(result.groups)), 2.2)
    ax.axis("off")
    ax.hlines(0, low, high, color="black", lw=1)
    for tick in range(low, high + 1):
        ax.vlines(tick, 0, 0.25, color="black", lw=1)
        ax.text(tick, 0.4, str(tick), ha="center", va="bottom", fontsize=9)
    cd = result.critical_difference
    ax.hlines(1.5, low, low + cd, color="black", lw=1.5)
    ax.vlines([low, low + cd], 1.35, 1.65, color="black", lw=1.5)
    ax.text(low + cd / 2, 1.75, f"CD = {cd:.2f}", ha="center", va="bottom", fontsize=9)
    # the groups' bars first, just under the axis, so the names' lines pass over them
    for g, group in enumerate(result.groups):
        y = -0.35 - 0.3 * g
        ax.hlines(y, ranks[group[0]] - 0.04, ranks[group[-1]] + 0.04, color="black", lw=3.5)
    top = -0.35 - 0.3 * len(result.groups)
    for i, (name, rank) in enumerate(ranks.items()):
        left = i < half
        row = i if left else k - 1 - i
        y = top - 0.45 * (row + 1)
        end = low - 0.3 if left else high + 0.3
        ax.plot([rank, rank, end], [0, y, y], color="black", lw=0.8)
        ax.text(end - 0.05 if left else end + 0.05, y, f"{name} ({rank:.2f})", ha="right" if left else "left",
                va="center", fontsize=9)
    title = (f"{summary.title}: {result.n_datasets} datasets; Friedman p = {result.p_chi2:.3g}; Nemenyi CD at "
             f"alpha {result.alpha:g}")
    ax.set_title(title, fontsize=9)
    data: dict[str, Any] = {"ranks": {n: float(r) for n, r in ranks.items()}, "critical_difference": cd,
                            "groups": result.groups, "n_datasets": result.n_datasets}
    caption = (f"{summary.title}: critical-difference diagram (Demšar 2006). Average rank over "
               f"{result.n_datasets} datasets (1 = best); algorithms joined by a bar are not separated by the Nemenyi "
               f"critical difference at alpha {result.alpha:g} (CD = {cd:.3f}); Friedman chi2_F = {result.chi2:.3f}, "
               f"p = {result.p_chi2:.3g}. `domaingen collect ranks` prints the numbers.")
    key = re.sub(r"\W+", "_", summary.key)
    return f"cd_{key}.png", caption, fig, data
