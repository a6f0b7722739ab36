"""Metrics of a text split from a summed negative log-likelihood: nats per token, perplexity,
bits per byte."""
from __future__ import annotations

import math


def nats_per_token(nll_sum: float, count: int) -> float:
    """Mean negative log-likelihood in nats over `count` scored tokens."""
    return float(nll_sum) / count


def perplexity(nll_sum: float, count: int) -> float:
    """exp(mean NLL per token)."""
    return math.exp(nats_per_token(nll_sum, count))


def bits_per_byte(nll_sum: float, n_bytes: int) -> float:
    """Total NLL in bits per UTF-8 byte of the text scored: nll_sum / (ln 2 · n_bytes). For a
    whole split n_bytes is meta["n_bytes"]; for part of it, scale by scored tokens / n_tokens."""
    return float(nll_sum) / (math.log(2) * n_bytes)
