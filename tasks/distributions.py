"""Samplers that draw only from an explicit torch.Generator, on the generator's device.

torch.distributions cannot take a generator, and training batches must be reproducible from
(seed, rank, step); these few samplers are written for that.

Gamma and Dirichlet draws are made in float64 and in log space: for a concentration α < 1 a
Gamma(α) variate is often far below the smallest float (Gamma(0.01) < 1e-300 about once in 15
draws), so a direct draw underflows to 0 and a Dirichlet row of zeros divides 0 by 0.

A Markov chain over M states is sampled in parallel over time: with its uniforms drawn first, each
step is a map of the states (inverse_cdf_table), and chain_states runs the chain through them in
~log2(T) levels of ops instead of T steps of a loop."""
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


def _threshold(total: Tensor, u: Tensor) -> Tensor:
    """u · total, kept strictly below the total, so that rounding up never lands on it."""
    return torch.minimum(u.to(total.dtype) * total,
                         torch.nextafter(total, torch.zeros_like(total)))


def inverse_cdf(cdf: Tensor, u: Tensor) -> Tensor:
    """Index j of each row of cdf (..., S) with cdf[j-1] <= u · cdf[-1] < cdf[j], for u (..., 1)
    in [0, 1). A zero-probability entry has an empty interval, so it is never drawn, also for
    u = 0 or when u · cdf[-1] rounds up to the total."""
    threshold = _threshold(cdf[..., -1:], u)
    return (threshold >= cdf).sum(-1).clamp_max(cdf.shape[-1] - 1)


def inverse_cdf_table(cdf: Tensor, u: Tensor) -> Tensor:
    """inverse_cdf of every row of cdf (..., M, S) at every uniform of u (..., R), bit for bit:
    (..., R, M), entry [..., r, m] = inverse_cdf(cdf[..., m, :], u[..., r, None]). It says where
    a chain goes from each of its M states at each step, what a scan over time needs. A binary
    search per entry counts the cdf entries <= the threshold (no (..., R, M, S) comparison)."""
    threshold = _threshold(cdf[..., -1:], u.unsqueeze(-2)).contiguous()  # (..., M, R)
    index = torch.searchsorted(cdf.contiguous(), threshold, right=True)
    return index.clamp_max_(cdf.shape[-1] - 1).transpose(-1, -2)


def categorical(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One index per row of probs (..., S) by inverse-CDF sampling."""
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, device=probs.device,
                   dtype=probs.dtype)
    return inverse_cdf(probs.cumsum(-1), u)


# A chain scan tabulates at every step where each of the M states goes, for each of n sequences;
# the loop draws the n symbols in ~15 ops per step. On one (shared, loaded) CPU thread, T 256, the
# scan was faster up to about n·M = 4,096 entries per step (markov, n 32: ~2 vs ~50 ms at M 2,
# ~23 vs ~40 ms at M 128; n 512, M 8: about even) and slower beyond, where samplers keep the loop.
SCAN_MAX_ENTRIES = 4096
SCAN_CHUNK_ELEMENTS = 1 << 22  # elements of a scan's (sequences, steps, states) tables per chunk


def scan_pays(sequences: int, states: int) -> bool:
    """Whether a chain scan over `states` states beats the step-by-step loop (SCAN_MAX_ENTRIES)."""
    return sequences * states <= SCAN_MAX_ENTRIES


def batch_chunks(n: int, per_sequence: int) -> list[slice]:
    """Consecutive slices of n sequences, each holding at most SCAN_CHUNK_ELEMENTS elements when
    one sequence takes per_sequence (at least one sequence): a large held-out set goes through a
    vectorised sampler's tables a chunk at a time, with the same result."""
    size = max(1, SCAN_CHUNK_ELEMENTS // max(1, per_sequence))
    return [slice(start, min(start + size, n)) for start in range(0, max(n, 1), size)]


def chain_states(step_maps: Tensor, start: Tensor) -> Tensor:
    """The path (..., L) of a chain whose step t maps state c to step_maps[..., t, c] (maps
    (..., L, M) into [0, M)), from start (...,): states[t] = step_maps[t][states[t - 1]], with
    states[-1] = start. Exactly the step-by-step loop, in ~log2(L) levels instead of L steps.

    Odd-even reduction: the maps of steps 2i and 2i+1 compose into one, the chain over those
    pairs gives the states after every odd step (recursively), and each even step follows from
    the state before it by one lookup: about as many lookups in all as step_maps has entries."""
    length = step_maps.shape[-2]
    if length == 0:
        return start.new_empty(start.shape + (0,))
    if length == 1:
        return step_maps[..., 0, :].gather(-1, start.unsqueeze(-1))
    even, odd = step_maps[..., 0::2, :], step_maps[..., 1::2, :]
    pairs = odd.gather(-1, even[..., :odd.shape[-2], :])  # step 2i+1 after step 2i
    odd_states = chain_states(pairs, start)
    before_even = torch.cat([start.unsqueeze(-1), odd_states], -1)[..., :even.shape[-2]]
    even_states = even.gather(-1, before_even.unsqueeze(-1)).squeeze(-1)
    interleaved = torch.stack([even_states[..., :odd.shape[-2]], odd_states], -1).flatten(-2)
    return torch.cat([interleaved, even_states[..., odd.shape[-2]:]], -1)
