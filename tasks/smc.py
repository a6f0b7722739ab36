"""Sequential Monte Carlo over the parameters θ of a linear-Gaussian state-space model: the
posterior predictive mean E[x_{t+1} | x_1..x_t] = ∫ E[x_{t+1} | x_1..x_t, θ] p(θ | x_1..x_t) dθ at
every t, for a prior on θ whose posterior has no closed form.

Resample-move SMC (Gilks & Berzuini 2001; Chopin 2002): N particles per sequence, each a full θ
drawn from the prior and carrying its own Kalman filter. Observing x_t multiplies a particle's
weight by its exact likelihood p(x_t | x_<t, θ); the prediction at t is the weighted mean of the
particles' E[x_{t+1} | x_≤t, θ]. When the effective sample size N_eff = 1 / Σ w² falls below
ess_fraction · N, the particles are resampled (systematic resampling) and each then takes
`moves` independent Metropolis-Hastings steps that leave p(θ | x_≤t) invariant, proposing from
a Gaussian fitted to the population (half of it: see _independent_metropolis_move) and
accepting with the exact likelihood of the whole prefix x_1..x_t (a Kalman filter from
scratch: the cost of a move). Independent proposals rejuvenate a resampled population in few
steps where a random walk of the same cost barely moves it: on paper 004's prior, at equal cost
(8 moves of 128 particles), they left 2-3 times less Monte Carlo variance in the prediction than
a random walk scaled by the population's covariance (both measured with proposals fitted to the
whole population, before the split into halves). Every step is exact, so the estimate
converges to the posterior predictive mean as N grows; at fixed N it carries Monte Carlo error:
a variance, which tasks/lgssm.py measures with independent runs, and an O(1/N) bias that such
runs share.

A prior (`ParameterPrior`) gives θ in coordinates where it has a density (-inf outside the
support), and the state-space system of each θ, with a diagonal transition (a prior that is
invariant under rotations of the latent state can be written so) and the observation noise in
its eigenbasis, so that an observation is absorbed one scalar coordinate at a time without a
matrix inverse.

Everything is batched over sequences and particles (float64); loops run over time and over the
scalar coordinates of an observation. A chunk of sequences draws its random numbers from a
generator of its own, and chunks (of one run or of several) advance through time side by side,
as many as a bound on the memory allows: fewer and larger tensor operations, each chunk's
numbers what they would be alone (up to rounding). Groups of chunks share nothing, so where the
work is many seconds they advance in worker processes, one per thread this process may use
(tasks/processes.py): the operations are too small for torch's threads to help one process.
"""
from __future__ import annotations

import abc
import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from tasks.base import make_generator
from tasks.processes import host_available_bytes, map_in_processes

SMC_STREAM = 6  # seed tag of the SMC reference's random numbers (tasks/base.py uses 1-5)
SYSTEMS_PER_CHUNK = 1 << 16  # particles × sequences of one random stream (a chunk)
SYSTEMS_TOGETHER = 1 << 18  # particles × sequences advanced together: bounds the memory
SYSTEMS_IN_CACHE = 1 << 13  # particles × sequences of one block of the filter of all particles
# system-steps (runs × sequences × T × particles) from which the runs take worker processes:
# 2^23 is about 16 s on one core (the default task's 64 held-out sequences, two runs)
PROCESSES_FROM = 1 << 23
WORKER_BYTES = 1 << 30  # a worker's memory, at most: 0.8 GB at the peak with 4 chunks of 512


@dataclass
class DiagonalSystem:
    """z_{t+1} = diag(transition) z_t + N(0, state_noise), x_t = emission z_t + N(0, R),
    R = obs_basis diag(obs_variances) obs_basisᵀ (obs_basis orthogonal; a variance may be 0 as
    long as the predicted observation variance stays positive), z_1 ~ N(0, P∞), the stationary
    law. The systems' batch axes come last (one contiguous vector per matrix entry, so that
    every operation is a long vectorised loop): transition (d, ...), emission (m, d, ...),
    state_noise (d, d, ...), obs_basis (m, m, ...), obs_variances (m, ...)."""

    transition: Tensor
    emission: Tensor
    state_noise: Tensor
    obs_basis: Tensor
    obs_variances: Tensor
    # derived, and carried along when particles are selected (map_fields) rather than recomputed:
    # obs_basisᵀ C, the emission in the noise eigenbasis (m, d, ...); a_i a_j, A P Aᵀ = (a aᵀ) ∘ P
    rotated_emission: Tensor | None = None
    decay_products: Tensor | None = None

    def __post_init__(self):
        if self.rotated_emission is None:
            self.rotated_emission = torch.einsum("ij...,ik...->jk...", self.obs_basis,
                                                 self.emission).contiguous()
        if self.decay_products is None:
            self.decay_products = self.transition[:, None] * self.transition[None, :]

    def stationary_covariance(self) -> Tensor:
        """P∞ = A P∞ Aᵀ + Q for a diagonal A: P∞_ij = Q_ij / (1 - a_i a_j)."""
        return self.state_noise / (1 - self.decay_products)


@dataclass
class KalmanState:
    """mean (d, ...) and cov (d, d, ...) of z_{t+1} given x_1..x_t (of z_1 before any)."""

    mean: Tensor
    cov: Tensor


def kalman_start(system: DiagonalSystem) -> KalmanState:
    cov = system.stationary_covariance()
    return KalmanState(cov.new_zeros(cov.shape[1:]), cov)


def kalman_step(system: DiagonalSystem, x: Tensor, state: KalmanState
                ) -> tuple[Tensor, KalmanState]:
    """Absorb one observation x_t (m, S, 1) into the filters of systems of batch shape (S, N)
    and predict the next state: log p(x_t | x_<t, θ) (S, N) and the state of z_{t+1}. In the
    noise eigenbasis the coordinates of x_t are independent given z, so they are absorbed one
    at a time: scalar updates, exactly the joint update, without a matrix inverse."""
    rotated_x = (system.obs_basis * x[:, None]).sum(0)  # obs_basisᵀ x_t
    mean, cov = state.mean, state.cov
    log_lik = 0.0
    for j in range(rotated_x.shape[0]):
        row = system.rotated_emission[j]
        cov_row = (cov * row).sum(1)  # P cᵀ
        variance = (row * cov_row).sum(0) + system.obs_variances[j]
        innovation = rotated_x[j] - (row * mean).sum(0)
        log_lik = log_lik - 0.5 * (innovation.square() / variance
                                   + torch.log(2 * math.pi * variance))
        gain = cov_row / variance
        mean = torch.addcmul(mean, gain, innovation)
        cov = torch.addcmul(cov, cov_row[:, None], gain[None, :], value=-1)
    mean = system.transition * mean
    cov = torch.addcmul(system.state_noise, system.decay_products, cov)
    return log_lik, KalmanState(mean, cov)


def kalman_prefix(system: DiagonalSystem, observations: Tensor) -> tuple[Tensor, KalmanState]:
    """log p(x_1..x_t | θ) (S, N) and the state of z_{t+1} for observations (S, t, m) and
    systems of batch shape (S, N)."""
    state = kalman_start(system)
    log_lik = observations.new_zeros(system.transition.shape[1:])
    for x in observations.permute(1, 2, 0)[..., None]:  # x_t as (m, S, 1)
        step_log_lik, state = kalman_step(system, x, state)
        log_lik = log_lik + step_log_lik
    return log_lik, state


class ParameterPrior(abc.ABC):
    """A prior over θ in coordinates of dimension `dim` (Lebesgue measure on them); batch axes
    last, as in DiagonalSystem."""

    dim: int

    @abc.abstractmethod
    def sample(self, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
        """Draws (dim, *shape) from the prior, float64, inside the support."""

    @abc.abstractmethod
    def evaluate(self, coords: Tensor) -> tuple[Tensor, DiagonalSystem]:
        """The log prior density of coords (dim, ...) up to a constant (-inf outside the
        support), and their systems (meaningful only where the density is finite)."""


@dataclass
class Particles:
    """The particles of S sequences, N each: coords (dim, S, N), their log prior density and
    log-likelihood of the observations so far (S, N), their systems and Kalman states."""

    coords: Tensor
    log_prior: Tensor
    log_lik: Tensor
    system: DiagonalSystem
    state: KalmanState


def map_fields(op: Callable[..., Tensor], first, *others):
    """op applied to the tensors of (nested) dataclasses of tensors, field by field: a
    dataclass of the same structure. Every tensor ends in the particles' axes (S, N), so op
    can select sequences or particles there."""
    if isinstance(first, Tensor):
        return op(first, *others)
    return type(first)(*(map_fields(op, getattr(first, f.name), *(getattr(o, f.name)
                                                                   for o in others))
                         for f in dataclasses.fields(first)))


def select(mask: Tensor, chosen, other):
    """chosen's particles where mask (S, N), other's elsewhere (dataclasses of tensors)."""
    return map_fields(lambda a, b: torch.where(mask, a, b), chosen, other)


def replace(particles, index: tuple, part):
    """particles with those at `index` (indices of the particles' axes (S, N)) replaced by
    part's (dataclasses of tensors)."""
    return assign(map_fields(torch.clone, particles), index, part)


def assign(particles, index: tuple, part):
    """replace, in place: for particles whose tensors nothing else holds."""
    def put(whole: Tensor, piece: Tensor) -> Tensor:
        whole[(..., *index)] = piece
        return whole

    return map_fields(put, particles, part)


@dataclass
class SMCResult:
    """prediction (S, T, m): the estimate of E[x_{t+1} | x_1..x_t]; resamplings (S,): how often
    each sequence's particles were resampled and moved; acceptance: the mean acceptance rate of
    the Metropolis moves (nan without any)."""

    prediction: Tensor
    resamplings: Tensor
    acceptance: float


def smc_predictive(observations: Tensor, prior: ParameterPrior, particles: int, moves: int,
                   seed: int, ess_fraction: float = 0.5, processes: int | None = None
                   ) -> SMCResult:
    """The SMC estimate of the posterior predictive mean at every position of observations
    (S, T, m), `particles` per sequence. The random numbers of a chunk of sequences come from
    the generator of (SMC_STREAM, seed, chunk index): the result is a function of the
    observations and the seed."""
    return smc_runs(observations, prior, particles, moves, [seed], ess_fraction, processes)[0]


def smc_runs(observations: Tensor, prior: ParameterPrior, particles: int, moves: int,
             seeds: list[int], ess_fraction: float = 0.5, processes: int | None = None
             ) -> list[SMCResult]:
    """smc_predictive of each seed, computed together: every run's chunks of sequences advance
    through time side by side, as many at once as SYSTEMS_TOGETHER allows. Each chunk keeps
    its own generator and draws from it what it drew alone (`Streams`), and every operation
    acts on each sequence's particles alone, so each run is what its chunks give one at a time
    up to rounding: LAPACK and BLAS may take another path for a batch of one matrix, which a
    chunk alone meets and side by side may not (tests/test_smc.py). Fewer, larger tensor
    operations do the same work faster.

    processes: worker processes that advance groups of chunks at the same time (None:
    `default_processes`). The groups are the serial ones where each process gets one at least
    (the default 512 held-out sequences of two runs on two cores: two groups of four chunks,
    as one process makes them), else smaller."""
    x = observations.double()
    per_chunk = max(1, SYSTEMS_PER_CHUNK // particles)
    chunks = [(run, index, part) for run, seed in enumerate(seeds)
              for index, part in enumerate(x.split(per_chunk))]
    if processes is None:
        processes = default_processes(x, particles, len(seeds))
    processes = min(processes, len(chunks)) if x.device.type == "cpu" else 1
    together = max(1, SYSTEMS_TOGETHER // (per_chunk * particles))
    if processes > 1:
        together = min(together, -(-len(chunks) // processes))
    groups = [(torch.cat([part for *_, part in group]), prior, particles, moves, ess_fraction,
               [(seeds[run], index) for run, index, _ in group], [len(part) for *_, part in group])
              for group in (chunks[start:start + together]
                            for start in range(0, len(chunks), together))]
    if processes > 1:
        done = map_in_processes(_smc_group, groups, processes)
    else:
        done = [_smc_group(*group) for group in groups]
    done = [chunk for group in done for chunk in group]
    results = []
    for run in range(len(seeds)):
        mine = [result for (owner, *_), result in zip(chunks, done) if owner == run]
        proposals = sum(r[2] for r in mine)
        acceptance = sum(r[3] for r in mine) / proposals if proposals else math.nan
        results.append(SMCResult(torch.cat([r[0] for r in mine]),
                                 torch.cat([r[1] for r in mine]), acceptance))
    return results


def default_processes(x: Tensor, particles: int, runs: int) -> int:
    """Worker processes for SMC runs of `particles` on the sequences x (S, T, m): one per
    thread this process may use, where the runs' system-steps reach PROCESSES_FROM (a worker
    costs about 1.5 s to start), and as many as the host's available memory holds at
    WORKER_BYTES each; otherwise one, the caller's."""
    work = runs * x.shape[0] * x.shape[1] * particles
    if work < PROCESSES_FROM:
        return 1
    threads, available = torch.get_num_threads(), host_available_bytes()
    return max(1, threads if available is None else min(threads, available // WORKER_BYTES))


def _smc_group(x: Tensor, prior: ParameterPrior, particles: int, moves: int,
               ess_fraction: float, streams: list[tuple[int, int]], counts: list[int]
               ) -> list[tuple[Tensor, Tensor, int, float]]:
    """_smc_together for the chunks of x whose (seed, chunk index) are `streams` and whose
    sequences number `counts`: a job that needs nothing of its caller's."""
    generators = [make_generator(SMC_STREAM, seed, index, device=x.device)
                  for seed, index in streams]
    return _smc_together(x, prior, particles, moves, ess_fraction, Streams(generators, counts))


class Streams:
    """The random streams of chunks of sequences that advance together, one generator each:
    a draw for some of the sequences is made chunk by chunk, each chunk's rows from its own
    generator, so that every generator gives the numbers, in the order, that it gave when its
    chunk ran alone. counts: the rows of each chunk that take part (chunks in order)."""

    def __init__(self, generators: list[torch.Generator], counts: list[int]):
        self.generators, self.counts = generators, counts

    def part(self, rows: Tensor) -> "Streams":
        """The streams of the sequences at rows (sorted) of these."""
        owner = torch.repeat_interleave(torch.arange(len(self.counts)),
                                        torch.tensor(self.counts))
        counts = torch.bincount(owner[rows.cpu()], minlength=len(self.counts)).tolist()
        return Streams(self.generators, counts)

    def draw(self, take: Callable[[int, torch.Generator], Tensor], axis: int = 0) -> Tensor:
        """take(rows, generator) of each chunk that takes part, joined along axis."""
        return torch.cat([take(n, g) for n, g in zip(self.counts, self.generators) if n], axis)

    def rand(self, *shape: int, like: Tensor, normal: bool = False) -> Tensor:
        """Uniform (or standard normal) numbers (rows, *shape), of like's dtype and device."""
        sample = torch.randn if normal else torch.rand
        return self.draw(lambda n, g: sample(n, *shape, generator=g, device=like.device,
                                             dtype=like.dtype))


def _smc_together(x: Tensor, prior: ParameterPrior, count: int, moves: int, ess_fraction: float,
                  streams: Streams) -> list[tuple[Tensor, Tensor, int, float]]:
    """The prediction (S, T, m) and resampling counts (S,) of each chunk of the sequences x
    (its rows, in streams' order), and its number of Metropolis proposals and of
    acceptances."""
    sequences, length, _ = x.shape
    coords = streams.draw(lambda n, g: prior.sample((n, count), g), axis=1)
    log_prior, system = prior.evaluate(coords)
    particles = Particles(coords, log_prior, x.new_zeros(sequences, count), system,
                          kalman_start(system))
    log_weight = x.new_zeros(sequences, count)
    resamplings = torch.zeros(sequences, dtype=torch.long)
    proposals, accepted = [0] * len(streams.counts), [0.0] * len(streams.counts)
    prediction = []
    for t, x_t in enumerate(x.permute(1, 2, 0)[..., None]):  # x_t as (m, S, 1)
        step_log_lik, particles.state = _kalman_step_in_blocks(particles.system, x_t,
                                                               particles.state)
        particles.log_lik = particles.log_lik + step_log_lik
        log_weight = log_weight + step_log_lik
        weights = torch.softmax(log_weight, -1)
        low = (1 / weights.square().sum(-1) < ess_fraction * count).nonzero()[:, 0]
        if len(low):
            taking_part = streams.part(low)
            ancestors = systematic_resampling(weights[low], taking_part.rand(1, like=weights))
            moved = map_fields(lambda v: v[..., low[:, None], ancestors], particles)
            for _ in range(moves):
                moved, rate = _independent_metropolis_move(prior, moved, x[low, :t + 1],
                                                           taking_part)
                for chunk, (rows, part) in enumerate(zip(taking_part.counts,
                                                         rate.split(taking_part.counts))):
                    if rows:
                        proposals[chunk] += rows * count
                        accepted[chunk] += float(part.sum()) * count
            particles = assign(particles, (low, slice(None)), moved)
            log_weight[low] = 0.0
            weights[low] = 1.0 / count
            resamplings[low] += 1
        # E[x_{t+1} | x_≤t, θ] = C E[z_{t+1} | x_≤t, θ], averaged over the posterior's particles
        predicted = (particles.system.emission * particles.state.mean).sum(1)  # (m, S, N)
        prediction.append((weights * predicted).sum(-1).T)
    prediction = torch.stack(prediction, 1).split(streams.counts)
    return list(zip(prediction, resamplings.split(streams.counts), proposals, accepted))


def _kalman_step_in_blocks(system: DiagonalSystem, x: Tensor, state: KalmanState
                           ) -> tuple[Tensor, KalmanState]:
    """kalman_step of systems (S, N), a block of sequences of at most SYSTEMS_IN_CACHE systems
    at a time: the same arithmetic, on tensors that stay in the CPU's cache through a step's
    twenty-odd passes (chunks side by side do not)."""
    count = system.transition.shape[-1]
    per_block = max(1, SYSTEMS_IN_CACHE // count)
    steps = []
    for start in range(0, x.shape[-2], per_block):
        def block(v: Tensor) -> Tensor:
            return v[..., start:start + per_block, :]

        steps.append(kalman_step(map_fields(block, system), block(x), map_fields(block, state)))
    return torch.cat([log_lik for log_lik, _ in steps], -2), map_fields(
        lambda *blocks: torch.cat(blocks, -2), *[block for _, block in steps])


def systematic_resampling(weights: Tensor, uniforms: Tensor) -> Tensor:
    """Ancestor indices (S, N) for normalised weights (S, N) and one uniform a sequence
    (S, 1): the points (u + i) / N read off the weights' cumulative sum."""
    particles = weights.shape[1]
    points = (uniforms + torch.arange(particles, device=weights.device,
                                      dtype=weights.dtype)) / particles
    ancestors = torch.searchsorted(weights.cumsum(-1), points)
    return ancestors.clamp_max(particles - 1)


def _independent_metropolis_move(prior: ParameterPrior, particles: Particles, prefix: Tensor,
                                 streams: Streams) -> tuple[Particles, Tensor]:
    """One independent Metropolis-Hastings step of every particle, targeting p(θ | prefix): the
    proposal q is the Gaussian with a population's mean and covariance (per sequence), drawn
    afresh for each particle and accepted with probability
    min(1, p(θ' | prefix) q(θ) / (p(θ | prefix) q(θ'))). A q fitted to the particles it moves
    would depend on the particle it moves, and the step would no longer leave the posterior
    invariant (on a 25-dimensional Gaussian with 512 particles, 60 such steps shrink E|θ|² by
    8%). So the particles are split in two halves (even and odd places): the odd ones move with
    q fitted to the even ones, then the even ones with q fitted to the moved odd ones, each a
    step that leaves the product of posteriors invariant given the other half. Returns the
    moved particles and each sequence's acceptance rate."""
    rates = []
    particles = map_fields(torch.clone, particles)  # the halves are written into this copy
    for moving in (1, 0):
        fitted = particles.coords[..., 1 - moving::2]
        part = map_fields(lambda v: v[..., moving::2], particles)
        part, rate = _independent_metropolis_step(prior, part, prefix, fitted, streams)
        particles = assign(particles, (slice(moving, None, 2),), part)
        rates.append(rate)
    return particles, torch.stack(rates).mean(0)


def _independent_metropolis_step(prior: ParameterPrior, particles: Particles, prefix: Tensor,
                                 fitted: Tensor, streams: Streams) -> tuple[Particles, Tensor]:
    """The independent Metropolis-Hastings step of `particles` with the Gaussian proposal fitted
    to the coordinates `fitted` (dim, S, n) (see _independent_metropolis_move)."""
    coords = particles.coords
    dim, _, count = coords.shape
    mean = fitted.mean(-1, keepdim=True)
    centred = fitted - mean
    cov = torch.einsum("isn,jsn->sij", centred, centred) / max(1, fitted.shape[-1] - 1)
    jitter = 1e-12 * cov.diagonal(dim1=-2, dim2=-1).mean(-1).clamp_min(1e-300)
    chol = torch.linalg.cholesky(cov + jitter[:, None, None] * torch.eye(dim, dtype=cov.dtype))
    white = streams.rand(dim, count, like=coords, normal=True)
    proposal = (mean + (chol @ white).transpose(0, 1)).contiguous()
    current_white = torch.linalg.solve_triangular(chol, (coords - mean).transpose(0, 1),
                                                  upper=False)
    log_prior, system = prior.evaluate(proposal)
    inside = torch.isfinite(log_prior)
    # outside the support a proposal is rejected whatever its likelihood (and its system may
    # not be a valid one): only the proposals inside are filtered, and the particle's own
    # system and state stand in for the others (a third to a half of them, and never kept)
    log_lik, state = _filter_where(inside, system, particles, prefix)
    system = select(inside, system, particles.system)
    # log q(θ) - log q(θ') = (|white'|² - |white|²)/2
    log_ratio = (log_lik + log_prior - particles.log_lik - particles.log_prior
                 + 0.5 * (white.square().sum(1) - current_white.square().sum(1)))
    u = streams.rand(count, like=coords)
    accept = inside & (torch.log(u) < log_ratio)
    candidate = Particles(proposal, log_prior, log_lik, system, state)
    return select(accept, candidate, particles), accept.double().mean(1)


def _filter_where(mask: Tensor, system: DiagonalSystem, particles: Particles, prefix: Tensor
                  ) -> tuple[Tensor, KalmanState]:
    """kalman_prefix of the systems where mask (S, N), over their sequence's prefix (S, t, m);
    elsewhere log-likelihood 0 and the particles' own state. Each system's arithmetic is that
    of kalman_prefix over all of them (its ops act on every system alone)."""
    sequence, particle = mask.nonzero(as_tuple=True)
    chosen = map_fields(lambda v: v[..., sequence, particle, None], system)  # batch (K, 1)
    log_lik, state = kalman_prefix(chosen, prefix[sequence])
    log_lik = log_lik.new_zeros(mask.shape).index_put_((sequence, particle), log_lik[:, 0])

    return log_lik, replace(particles.state, (sequence, particle),
                            map_fields(lambda v: v[..., 0], state))
