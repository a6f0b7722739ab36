"""Samplers that draw only from an explicit torch.Generator, on the generator's device.

torch.distributions cannot take a generator, and training batches must be reproducible from
(seed, rank, step); these few samplers are written for that.

Gamma and Dirichlet draws are made in float64 and in log space: for a concentration α < 1 a
Gamma(α) variate is often far below the smallest float (Gamma(0.01) < 1e-300 about once in 15
draws), so a direct draw underflows to 0 and a Dirichlet row of zeros divides 0 by 0."""
from __future__ import annotations

import torch
from torch import Tensor

# Each Marsaglia-Tsang round accepts more than 95% of what is still pending, so the chance that
# one variate needs more than 50 rounds is below 0.05^50 ≈ 1e-65: hitting the bound is a bug.
MAX_ROUNDS = 50


def _check_concentration(alpha: Tensor) -> None:
    # A NaN or non-positive shape never passes the acceptance test: reject it up front instead
    # of spinning in the rejection loop.
    bad = ~(torch.isfinite(alpha) & (alpha > 0))
    if bad.any():
        raise ValueError(f"gamma/dirichlet concentration must be finite and > 0, got "
                         f"{alpha[bad].flatten()[0].item()!r} ({int(bad.sum())} bad of "
                         f"{alpha.numel()})")


def log_gamma(alpha: Tensor, generator: torch.Generator, max_rounds: int = MAX_ROUNDS) -> Tensor:
    """log of Gamma(alpha, 1) samples of alpha's shape, float64 (Marsaglia & Tsang 2000,
    vectorised rejection). For alpha < 1 uses Gamma(α) = Gamma(α + 1) · U^(1/α), taken as
    log Gamma(α + 1) + log(U) / α, which stays finite where U^(1/α) underflows.

    Raises ValueError for a non-finite or non-positive alpha, and RuntimeError if some variate
    is still rejected after max_rounds rounds (astronomically unlikely, see MAX_ROUNDS)."""
    alpha = alpha.to(device=generator.device, dtype=torch.float64)
    _check_concentration(alpha)
    boosted = alpha < 1
    shape = torch.where(boosted, alpha + 1, alpha)
    d = shape - 1.0 / 3.0
    c = 1.0 / torch.sqrt(9.0 * d)
    log_v_accepted = torch.zeros_like(shape)
    pending = torch.ones_like(shape, dtype=torch.bool)
    for _ in range(max_rounds):
        x = torch.randn(shape.shape, generator=generator, device=shape.device, dtype=shape.dtype)
        u = torch.rand(shape.shape, generator=generator, device=shape.device, dtype=shape.dtype)
        v = (1 + c * x) ** 3
        log_v = torch.log(v.clamp_min(torch.finfo(v.dtype).tiny))
        accept = pending & (v > 0) & (torch.log(u) < 0.5 * x * x + d - d * v + d * log_v)
        log_v_accepted = torch.where(accept, log_v, log_v_accepted)
        pending = pending & ~accept
        if not pending.any():
            break
    else:
        raise RuntimeError(f"gamma sampler: {int(pending.sum())} variates still rejected after "
                           f"{max_rounds} rounds (shape parameters "
                           f"{shape[pending].flatten()[:3].tolist()})")
    out = torch.log(d) + log_v_accepted
    if boosted.any():
        # 1 - U lies in (0, 1], so its log is finite; log(U)/α can overflow only for α below
        # ~2e-307, and the clamp keeps even that finite (so a softmax never sees -inf - -inf).
        u = 1 - torch.rand(shape.shape, generator=generator, device=shape.device,
                           dtype=shape.dtype)
        boost = (torch.log(u) / alpha).clamp_min(torch.finfo(shape.dtype).min)
        out = torch.where(boosted, (out + boost).clamp_min(torch.finfo(shape.dtype).min), out)
    return out


def gamma(alpha: Tensor, generator: torch.Generator, max_rounds: int = MAX_ROUNDS) -> Tensor:
    """Gamma(alpha, 1) samples of alpha's shape, float64 (exp of log_gamma: a variate below
    ~1e-308 is stored as 0, its true value to float64 precision)."""
    return log_gamma(alpha, generator, max_rounds).exp()


def dirichlet(concentration: Tensor, generator: torch.Generator) -> Tensor:
    """Dirichlet samples along the last axis, float64: the softmax of independent log-Gammas.

    The softmax subtracts each row's largest log-Gamma first, so that entry is exactly
    exp(0) = 1 before normalising: no row is ever all zero or NaN, whatever α > 0. Entries
    more than ~745 nats below their row's largest are stored as 0 (their true value is below
    1e-323 of it)."""
    return torch.softmax(log_gamma(concentration, generator), dim=-1)


def inverse_cdf(cdf: Tensor, u: Tensor) -> Tensor:
    """Index j of each row of cdf (..., S) with cdf[j-1] <= u · cdf[-1] < cdf[j], for u (..., 1)
    in [0, 1). A zero-probability entry has an empty interval, so it is never drawn, also for
    u = 0 or when u · cdf[-1] rounds up to the total."""
    total = cdf[..., -1:]
    below_total = torch.nextafter(total, torch.zeros_like(total))
    threshold = torch.minimum(u.to(cdf.dtype) * total, below_total)
    return (threshold >= cdf).sum(-1).clamp_max(cdf.shape[-1] - 1)


def categorical(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One index per row of probs (..., S) by inverse-CDF sampling."""
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, device=probs.device,
                   dtype=probs.dtype)
    return inverse_cdf(probs.cumsum(-1), u)
