"""Statistics of the benchmark's scores, in one module at the lowest layer (tasks/; bench imports
tasks, never the reverse): per-sequence and per-position means over scored positions, the
percentile bootstrap interval and the paired difference of two runs, the mean across seeds with
its t-interval, and means per context-length bin. Scoring itself (what a position's loss is, the
gap to a reference) stays in bench/training/evaluate.py."""
from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor
# torch is imported by the functions on tensors, when called: the ones on plain numbers (the
# mean across seeds, its t quantile) serve the reports (plot, leaderboard) without it


T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
         16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074,
         23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045,
         30: 2.042}  # Student t quantiles (two-sided 95%) by degrees of freedom


def t_quantile(dof: int) -> float:
    """The two-sided 95% Student t quantile: the table to 30 degrees of freedom, beyond it the
    Cornish-Fisher expansion around the normal's 1.96 (within 1e-4 there)."""
    if dof in T_975:
        return T_975[dof]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)


def sequence_means(losses: Tensor, mask: Tensor) -> Tensor:
    """Mean loss of each sequence over its scored positions."""
    return (losses * mask).sum(1) / mask.sum(1).clamp_min(1)


def position_means(values: Tensor, mask: Tensor) -> list[float | None]:
    """Mean over sequences at each position; None where no sequence is scored."""
    counts = mask.sum(0)
    means = (values * mask).sum(0) / counts.clamp_min(1)
    return [float(m) if c > 0 else None for m, c in zip(means, counts)]


def bootstrap_ci(values: Tensor, resamples: int, seed: int = 0, level: float = 0.95,
                 weights: Tensor | None = None) -> list[float]:
    """Percentile bootstrap interval for the mean of values (one value per sequence), or, with
    weights, for the ratio sum(values) / sum(weights) (per-sequence loss sums over scored-token
    counts: the per-token mean of perplexity), resampling sequences."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(len(values), (resamples, len(values)), generator=generator)
    means = values[index].mean(1) if weights is None \
        else values[index].sum(1) / weights[index].sum(1).clamp_min(1)
    tail = (1 - level) / 2
    lo, hi = torch.quantile(means, torch.tensor([tail, 1 - tail], dtype=means.dtype))
    return [float(lo), float(hi)]


def position_stderrs(values: Tensor, mask: Tensor) -> list[float | None]:
    """The standard error over sequences of position_means' mean at each position, to 4
    significant digits (an error bar); None where fewer than two sequences are scored."""
    mask = mask.double()
    counts = mask.sum(0)
    means = (values * mask).sum(0) / counts.clamp_min(1)
    spread = ((values - means).square() * mask).sum(0) / (counts - 1).clamp_min(1)
    stderr = (spread / counts.clamp_min(1)).sqrt()
    return [float(f"{e:.4g}") if c > 1 else None for e, c in zip(stderr.tolist(), counts)]


RESAMPLES = 1000  # bootstrap resamples of the held-out sequences for a summary's interval


@lru_cache(maxsize=4)
def resample_counts(count: int, resamples: int = RESAMPLES, seed: int = 0) -> Tensor:
    """(resamples, count) float64: how often each of `count` sequences is drawn in each resample
    of the percentile bootstrap over sequences, so that a statistic built from sums over
    sequences is a matrix product per sum (`counts @ per_sequence_sums`). Drawn once per size
    (one evaluation's summaries ask for it a dozen times, 65 MB at 8,192 sequences): read it,
    never write into it."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(count, (resamples, count), generator=generator)
    return torch.zeros(resamples, count, dtype=torch.float64).scatter_add_(
        1, index, torch.ones(resamples, count, dtype=torch.float64))


def percentile_interval(values: Tensor, level: float = 0.95) -> list[float] | None:
    """The percentile interval of a statistic's bootstrap values (resamples,); None where one is
    not a number (a resample on which it is undefined: the interval would be a guess)."""
    import torch
    values = values.double()
    if len(values) == 0 or not torch.isfinite(values).all():
        return None
    tail = (1 - level) / 2
    lo, hi = torch.quantile(values, torch.tensor([tail, 1 - tail], dtype=values.dtype))
    return [float(lo), float(hi)]


def pooled_std(mean: Tensor, square: Tensor, count: int) -> Tensor:
    """The standard deviation (ddof 1) of `count` values pooled from held-out sequences that each
    give equally many, from two means over the sequences: of each sequence's mean value (`mean`)
    and of its mean square (`square`): sqrt(count / (count - 1) · (square - mean²)). Any shape:
    a bootstrap passes each resample's means."""
    return ((square - mean * mean) * (count / (count - 1))).clamp_min(0).sqrt()


def ratio_interval(sums: Tensor, counts: Tensor, resamples: int = RESAMPLES) -> list[float] | None:
    """The bootstrap interval over sequences of sum(sums) / sum(counts): a mean over positions
    (counts: each sequence's positions, sums: its values summed over them), or a ratio of two
    means over sequences (counts: the denominator's per-sequence values)."""
    weights = resample_counts(len(sums), resamples)
    return percentile_interval(weights @ sums.double().cpu() / (weights @ counts.double().cpu()))


def band_sequence_means(losses: Tensor, mask: Tensor, band: list[int]) -> tuple[Tensor, Tensor]:
    """Each sequence's mean loss over its scored positions in band, and whether it has any."""
    window = slice(band[0] - 1, band[1])
    scored = mask[:, window].sum(1) > 0
    return sequence_means(losses[:, window], mask[:, window]), scored


def paired_difference(a: list, b: list, resamples: int) -> dict | None:
    """Mean over sequences of b − a (per-sequence mean losses of the same held-out sequences)
    and its percentile bootstrap interval, resampling sequences; sequences without a value
    (a band in which they score nothing) are left out of both. None when no sequence is left."""
    import torch
    differences = [y - x for x, y in zip(a, b) if x is not None and y is not None]
    if not differences:
        return None
    values = torch.tensor(differences, dtype=torch.float64)
    return {"difference": float(values.mean()), "ci": bootstrap_ci(values, resamples),
            "sequences": len(differences)}


def across_seeds(values: list[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95% t-interval (None for a single value). Computed on the
    values scaled by a power of two (exact) near their largest magnitude, so a finite record
    value as large as 1e308 neither overflows the squares (OverflowError: a whole board lost to
    one record) nor changes the result; a spread beyond the float range is an infinite
    half-width."""
    n = len(values)
    largest = max(abs(v) for v in values)
    scale = 2.0 ** (math.frexp(largest)[1] - 1) if 0 < largest < math.inf else 1.0
    scaled = [v / scale for v in values]
    mean = sum(scaled) / n
    if n < 2:
        return mean * scale, None
    sd = math.sqrt(sum((v - mean) * (v - mean) for v in scaled) / (n - 1))
    return mean * scale, t_quantile(n - 1) * sd / math.sqrt(n) * scale


def binned_means(values: Tensor, mask: Tensor, ks: list[int]) -> tuple[list, list]:
    """Per context-length bin (context_bins), the mean over sequences of each sequence's mean of
    `values` (B, T) over its scored positions (mask) in the bin, and its standard error over
    sequences; None where no sequence (for the error: fewer than two) has a scored position."""
    import torch

    from tasks.base import context_bins
    mask = mask.cpu().double()
    bins = context_bins(ks, mask.shape[1])
    counts = mask @ bins.T  # (B, K): scored positions of each sequence in each bin
    has = counts > 0
    sequences = has.sum(0)
    rate = torch.where(has, (values.cpu().double() * mask) @ bins.T / counts.clamp_min(1), 0.0)
    mean = rate.sum(0) / sequences.clamp_min(1)
    spread = ((rate - mean).pow(2) * has).sum(0) / (sequences - 1).clamp_min(1)
    stderr = (spread / sequences.clamp_min(1)).sqrt()
    return ([float(m) if c > 0 else None for m, c in zip(mean, sequences)],
            [float(e) if c > 1 else None for e, c in zip(stderr, sequences)])
