"""Small summaries of a set of values (JSON-ready), shared by algorithms' diagnostics and the analysis."""

from __future__ import annotations

import torch

SUMMARY_KEYS = ("mean", "q25", "median", "q75", "min", "max")


def summary(values: torch.Tensor) -> dict[str, float]:
    """mean, quartiles, min and max of the finite values (all NaN when there are none)."""
    v = values.detach().double().flatten().cpu()
    v = v[torch.isfinite(v)]
    if v.numel() == 0:
        return {k: float("nan") for k in SUMMARY_KEYS}
    q = torch.quantile(v, torch.tensor([0.25, 0.5, 0.75], dtype=v.dtype))
    return {"mean": float(v.mean()), "q25": float(q[0]), "median": float(q[1]), "q75": float(q[2]),
            "min": float(v.min()), "max": float(v.max())}


def histogram(values: torch.Tensor, bins: int = 20, low: float = 0.0, high: float = 1.0) -> list[int]:
    """Counts of the finite values in `bins` equal bins over [low, high] (the last bin includes high)."""
    v = values.detach().double().flatten().cpu()
    v = v[torch.isfinite(v)]
    return [int(c) for c in torch.histc(v, bins=bins, min=low, max=high)]
