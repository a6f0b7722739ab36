"""Random linear Gaussian state-space models (paper 004 §3, §5.1, appendix B.1) and the Kalman
filter that every LG-SSM reference here is built on.

Each sequence gets its own system θ = (A, C, Q, R):

    z_{t+1} = A z_t + w_t,  w_t ~ N(0, Q)        latent state z ∈ R^d  (d = state_dim = 4)
    x_t     = C z_t + v_t,  v_t ~ N(0, R)        observation  x ∈ R^m  (m = obs_dim = 2)

drawn as in appendix B.1: A = U Λ Uᵀ with U Haar-orthogonal and the eigenvalues Λ ~ U[0.7, 0.95]
independently; C with i.i.d. N(0, 1) entries; Q = V diag(e^u) Vᵀ with u ~ U(log 0.1, log 1.0);
R = W diag(e^u) Wᵀ with u ~ U(log 0.05, log 0.5) (V, W Haar-orthogonal). The paper does not say
how a sequence starts; here z_1 ~ N(0, P∞), the stationary law (P∞ = A P∞ Aᵀ + Q), so every
position has the same marginal and the only thing that changes along a sequence is how much
context there is. A sequence is x_1..x_{T+1}: inputs x_1..x_T, targets x_2..x_{T+1}.

Training tasks (`num_tasks`): 0 draws a fresh system for every training sequence; N > 0 trains
on a pool of N systems drawn once (from the run seed, tasks/base.py `task_pool`), each training
sequence simulating one of them picked uniformly, as the paper meta-trains on N_train tasks
(§5.1.1, Fig. 2 left: excess risk against the number of meta-training tasks). The held-out set
still draws a fresh system per sequence from the prior, so what it measures is generalisation to
new tasks.

References:
- `bayes`: the posterior predictive mean E[x_{t+1} | x_1..x_t] under the prior of θ, whose
  posterior (31 free parameters, 25 once the rotation of the latent state is factored out) has
  no closed form; the paper samples it by HMC at one context length. Here resample-move SMC over
  θ with exact Kalman likelihoods (tasks/smc.py, `LGSSMPrior` below) estimates it at every
  position in one pass: the mean of two independent runs of `bayes_particles` particles each.
  `bayes_run1` and `bayes_run2` (role `replicate`, not baselines) are those two runs: their
  spread measures the Monte Carlo error, which `summarize` reports (`bayes_particles = 0` turns
  all three off).
- `clairvoyant`, the Kalman filter with the true θ (E[x_{t+1} | x_1..x_t, θ]), a bound;
- `lemma41` and `lemma41_as_written` (bounds: they know θ), paper 004 Lemma 4.1's selective-SSM
  recursion with the predictor's gain (the clairvoyant filter again, in the lemma's form) and
  as the lemma writes it (the filter's gain, its state read as ẑ_{t|t}: not the filter);
- `erm`, the paper's Transformer-as-GD predictor argmin_y Σ_i ||y - x_i||² + λ||y||²
  = Σ_i x_i / (t + λ) (λ = 0: the pooled mean).

`summarize` also records every predictor's signed prediction errors at context k = 32, as a
histogram with their mean and spread (paper 004 Fig. 2 right: "Histogram of prediction errors").
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import Tensor

from tasks.base import Batch, LatentTask, Reference, context_bins, doubling_lengths
from tasks.configs import LGSSMConfig
from tasks.smc import DiagonalSystem, ParameterPrior, smc_runs
from tasks.stats import binned_means, percentile_interval, resample_counts

SMC_RUNS = 2  # independent runs of the bayes reference: their mean, and their spread as its error
REPLICATES = tuple(f"bayes_run{run + 1}" for run in range(SMC_RUNS))  # those runs' references
ERROR_CONTEXT = 32  # k of the error distribution: the claims' context (§5.1: "k = 32")
ERROR_BIN_EDGES = [-8.0 + 0.25 * i for i in range(65)]  # fixed: records' histograms compare


# --- the Kalman filter, shared with tasks/lgssm_colored.py ----------------------------------
@dataclass
class KalmanOutput:
    """next_mean (..., T, m): E[x_{t+1} | x_1..x_t]; next_cov (..., T, m, m): its covariance
    (depends on the parameters only, so it has their batch shape); log_lik (..., T):
    log p(x_t | x_1..x_{t-1}), the terms of the sequence's log-likelihood."""

    next_mean: Tensor
    next_cov: Tensor
    log_lik: Tensor


def kalman_filter(observations: Tensor, transition: Tensor, emission: Tensor,
                  state_noise: Tensor, obs_noise: Tensor, init_cov: Tensor) -> KalmanOutput:
    """Kalman filter for z_{t+1} = A z_t + N(0, Q), x_t = C z_t + N(0, R), z_1 ~ N(0, P_1).

    observations (..., T, m); transition A (..., d, d), emission C (..., m, d), state_noise Q
    (..., d, d), obs_noise R (..., m, m), init_cov P_1 (..., d, d), where the parameters' batch
    shapes broadcast against the observations' (...). The covariance recursion never touches
    the data, so it runs at the parameters' batch shape: one Riccati recursion per grid point
    serves every sequence. R may be singular (noise-free observations) as long as C P Cᵀ + R
    stays positive definite. Loops over time only."""
    length, obs_dim = observations.shape[-2:]
    state_dim = transition.shape[-1]
    mean = observations.new_zeros(observations.shape[:-2] + (state_dim, 1))  # E[z_t | x_<t]
    cov = init_cov  # Cov[z_t | x_<t]
    log_norm = 0.5 * obs_dim * math.log(2 * math.pi)
    next_mean, next_cov, log_lik = [], [], []
    for t in range(length):
        innovation = observations[..., t, :, None] - emission @ mean
        innovation_cov = emission @ cov @ emission.mT + obs_noise
        chol = torch.linalg.cholesky(innovation_cov)
        # invert the factor at the parameters' batch shape, then whiten every sequence by a
        # broadcast matmul (a broadcast triangular solve would factor per sequence)
        chol_inv = torch.linalg.solve_triangular(chol, torch.eye(obs_dim, dtype=chol.dtype,
                                                                 device=chol.device), upper=False)
        white = chol_inv @ innovation
        log_det_half = chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        log_lik.append(-0.5 * white.square().sum((-2, -1)) - log_det_half - log_norm)
        gain = torch.cholesky_solve(emission @ cov, chol).mT  # P Cᵀ S⁻¹, as (S⁻¹ C P)ᵀ
        filtered_cov = cov - gain @ innovation_cov @ gain.mT
        mean = transition @ (mean + gain @ innovation)
        cov = transition @ filtered_cov @ transition.mT + state_noise
        cov = 0.5 * (cov + cov.mT)  # keep it exactly symmetric over long sequences
        next_mean.append((emission @ mean)[..., 0])
        next_cov.append(emission @ cov @ emission.mT + obs_noise)
    return KalmanOutput(torch.stack(next_mean, -2), torch.stack(next_cov, -3),
                        torch.stack(log_lik, -1))


def lemma41_recursion(observations: Tensor, transition: Tensor, emission: Tensor,
                      state_noise: Tensor, obs_noise: Tensor, init_cov: Tensor,
                      as_written: bool = False) -> Tensor:
    """Paper 004 Lemma 4.1's selective-SSM recursion h_t = Ā_t h_{t-1} + B̄_t x_t with
    Ā_t = A - K_t C, B̄_t = K_t, from h_0 = 0; returns its predictions of x_{t+1} (..., T, m),
    with kalman_filter's shapes and P_1 = init_cov. K_t comes from the Riccati recursion of
    P_t = Cov[z_t | x_<t] (S_t = C P_t Cᵀ + R):

    - as_written=False: K_t = A P_t Cᵀ S_t⁻¹, the one-step predictor's gain. Then h_t is
      ẑ_{t+1|t} and C h_t is the Kalman prediction E[x_{t+1} | x_1..x_t, θ];
    - as_written=True: K_t = P_t Cᵀ S_t⁻¹, the filter's gain the lemma names, with h_t read as
      the filtered estimate ẑ_{t|t} it claims, predicting C A h_t. The filtered estimate's own
      recursion is (I - K_t C) A, not A - K_t C, so this is not the Kalman prediction.

    The gains never touch the data: they run at the parameters' batch shape. Loops over time."""
    length = observations.shape[-2]
    state = observations.new_zeros(observations.shape[:-2] + (transition.shape[-1], 1))
    readout = emission @ transition if as_written else emission
    cov, predictions = init_cov, []
    for t in range(length):
        innovation_cov = emission @ cov @ emission.mT + obs_noise
        filter_gain = torch.linalg.solve(innovation_cov, emission @ cov).mT  # P Cᵀ S⁻¹
        gain = filter_gain if as_written else transition @ filter_gain
        state = (transition - gain @ emission) @ state + gain @ observations[..., t, :, None]
        predictions.append((readout @ state)[..., 0])
        cov = transition @ (cov - filter_gain @ innovation_cov @ filter_gain.mT) @ transition.mT \
            + state_noise
        cov = 0.5 * (cov + cov.mT)
    return torch.stack(predictions, -2)


def stationary_covariance(transition: Tensor, state_noise: Tensor) -> Tensor:
    """P∞ solving P = A P Aᵀ + Q (A stable), batched: vec P = (I - A⊗A)⁻¹ vec Q."""
    d = transition.shape[-1]
    kron = torch.einsum("...ik,...jl->...ijkl", transition, transition).reshape(
        transition.shape[:-2] + (d * d, d * d))
    eye = torch.eye(d * d, dtype=transition.dtype, device=transition.device)
    vec = torch.linalg.solve(eye - kron, state_noise.reshape(state_noise.shape[:-2] + (d * d,)))
    cov = vec.reshape(vec.shape[:-1] + (d, d))
    return 0.5 * (cov + cov.mT)


def pooled_ridge_mean(observations: Tensor, ridge: float) -> Tensor:
    """argmin_y Σ_{i≤t} ||y - x_i||² + λ||y||² = Σ_{i≤t} x_i / (t + λ) at every position t."""
    counts = torch.arange(1, observations.shape[-2] + 1, dtype=observations.dtype,
                          device=observations.device)
    return observations.cumsum(-2) / (counts[:, None] + ridge)


# --- sampling ---------------------------------------------------------------------------------
def random_orthogonal(n: int, dim: int, generator: torch.Generator) -> Tensor:
    """n Haar-distributed orthogonal matrices: QR of a Gaussian matrix, with the signs of R's
    diagonal moved into Q (without that fix the law of Q is not Haar)."""
    gaussian = torch.randn(n, dim, dim, generator=generator, device=generator.device,
                           dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    return q * torch.sign(r.diagonal(dim1=-2, dim2=-1)).unsqueeze(-2)


def log_uniform_spd(n: int, dim: int, low: float, high: float,
                    generator: torch.Generator) -> Tensor:
    """V diag(exp u) Vᵀ with V Haar-orthogonal and u_i ~ U(log low, log high) (appendix B.1)."""
    basis = random_orthogonal(n, dim, generator)
    u = torch.rand(n, dim, generator=generator, device=generator.device, dtype=torch.float64)
    spectrum = torch.exp(math.log(low) + (math.log(high) - math.log(low)) * u)
    return basis @ torch.diag_embed(spectrum) @ basis.mT


def linear_recurrence(transition: Tensor, drive: Tensor) -> Tensor:
    """All states y_t = A y_{t-1} + drive_t, y_0 = drive_0, for A (n, d, d) and drive (n, L, d):
    a doubling scan, log2(L) batched matmuls instead of L small steps. Before the step with
    offset s, y_t sums its last min(t + 1, s) drives, each carried by its power of A; adding
    A^s times the value s steps back doubles that span. Equal to the loop up to rounding."""
    offset, power = 1, transition
    while offset < drive.shape[1]:
        carried = drive[:, :-offset] @ power.mT  # rows: (A^s y)ᵀ = yᵀ (A^s)ᵀ
        drive = torch.cat([drive[:, :offset], drive[:, offset:] + carried], 1)
        power = power @ power
        offset *= 2
    return drive


def simulate(transition: Tensor, emission: Tensor, state_noise: Tensor, obs_noise: Tensor,
             init_cov: Tensor, steps: int, generator: torch.Generator) -> Tensor:
    """x_1..x_steps (n, steps, m) of the LG-SSM, z_1 ~ N(0, init_cov); float64. The noise is
    drawn as `simulate_sequential` draws it, and the states follow by a scan over time."""
    z_1, state_noise_draws, obs_noise_draws = _simulation_noise(state_noise, obs_noise,
                                                                init_cov, steps, generator)
    drive = torch.cat([z_1.mT, state_noise_draws[:, :steps - 1, :, 0]], 1)  # z_1, w_1, w_2, ...
    return linear_recurrence(transition, drive) @ emission.mT + obs_noise_draws[..., 0]


def simulate_sequential(transition: Tensor, emission: Tensor, state_noise: Tensor,
                        obs_noise: Tensor, init_cov: Tensor, steps: int,
                        generator: torch.Generator) -> Tensor:
    """`simulate` step by step, a loop over time: its test oracle."""
    z, w, v = _simulation_noise(state_noise, obs_noise, init_cov, steps, generator)
    xs = []
    for t in range(steps):
        xs.append(emission @ z + v[:, t])
        z = transition @ z + w[:, t]
    return torch.stack(xs, 1)[..., 0]


def _simulation_noise(state_noise: Tensor, obs_noise: Tensor, init_cov: Tensor, steps: int,
                      generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """z_1 (n, d, 1), the state noise w (n, steps, d, 1) and the observation noise v
    (n, steps, m, 1), drawn in this order."""
    n, d, m = state_noise.shape[0], state_noise.shape[-1], obs_noise.shape[-1]
    draw = dict(generator=generator, device=generator.device, dtype=torch.float64)
    state_chol, obs_chol = torch.linalg.cholesky(state_noise), torch.linalg.cholesky(obs_noise)
    z = torch.linalg.cholesky(init_cov) @ torch.randn(n, d, 1, **draw)
    w = state_chol.unsqueeze(1) @ torch.randn(n, steps, d, 1, **draw)
    v = obs_chol.unsqueeze(1) @ torch.randn(n, steps, m, 1, **draw)
    return z, w, v


# --- the prior in the coordinates of the Bayes reference's sampler ----------------------------
def symmetric_from_upper(values: Tensor, dim: int) -> Tensor:
    """The symmetric (..., dim, dim) matrices whose upper triangles (row by row) are values
    (..., dim (dim + 1) / 2)."""
    rows, cols = torch.triu_indices(dim, dim)
    matrix = values.new_zeros(values.shape[:-1] + (dim, dim))
    matrix[..., rows, cols] = values
    matrix[..., cols, rows] = values
    return matrix


def upper_of_symmetric(matrix: Tensor) -> Tensor:
    rows, cols = torch.triu_indices(matrix.shape[-1], matrix.shape[-1])
    return matrix[..., rows, cols]


def uniform_spectrum_matrices(n: int, dim: int, generator: torch.Generator) -> Tensor:
    """n symmetric matrices V diag(ν) Vᵀ, V Haar-orthogonal, ν_i ~ U[0, 1] independently."""
    spectrum = torch.rand(n, dim, generator=generator, device=generator.device,
                          dtype=torch.float64)
    basis = random_orthogonal(n, dim, generator)
    return basis @ torch.diag_embed(spectrum) @ basis.mT


def log_vandermonde(spectrum: Tensor) -> Tensor:
    """Σ_{i<j} log |ν_j - ν_i| of spectra (..., k) sorted ascending."""
    k = spectrum.shape[-1]
    rows, cols = torch.triu_indices(k, k, offset=1)
    return torch.log(spectrum[..., cols] - spectrum[..., rows]).sum(-1)


def eigh_where(mask: Tensor, upper: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """The spectra (..., dim) and eigenbases (..., dim, dim) of the symmetric matrices whose
    upper triangles are upper (dim (dim + 1) / 2, ...), decomposed only where mask (...); zero
    spectra and identity bases elsewhere. eigh decomposes every matrix alone, so the chosen
    ones come out bitwise as in a decomposition of all of them (tests/test_lgssm.py). eigh is
    most of the prior's cost in the SMC reference, and 39% of a move's proposals fail the
    support's cheaper conditions (the default task, docs/profile-cpu-step.md)."""
    chosen = mask.flatten().nonzero()[:, 0]
    matrices = symmetric_from_upper(upper.reshape(len(upper), -1).T[chosen], dim)
    spectrum = upper.new_zeros(mask.numel(), dim)
    # in eigh's layout (each matrix column-major), which a product with it may follow
    basis = torch.eye(dim, dtype=upper.dtype, device=upper.device).repeat(mask.numel(), 1, 1).mT
    spectrum[chosen], basis[chosen] = torch.linalg.eigh(matrices)
    return spectrum.reshape(*mask.shape, dim), basis.reshape(*mask.shape, dim, dim)


class LGSSMPrior(ParameterPrior):
    """The task's prior over θ = (A, C, Q, R), in coordinates where a random walk can move it.

    Rotating the latent state by the eigenbasis U of A (z → Uᵀz) maps θ to (Λ, CU, UᵀQU, R),
    which gives every sequence the same law; under the prior, CU is again i.i.d. N(0, 1) and
    UᵀQU again Q's law (U is Haar and independent of C and Q). So A = diag(λ) loses nothing:
    λ_i = eig_min + (eig_max - eig_min) f_i with f ~ U[0, 1]^d. The noise covariances are
    Q = exp(log q_min + (log q_max - log q_min) N_Q), N_Q = V diag(ν) Vᵀ with ν ~ U[0, 1]^d and
    V Haar (a matrix exponential acts on the spectrum), and R likewise with N_R (m × m). The
    coordinates are (f, C, upper triangle of N_Q, of N_R): d + md + d(d+1)/2 + m(m+1)/2 of them
    (25 for d = 4, m = 2), and the prior density there is exp(-|C|²/2) / Π_{i<j} |ν_i - ν_j|
    over both spectra (Weyl's formula: Lebesgue measure on symmetric matrices is
    Π_{i<j} |ν_i - ν_j| dν dV), on the support f, ν ∈ [0, 1].

    The remaining symmetries, z_i → ±z_{π(i)} (permuting λ, C's columns and N_Q's rows and
    columns; flipping the signs of a column of C and of a row and column of N_Q), leave the
    prior and the likelihood unchanged. The coordinates are restricted to one copy of the
    fundamental region, f sorted ascending and the first row of C non-negative, so that the
    particle population has one mode per posterior mode rather than 2^d d! copies, and its
    covariance shapes the random-walk proposals well; the predictive mean is the same."""

    def __init__(self, config: "LGSSMConfig"):
        self.config = config
        d, m = config.state_dim, config.obs_dim
        self.sizes = (d, m * d, d * (d + 1) // 2, m * (m + 1) // 2)
        self.dim = sum(self.sizes)

    def sample(self, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
        d, m, n = self.config.state_dim, self.config.obs_dim, math.prod(shape)
        draw = dict(generator=generator, device=generator.device, dtype=torch.float64)
        fractions, order = torch.rand(n, d, **draw).sort(-1)
        emission = torch.randn(n, m, d, **draw)
        emission = emission.gather(-1, order[:, None, :].expand(-1, m, -1))
        state_noise = uniform_spectrum_matrices(n, d, generator)
        state_noise = state_noise.gather(-2, order[:, :, None].expand(-1, -1, d)).gather(
            -1, order[:, None, :].expand(-1, d, -1))
        signs = torch.where(emission[:, 0] < 0, -1.0, 1.0)  # z_i → -z_i where C_0i < 0
        emission = emission * signs[:, None, :]
        state_noise = state_noise * signs[:, :, None] * signs[:, None, :]
        obs_noise = uniform_spectrum_matrices(n, m, generator)
        coords = torch.cat([fractions, emission.flatten(1), upper_of_symmetric(state_noise),
                            upper_of_symmetric(obs_noise)], -1)
        return coords.T.contiguous().reshape(self.dim, *shape)

    def evaluate(self, coords: Tensor) -> tuple[Tensor, DiagonalSystem]:
        c = self.config
        d, m = c.state_dim, c.obs_dim
        fractions, emission, state_upper, obs_upper = coords.split(self.sizes)
        emission = emission.unflatten(0, (m, d))
        ordered = ((fractions >= 0).all(0) & (fractions <= 1).all(0)
                   & (fractions[1:] >= fractions[:-1]).all(0) & (emission[0] >= 0).all(0))
        state_spectrum, state_basis = eigh_where(ordered, state_upper, d)
        obs_spectrum, obs_basis = eigh_where(ordered, obs_upper, m)
        inside = (ordered & (state_spectrum[..., 0] >= 0) & (state_spectrum[..., -1] <= 1)
                  & (obs_spectrum[..., 0] >= 0) & (obs_spectrum[..., -1] <= 1))
        log_density = (-0.5 * emission.square().sum((0, 1)) - log_vandermonde(state_spectrum)
                       - log_vandermonde(obs_spectrum))
        log_density = torch.where(inside, log_density, -math.inf)

        def log_scale(spectrum: Tensor, low: float, high: float) -> Tensor:
            return torch.exp(math.log(low) + (math.log(high) - math.log(low)) * spectrum)

        state_noise = (state_basis * log_scale(state_spectrum, c.state_noise_min,
                                               c.state_noise_max)[..., None, :]) @ state_basis.mT
        state_noise = 0.5 * (state_noise + state_noise.mT)
        system = DiagonalSystem(
            transition=c.eig_min + (c.eig_max - c.eig_min) * fractions, emission=emission,
            state_noise=state_noise.movedim((-2, -1), (0, 1)).contiguous(),
            obs_basis=obs_basis.movedim((-2, -1), (0, 1)).contiguous(),
            obs_variances=log_scale(obs_spectrum, c.obs_noise_min,
                                    c.obs_noise_max).movedim(-1, 0).contiguous())
        return log_density, system


# --- the task ---------------------------------------------------------------------------------


class LGSSMTask(LatentTask):
    family = "lgssm"
    kind = "vectors"
    Config = LGSSMConfig
    description = ("random LG-SSMs (d=4 latent, m=2 observed), stationary start; Bayes = SMC "
                   "over the system; bound = Kalman filter with the true system; baseline = "
                   "pooled ridge mean")

    def latent_floats(self) -> int:
        d, m = self.config.state_dim, self.config.obs_dim  # A, C, Q, R; the Kalman covariances
        return (2 * d * d + m * d + m * m) + (self.config.seq_len + 1) * (d * d + m * m + d * m)

    @property
    def input_dim(self) -> int:
        return self.config.obs_dim

    output_dim = input_dim

    def draw_latent(self, n: int, generator: torch.Generator) -> dict[str, Tensor]:
        """n systems θ = (A, C, Q, R) from the prior of appendix B.1, float64."""
        c = self.config
        device = generator.device
        basis = random_orthogonal(n, c.state_dim, generator)
        eigenvalues = c.eig_min + (c.eig_max - c.eig_min) * torch.rand(
            n, c.state_dim, generator=generator, device=device, dtype=torch.float64)
        transition = basis @ torch.diag_embed(eigenvalues) @ basis.mT
        emission = torch.randn(n, c.obs_dim, c.state_dim, generator=generator, device=device,
                               dtype=torch.float64)
        state_noise = log_uniform_spd(n, c.state_dim, c.state_noise_min, c.state_noise_max,
                                      generator)
        obs_noise = log_uniform_spd(n, c.obs_dim, c.obs_noise_min, c.obs_noise_max, generator)
        return {"A": transition, "C": emission, "Q": state_noise, "R": obs_noise}

    def sample_given(self, latent: dict[str, Tensor], generator: torch.Generator) -> Batch:
        """One sequence per system of `latent`, started from its stationary law."""
        T = self.config.seq_len
        theta = {k: v.to(device=generator.device, dtype=torch.float64) for k, v in latent.items()}
        x = simulate(theta["A"], theta["C"], theta["Q"], theta["R"],
                     stationary_covariance(theta["A"], theta["Q"]), T + 1, generator).float()
        return Batch(inputs=x[:, :T], targets=x[:, 1:],
                     loss_mask=torch.ones(x.shape[0], T, dtype=torch.bool, device=x.device),
                     latent=theta)

    def references(self) -> dict[str, Reference]:
        refs = {}
        if self.config.bayes_particles:
            refs["bayes"] = Reference(
                "bayes", "bayes", "posterior predictive mean under the prior of (A, C, Q, R): "
                "resample-move SMC over the parameters with exact Kalman likelihoods, the mean of "
                f"{SMC_RUNS} independent runs of bayes_particles particles", self.bayes)
            for run, name in enumerate(REPLICATES):
                refs[name] = Reference(name, "replicate", f"SMC run {run + 1} of the {SMC_RUNS} "
                                       "that bayes averages: their spread is its Monte Carlo "
                                       "error", partial(self.bayes_run, run))
        refs["clairvoyant"] = Reference("clairvoyant", "bound", "Kalman filter with the true "
                                        "(A, C, Q, R) of each sequence (knows the latent)",
                                        self.clairvoyant)
        refs["lemma41"] = Reference(
            "lemma41", "bound", "paper 004 Lemma 4.1's selective-SSM recursion (A - K_t C) h + "
            "K_t x with each sequence's true θ and the one-step predictor's gain K_t = A P_t Cᵀ "
            "S_t⁻¹, read out as C h: the clairvoyant filter in the lemma's form",
            self.lemma41)
        refs["lemma41_as_written"] = Reference(
            "lemma41_as_written", "bound", "Lemma 4.1's recursion as written: the filter's gain "
            "K_t = P_t Cᵀ S_t⁻¹, its state read as the filtered estimate ẑ_{t|t} (prediction "
            "C A h)", partial(self.lemma41, as_written=True))
        refs["erm"] = Reference("erm", "baseline", "pooled ridge mean Σx_i/(t+λ): the paper's "
                                "Transformer-as-gradient-descent (ERM) predictor", self.erm)
        return refs

    def smc_runs(self, inputs: Tensor) -> list[Tensor]:
        """The SMC_RUNS runs (their seeds 0, 1, ...) on inputs (B, T, m), computed together:
        E[x_{t+1} | x_1..x_t], float64."""
        c = self.config
        return [run.prediction for run in smc_runs(inputs, LGSSMPrior(c), c.bayes_particles,
                                                   c.bayes_moves, list(range(SMC_RUNS)))]

    def bayes(self, batch: Batch) -> Tensor:
        """The mean of the SMC runs. The runs are kept for bayes_run to hand out once each (the
        evaluation asks for every reference on the same batch; the runs are a function of the
        inputs, so kept ones are what it would compute)."""
        runs = self.smc_runs(batch.inputs)
        key = _content_key(batch.inputs)
        self.__dict__["_unread_runs"] = {(key, run): p for run, p in enumerate(runs)}
        return torch.stack(runs).mean(0)

    def bayes_run(self, run: int, batch: Batch) -> Tensor:
        kept = self.__dict__.get("_unread_runs", {}).pop((_content_key(batch.inputs), run), None)
        return kept if kept is not None else self.smc_runs(batch.inputs)[run]

    @staticmethod
    def true_system(batch: Batch) -> tuple[Tensor, ...]:
        """(A, C, Q, R, P_1) of each sequence, float64, with the stationary start P_1 = P∞."""
        theta = {k: v.double() for k, v in batch.latent.items()}
        return (theta["A"], theta["C"], theta["Q"], theta["R"],
                stationary_covariance(theta["A"], theta["Q"]))

    def clairvoyant(self, batch: Batch) -> Tensor:
        return kalman_filter(batch.inputs.double(), *self.true_system(batch)).next_mean

    def lemma41(self, batch: Batch, as_written: bool = False) -> Tensor:
        return lemma41_recursion(batch.inputs.double(), *self.true_system(batch), as_written)

    def erm(self, batch: Batch) -> Tensor:
        return pooled_ridge_mean(batch.inputs.double(), self.config.erm_ridge)

    # --- the excess risk against context length, and the Monte Carlo error of bayes ----------
    def summarize(self, batch: Batch, losses: dict[str, Tensor],
                  scores: dict[str, dict[str, Tensor]] | None = None) -> dict:
        """Per context-length bin k ∈ {8, 16, .., seq_len} (the context lengths k/2 < t <= k, as
        tasks/base.py bins them), the excess loss of every predictor over `bayes` and
        over `clairvoyant`, with standard errors over sequences, and the Monte Carlo error of
        `bayes`, from its two runs a and b (ŷ = (a + b)/2, per-position losses L):

        - error_distribution: every predictor's signed errors at context k = 32 (the position
          that predicts x_33 from x_1..x_32, the top of the bin 16 < t <= 32 that the claims'
          excess_over_bayes[2] averages), from `scores` ("error"; tasks/base.py summarize),
          for the histogram of Fig. 2 right (`error_distribution` below);
        - bayes_mc_inflation: E[L_bayes] exceeds the exact posterior predictive's loss by the
          variance of ŷ's Monte Carlo error, estimated without bias by |a - b|²/(4m)
          = (L_a + L_b - 2 L_bayes)/2 (the parallelogram law; the runs are independent), so
          the excess over the exact Bayes predictor is excess_over_bayes + bayes_mc_inflation
          (excess_over_exact_bayes); bayes_mc_inflation_all is the mean over every scored
          position, the correction of the record's bayes_gap. Neither sees the sampler's
          finite-N bias, which is common to both runs (README: measured against larger runs);
        - bayes_mc_stderr: the standard error that the runs' randomness adds to the mean of
          L_bayes over the bin, sqrt(Σ_i D_i²)/(2n), D_i the bin mean of L_a - L_b of sequence
          i (L_a - L_b ≈ 2(a - b)·(ŷ - x)/m, twice the spread of L_bayes's fluctuation)."""
        ks = doubling_lengths(8, self.config.seq_len)
        mask = batch.loss_mask.cpu()
        predictors = [n for n in losses if n not in REPLICATES]
        summary: dict = {"context_lengths": ks}
        for base in ("bayes", "clairvoyant"):
            if base not in losses:
                continue
            excess = {name: binned_means(losses[name].double() - losses[base].double(), mask, ks)
                      for name in predictors if name != base}
            summary[f"excess_over_{base}"] = {name: e[0] for name, e in excess.items()}
            summary[f"excess_over_{base}_stderr"] = {name: e[1] for name, e in excess.items()}
        errors = self._signed_errors(scores)
        if errors:
            summary["error_distribution"] = error_distribution(errors, mask, ERROR_CONTEXT - 1)
        if "bayes" not in losses:
            return summary
        run_a, run_b, bayes = (losses[n].double().cpu() for n in (*REPLICATES, "bayes"))
        inflation = (run_a + run_b - 2 * bayes) / 2
        summary["bayes_mc_inflation"] = binned_means(inflation, mask, ks)[0]
        summary["bayes_mc_inflation_all"] = float((inflation * mask).sum() / mask.sum())
        summary["excess_over_exact_bayes"] = {
            name: [e + i if e is not None and i is not None else None
                   for e, i in zip(summary["excess_over_bayes"][name],
                                   summary["bayes_mc_inflation"])]
            for name in summary["excess_over_bayes"]}
        bins = context_bins(ks, mask.shape[1])
        counts = mask.double() @ bins.T  # (B, K) scored positions per sequence and bin
        has = counts > 0
        run_difference = torch.where(has, ((run_a - run_b) * mask) @ bins.T / counts.clamp_min(1),
                                     0.0)
        sequences = has.sum(0)
        stderr = run_difference.square().sum(0).sqrt() / (2 * sequences.clamp_min(1))
        summary["bayes_mc_stderr"] = [float(e) if c > 0 else None
                                      for e, c in zip(stderr, sequences)]
        return summary

    def summarize_sequences(self, batch: Batch, scores: dict[str, dict[str, Tensor]]) -> dict:
        mask = batch.loss_mask.cpu()
        out: dict = {}
        losses = {name: s["loss"] for name, s in (scores or {}).items()
                  if name not in REPLICATES and "loss" in s}
        if "bayes" in losses:
            excess = binned_excess(losses, "bayes", mask,
                                   doubling_lengths(8, self.config.seq_len))
            if excess:
                out["excess_over_bayes"] = excess
        errors = self._signed_errors(scores)
        moments = error_moments(errors, mask, ERROR_CONTEXT - 1) if errors else None
        if moments:
            out["error_distribution"] = moments
        return out

    def _signed_errors(self, scores: dict[str, dict[str, Tensor]] | None) -> dict[str, Tensor]:
        """Each predictor's signed errors (B, T, m) where scores have them and the sequences
        reach the error distribution's context (the SMC's replicate runs left out)."""
        if not scores or self.config.seq_len < ERROR_CONTEXT:
            return {}
        return {name: s["error"] for name, s in scores.items()
                if name not in REPLICATES and "error" in s}


def binned_excess(losses: dict[str, Tensor], base: str, mask: Tensor, ks: list[int]) -> dict:
    """The per-sequence values behind summarize's excess_over_<base>: for each predictor and
    context-length bin i (keyed str(i), the index of metrics.task.excess_over_<base>.<name>),
    each sequence's mean excess loss over `base` in the bin (their mean over sequences is the
    metric), for comparisons paired by sequence (bench/reports/claims). A bin is kept only where
    every sequence is scored in it: one value per held-out sequence, or none."""
    bins = context_bins(ks, mask.shape[1])
    counts = mask.double() @ bins.T  # (B, K) scored positions per sequence and bin
    kept = [i for i in range(len(ks)) if bool((counts[:, i] > 0).all())]
    if not kept:
        return {}
    out = {}
    for name, loss in losses.items():
        if name == base:
            continue
        rate = ((loss.double().cpu() - losses[base].double().cpu()) * mask) @ bins.T \
            / counts.clamp_min(1)
        out[name] = {str(i): rate[:, i] for i in kept}
    return out


def error_moments(errors: dict[str, Tensor], mask: Tensor, position: int) -> dict | None:
    """The per-sequence values behind error_distribution's `mean` and `std` at one position: each
    sequence's mean signed error over its m coordinates (`mean`: their mean over sequences is
    error_distribution's mean) and its mean squared error (`square`; tasks.stats.pooled_std of
    the two means, count = sequences × m, is its std), for comparisons of records paired by
    sequence (bench/reports/claims). None unless every sequence is scored there: one value per
    held-out sequence, or none."""
    if not bool(mask[:, position].all()):
        return None
    out: dict = {"coordinates": None, "mean": {}, "square": {}}
    for name, error in errors.items():
        at = error[:, position].cpu().double()  # (B, m)
        out["coordinates"] = at.shape[1]
        out["mean"][name], out["square"][name] = at.mean(1), at.square().mean(1)
    return out


def error_distribution(errors: dict[str, Tensor], mask: Tensor, position: int) -> dict:
    """The distribution of each predictor's signed errors (B, T, m) at one position (index
    `position`: context length position + 1), over the sequences scored there (mask (B, T)).

    The m coordinates of a sequence's error are pooled as m samples, not reduced to a norm: the
    paper's histogram is "centered at zero", which a norm cannot be. `mean` is their mean, with
    its standard error over sequences (`mean_stderr`: a sequence's coordinates are correlated,
    its sequences are independent) and `mean_ci` = mean ± 1.96 standard errors; `std` the
    standard deviation of the pooled errors, with its bootstrap interval over sequences
    (`std_ci`); `histogram` the counts on `bin_edges` (fixed for
    every record; the last bin holds its right edge), `below` and `above` the errors outside."""
    rows = mask[:, position].cpu().bool()
    edges = np.asarray(ERROR_BIN_EDGES)
    out: dict = {"context_length": position + 1, "position": position, "coordinates": "pooled",
                 "bin_edges": ERROR_BIN_EDGES, "count": {}, "mean": {}, "mean_stderr": {},
                 "mean_ci": {}, "std": {}, "std_ci": {}, "histogram": {}, "below": {},
                 "above": {}}
    for name, error in errors.items():
        at = error[:, position].cpu().double()[rows]  # (n, m)
        per_sequence, pooled = at.mean(1), at.flatten().numpy()
        n = len(at)
        mean = float(per_sequence.mean()) if n else None
        stderr = float(per_sequence.std() / math.sqrt(n)) if n > 1 else None
        out["count"][name] = int(pooled.size)
        out["mean"][name], out["mean_stderr"][name] = mean, stderr
        out["mean_ci"][name] = [mean - 1.96 * stderr, mean + 1.96 * stderr] \
            if stderr is not None else None
        out["std"][name] = float(pooled.std(ddof=1)) if pooled.size > 1 else None
        out["std_ci"][name] = pooled_std_interval(at) if n > 1 else None
        out["histogram"][name] = np.histogram(pooled, bins=edges)[0].tolist()
        out["below"][name] = int((pooled < edges[0]).sum())
        out["above"][name] = int((pooled > edges[-1]).sum())
    return out


def pooled_std_interval(errors: Tensor) -> list | None:
    """The bootstrap interval over sequences of the standard deviation of the pooled errors
    (n sequences, m coordinates each: a sequence is resampled with all its coordinates)."""
    weights = resample_counts(len(errors))
    count = weights.sum(1) * errors.shape[1]
    total, squares = weights @ errors.sum(1), weights @ errors.square().sum(1)
    return percentile_interval(((squares - total.square() / count) / (count - 1)).sqrt())


def _content_key(tensor: Tensor) -> str:
    """A digest of a tensor's shape, dtype and values."""
    data = tensor.detach().cpu().contiguous()
    digest = hashlib.sha256(str((tuple(data.shape), data.dtype)).encode())
    digest.update(data.numpy().tobytes())
    return digest.hexdigest()
