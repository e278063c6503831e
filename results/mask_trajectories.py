"""ModReg's masks over training: kept fraction and median keep probability per masked layer.

Reads the records of finished sweep directories (every `modreg_*` field that every
checkpoint carries) and prints, per dataset and ModReg algorithm, the mean over runs at
each checkpoint step of the deterministic mask's kept fraction (weights with logit > 0)
and the median sigmoid(logit) per layer; with --figure, draws the kept fraction per
layer over steps (one line per layer, the band spanning the runs' min..max).

    python results/mask_trajectories.py SWEEP_DIR [SWEEP_DIR ...] [--figure out.png] [--every K]
"""

from __future__ import annotations

import argparse
import re
import sys

import pandas as pd
from tabulate import tabulate

from domaingen.collect import collect

KEPT = re.compile(r"^modreg_(?P<layer>.+)_kept_fraction$")


def layer_columns(records: pd.DataFrame) -> list[str]:
    """The masked layers' names, in the order their fields appear."""
    return [m.group("layer") for c in records.columns if (m := KEPT.match(c))]


def trajectories(records: pd.DataFrame) -> dict[tuple[str, str], pd.DataFrame]:
    """(dataset, algorithm) -> per step: runs, overall kept fraction and, per layer, kept fraction and median p."""
    out = {}
    modreg = records[records["modreg_kept_fraction"].notna()] if "modreg_kept_fraction" in records else records[:0]
    for (dataset, algorithm), sub in modreg.groupby(["dataset", "algorithm"]):
        sub = sub.dropna(axis=1, how="all")
        columns = {"runs": ("run", "nunique"), "kept (all layers)": ("modreg_kept_fraction", "mean")}
        for layer in layer_columns(sub):
            columns[f"{layer} kept"] = (f"modreg_{layer}_kept_fraction", "mean")
            columns[f"{layer} median p"] = (f"modreg_{layer}_keep_prob_p50", "mean")
        table = sub.groupby("step").agg(**columns)
        table.index = table.index.astype(int)
        out[(dataset, algorithm)] = table.astype({"runs": int})
    return out


def draw(records: pd.DataFrame, path: str) -> None:
    """Kept fraction per layer over steps, one panel per (dataset, algorithm)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [(key, sub.dropna(axis=1, how="all"))
              for key, sub in records[records["modreg_kept_fraction"].notna()].groupby(["dataset", "algorithm"])]
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.4), dpi=120, squeeze=False)
    for ax, ((dataset, algorithm), sub) in zip(axes[0], groups):
        for layer in layer_columns(sub) + ["all layers"]:
            key = "modreg_kept_fraction" if layer == "all layers" else f"modreg_{layer}_kept_fraction"
            stats = sub.groupby("step")[key].agg(["mean", "min", "max"])
            style = {"color": "black", "linewidth": 2} if layer == "all layers" else {}
            line, = ax.plot(stats.index, stats["mean"], label=layer, **style)
            ax.fill_between(stats.index, stats["min"], stats["max"], color=line.get_color(), alpha=0.15)
        ax.set_title(f"{dataset}: {algorithm} ({sub['run'].nunique()} runs)", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of weights kept (logit > 0)")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dirs", nargs="+")
    parser.add_argument("--figure", help="write the kept-fraction curves to this PNG")
    parser.add_argument("--every", type=int, default=1, help="print every K-th checkpoint (and the last)")
    ns = parser.parse_args(argv)
    records = pd.concat([collect(d).records for d in ns.sweep_dirs], ignore_index=True)
    for (dataset, algorithm), table in trajectories(records).items():
        rows = table.iloc[[i for i in range(len(table)) if i % ns.every == 0 or i == len(table) - 1]]
        print(f"\n{dataset}, {algorithm}: mean over runs at each checkpoint\n")
        print(tabulate(rows.reset_index().astype(object), headers="keys", tablefmt="github", floatfmt=".3f",
                       showindex=False))
    if ns.figure:
        draw(records, ns.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
