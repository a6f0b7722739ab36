"""Numbers as the reports show them (run summaries, leaderboard, compare, claims): significant
figures, loss columns that keep a gap visible, plurals; and which results look like a bug. Plain
Python: the report commands format without importing torch."""
from __future__ import annotations

import math

ROUNDING_GAP = 1e-6  # nats/token: how far float32 log-probabilities of the Bayes predictor stray


def is_suspicious(metrics: dict) -> bool:
    """A model that beats the exact Bayes predictor beyond its interval signals a bug (unless the
    held-out set is not drawn from the prior the Bayes predictor assumes). Beyond rounding too:
    a model that computes the Bayes predictor in float32 (model=mambazero_constructed) beats the
    float64 reference by ~1e-9 with an interval just as narrow."""
    return (metrics.get("gap_reference_role") == "bayes" and metrics.get("held_out_from_prior", True)
            and metrics["bayes_gap_ci"][1] < -ROUNDING_GAP)


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def fmt(x: float | None, digits: int = 4) -> str:
    """x with a fixed number of decimals: for bounded quantities (accuracy, bits per byte)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}f}"


def fmt_sig(x: float | None, sig: int = 3, resolution: float | None = None) -> str:
    """x to `sig` significant figures (0.000726, 7.26e-05), or, given `resolution`, with the
    decimals that show a difference of that size to `sig` significant figures: a loss beside
    its gap (1.432140 for a gap of 0.000726), where fixed decimals would hide the gap."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x) or not resolution or not math.isfinite(resolution):
        return f"{x:.{sig}g}"
    return f"{x:.{max(0, sig - 1 - math.floor(math.log10(abs(resolution))))}f}"


def loss_resolution(gaps: dict[str, float | None]) -> float:
    """The difference a column of losses must show (to 2 significant figures, beside the gap's
    3): the model's gap when `gaps` has one, else the smallest; gaps within rounding
    (ROUNDING_GAP) are not differences to show, and are the fallback when all are."""
    shown = [gaps["model"]] if "model" in gaps else list(gaps.values())
    shown = [abs(g) for g in shown if g is not None and math.isfinite(g) and abs(g) > ROUNDING_GAP]
    return min(shown, default=ROUNDING_GAP)


LOSS_DECIMALS = 4  # what loss columns always showed; fewer would hide a reference's digits


def fmt_loss(loss: float | None, resolution: float) -> str:
    """A loss in a column beside gaps: LOSS_DECIMALS decimals, more where a difference of
    `resolution` needs them to show (to 2 significant figures)."""
    if loss is not None and math.isinf(loss):
        return f"{loss}"
    return fmt(loss, max(LOSS_DECIMALS, 1 - math.floor(math.log10(resolution))))
