"""Samplers that draw only from an explicit torch.Generator, on the generator's device.

torch.distributions cannot take a generator, and training batches must be reproducible from
(seed, rank, step); these few samplers are written for that."""
from __future__ import annotations

import torch
from torch import Tensor


def gamma(alpha: Tensor, generator: torch.Generator) -> Tensor:
    """Gamma(alpha, 1) samples of alpha's shape (Marsaglia & Tsang 2000, vectorised rejection).

    For alpha < 1 uses Gamma(alpha) = Gamma(alpha + 1) · U^(1/alpha)."""
    alpha = alpha.to(generator.device)
    boosted = alpha < 1
    shape = torch.where(boosted, alpha + 1, alpha)
    d = shape - 1.0 / 3.0
    c = 1.0 / torch.sqrt(9.0 * d)
    out = torch.empty_like(shape)
    pending = torch.ones_like(shape, dtype=torch.bool)
    while pending.any():  # each round accepts > 95% of what is left
        x = torch.randn(shape.shape, generator=generator, device=shape.device, dtype=shape.dtype)
        u = torch.rand(shape.shape, generator=generator, device=shape.device, dtype=shape.dtype)
        v = (1 + c * x) ** 3
        log_v = torch.log(v.clamp_min(torch.finfo(v.dtype).tiny))
        accept = pending & (v > 0) & (torch.log(u) < 0.5 * x * x + d - d * v + d * log_v)
        out = torch.where(accept, d * v, out)
        pending = pending & ~accept
    if boosted.any():
        u = torch.rand(shape.shape, generator=generator, device=shape.device, dtype=shape.dtype)
        out = torch.where(boosted, out * u ** (1.0 / alpha), out)
    return out


def dirichlet(concentration: Tensor, generator: torch.Generator) -> Tensor:
    """Dirichlet samples: normalised independent Gammas along the last axis."""
    g = gamma(concentration, generator)
    return g / g.sum(-1, keepdim=True)


def categorical(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One index per row of probs (..., S) by inverse-CDF sampling."""
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, device=probs.device,
                   dtype=probs.dtype)
    cdf = probs.cumsum(-1)
    return (u * cdf[..., -1:] > cdf).sum(-1).clamp_max(probs.shape[-1] - 1)
