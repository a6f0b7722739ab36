"""The colored-noise task of paper 004's Theorem 2 (§4.3, appendix A.3, B.2): a scalar AR(1)
signal observed through AR(1) noise whose correlation ρ is unknown.

    z_t = a z_{t-1} + w_t,                   w_t ~ N(0, 1),  a = 0.9
    v_t = ρ v_{t-1} + √(1-ρ²) ε_t,           ε_t ~ N(0, 1)
    x_t = z_t + v_t

Both processes start stationary (z_1 ~ N(0, 1/(1-a²)), v_1 ~ N(0, 1)), so Var v_t = 1 and the
lag-1 autocorrelation of v is ρ at every t. Training sequences draw ρ ~ U(rho_min, rho_max) =
U(0.9, 0.99); the held-out set (`held_out`) uses ρ = eval_rho (0.95, as in the paper), or the
training prior when eval_rho = -1. Inputs x_1..x_T, targets x_2..x_{T+1}.

With signal_decay_max set (not -1) the signal's coefficient is unknown too: a ~ U(signal_decay,
signal_decay_max), drawn per sequence, in training and held-out sets alike (conf/task/
lgssm_colored_room.yaml: a task with room between the references, where the paper's leaves
5e-5). Unset, nothing is drawn for a and every number is the paper task's.

Given ρ the process is an LG-SSM on the augmented state ξ = [z, v] (appendix A.3):
ξ_t = diag(a, ρ) ξ_{t-1} + N(0, diag(1, 1-ρ²)), x_t = [1 1] ξ_t (no observation noise).

References (all float64, batched over sequences, a loop over time only):
- `bayes`: the posterior predictive under the *training* prior, E[x_{t+1} | x_1..x_t] =
  ∫ E[x_{t+1} | x_1..x_t, ρ] p(ρ | x_1..x_t) dρ, by Gauss-Legendre quadrature over
  [rho_min, rho_max] (grid_size nodes): one Kalman filter per node, weighted by its likelihood.
  With a unknown, over (a, ρ): the product of signal_grid_size nodes on [signal_decay,
  signal_decay_max] and grid_size on [rho_min, rho_max], one filter per pair, all batched.
  It is what a model meta-trained on this task converges to (paper 004 Theorem 1), and exactly
  Bayes-optimal when the held-out ρ is drawn from the prior (eval_rho = -1). At a fixed eval_rho
  the optimal predictor for those sequences is the clairvoyant one; `bayes` stays the trained-
  prior predictor, so the Bayes gap measures distance from what meta-training can reach.
- `clairvoyant` (bound): the Kalman filter with the true ρ (and the true a).
- `misspecified_kalman` (baseline): the Kalman filter that treats v as white N(0, 1) noise, with
  a known, or at the prior mean of a when it is not: a fixed filter that uses no latent (one
  with the true a would be part bound, and need not lose to `bayes`).
- `erm` (baseline): the pooled ridge mean Σ_i x_i / (t + λ), the paper's ERM predictor.
- `erm_fitted` (baseline): empirical risk minimisation in context over Thm. 2's class G_ERM, the
  predictors that assume i.i.d. observation noise: at each t the white-noise Kalman filter
  (z_t = a z_{t-1} + N(0, 1), x_t = z_t + N(0, r)) whose (a, r), on a fixed grid, minimise the
  squared one-step errors Σ_{i<t} (x_{i+1} - x̂_{i+1|i})² of the context, predicting x_{t+1}.
  Its excess over Bayes measures Thm. 2's R_ERM (the best predictor of that class, here of the
  grid's; the one-tap a·x_t, r -> 0, is among them).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from tasks.base import (TEST_STREAM, Batch, Reference, Task, context_bins, doubling_lengths,
                        make_generator)
from tasks.configs import USE_TRAINING_PRIOR, LGSSMColoredConfig
from tasks.lgssm import kalman_filter, linear_recurrence, pooled_ridge_mean
from tasks.stats import percentile_interval, resample_counts

SLOPE_MIN_CONTEXT = 32  # the paper fits log(MSE) = β log k + c on k >= 32 (B.2)
# The grid of `erm_fitted`: the white-noise model's signal coefficient a (evenly over [0, 0.99],
# with the misspecified filter's own a) and observation-noise variance r (log-spaced over
# 1e-3..1e2, r = 1 among them); r -> 0 is the one-tap predictor a·x_t
FIT_DECAYS = tuple(0.99 * i / 44 for i in range(45))
FIT_NOISE_VARIANCES = tuple(10 ** (-3 + 0.25 * i) for i in range(21))


def stationary_ar1(decay: Tensor, innovation_std: Tensor, steps: int,
                   generator: torch.Generator) -> Tensor:
    """(n, steps) paths of y_t = decay·y_{t-1} + innovation_std·ε_t started from the stationary
    law N(0, innovation_std² / (1 - decay²)); decay, innovation_std: (n,) float64. The same
    draws as `stationary_ar1_sequential`, the path by a scan over time (equal up to rounding)."""
    eps = torch.randn(decay.shape[0], steps, generator=generator, device=generator.device,
                      dtype=torch.float64)
    start = innovation_std / torch.sqrt(1 - decay**2) * eps[:, 0]
    drive = torch.cat([start[:, None], innovation_std[:, None] * eps[:, 1:]], 1)
    return linear_recurrence(decay[:, None, None], drive[..., None])[..., 0]


def stationary_ar1_sequential(decay: Tensor, innovation_std: Tensor, steps: int,
                              generator: torch.Generator) -> Tensor:
    """`stationary_ar1` step by step, a loop over time: its test oracle."""
    eps = torch.randn(decay.shape[0], steps, generator=generator, device=generator.device,
                      dtype=torch.float64)
    y = innovation_std / torch.sqrt(1 - decay**2) * eps[:, 0]
    path = [y]
    for t in range(1, steps):
        y = decay * y + innovation_std * eps[:, t]
        path.append(y)
    return torch.stack(path, 1)


def colored_noise_system(rho: Tensor, signal_decay: float | Tensor) -> tuple[Tensor, ...]:
    """(A, C, Q, R, P_1) of the augmented LG-SSM ξ = [z, v] for correlations rho (...,) and
    signal coefficients signal_decay (a number, or a tensor of rho's shape)."""
    zero, one = torch.zeros_like(rho), torch.ones_like(rho)
    transition = torch.diag_embed(torch.stack([signal_decay * one, rho], -1))
    state_noise = torch.diag_embed(torch.stack([one, 1 - rho**2], -1))
    init_cov = torch.diag_embed(torch.stack([one / (1 - signal_decay**2), one], -1))
    emission = torch.stack([one, one], -1).unsqueeze(-2)
    obs_noise = zero[..., None, None]
    return transition, emission, state_noise, obs_noise, init_cov


def colored_noise_filter(observations: Tensor, rho: Tensor, signal_decay: float | Tensor
                         ) -> tuple[Tensor, Tensor]:
    """kalman_filter on colored_noise_system(rho, signal_decay) (nodes (G,)) for observations
    (B, T), written out for its two diagonal states and one noise-free coordinate: next_mean
    (T, B, G) and log_lik (T, B, G), time-major. The covariance recursion runs once at the
    nodes' shape (G,), P' = A (P - P Cᵀ C P / S) Aᵀ + Q with S = C P Cᵀ, and the data pass is a
    few elementwise operations a step where the general filter makes batched 2 × 2 products:
    the Bayes quadrature's cost. Equal to kalman_filter up to rounding (tests)."""
    transition, _, state_noise, _, init_cov = colored_noise_system(rho, signal_decay)
    a, r = transition[..., 0, 0], transition[..., 1, 1]
    q1, q2 = state_noise[..., 0, 0], state_noise[..., 1, 1]
    p11, p12, p22 = init_cov[..., 0, 0], init_cov[..., 0, 1], init_cov[..., 1, 1]
    variances, gains = [], []  # S_t and the predictor's gains A P Cᵀ / S_t, (G,) each
    for _ in range(observations.shape[1]):
        u1, u2 = p11 + p12, p12 + p22  # P Cᵀ
        variance = u1 + u2
        variances.append(variance)
        gains.append(torch.stack([a * u1 / variance, r * u2 / variance]))
        p11, p12, p22 = (a * a * (p11 - u1 * u1 / variance) + q1,
                         a * r * (p12 - u1 * u2 / variance),
                         r * r * (p22 - u2 * u2 / variance) + q2)
    x = observations.T[:, :, None]  # (T, B, 1)
    innovations = torch.empty(x.shape[:2] + a.shape, dtype=x.dtype, device=x.device)
    next_mean = torch.empty_like(innovations)
    m1 = m2 = predicted = torch.zeros_like(innovations[0])  # E[z_t], E[v_t], E[x_t] | x_<t
    for t, (g1, g2) in enumerate(gains):
        innovation = torch.sub(x[t], predicted, out=innovations[t])
        m1 = torch.addcmul(a * m1, g1, innovation)
        m2 = torch.addcmul(r * m2, g2, innovation)
        predicted = torch.add(m1, m2, out=next_mean[t])
    variance = torch.stack(variances)[:, None, :]  # (T, 1, G)
    log_lik = -0.5 * (innovations.square() / variance + torch.log(2 * math.pi * variance))
    return next_mean, log_lik


def white_noise_system(signal_decay: float, like: Tensor) -> tuple[Tensor, ...]:
    """(A, C, Q, R, P_1) of the misspecified model: the same signal, v ~ N(0, 1) i.i.d."""
    def scalar(value: float) -> Tensor:
        return torch.full((1, 1), value, dtype=like.dtype, device=like.device)

    return (scalar(signal_decay), scalar(1.0), scalar(1.0), scalar(1.0),
            scalar(1 / (1 - signal_decay**2)))


def white_noise_next_means(observations: Tensor, decays: Tensor,
                           noise_variances: Tensor) -> Tensor:
    """E[x_{t+1} | x_1..x_t] (B, G, T) under white-noise models z_t = a z_{t-1} + N(0, 1),
    x_t = z_t + N(0, r), z_1 stationary, one per pair of decays a (G,) and noise variances r
    (G,), for observations (B, T): the scalar Kalman filter, m_{t+1} = a (1 - k_t) m_t + a k_t x_t
    with gain k_t = P_t / (P_t + r) from the data-free Riccati recursion P_{t+1} = a² P_t r /
    (P_t + r) + 1. `kalman_filter` on these models is its test oracle. The result is a view of
    a time-major (T, B, G) tensor: each step writes contiguous rows."""
    length = observations.shape[-1]
    cov, gains = 1 / (1 - decays**2), []
    for _ in range(length):
        gains.append(cov / (cov + noise_variances))
        cov = decays**2 * cov * noise_variances / (cov + noise_variances) + 1
    gain = torch.stack(gains)  # (T, G)
    carry = decays * (1 - gain)
    drive = (decays * gain)[:, None, :] * observations.T[:, :, None]
    mean, means = torch.zeros_like(drive[0]), torch.empty_like(drive)
    for t in range(length):  # elementwise over (B, G): a loop over time only
        mean = torch.add(carry[t] * mean, drive[t], out=means[t])
    return means.permute(1, 2, 0)


def fitted_predictions(next_means: Tensor, observations: Tensor) -> Tensor:
    """In-context least squares over candidate predictors: next_means (B, G, T), candidate g's
    prediction of x_{t+1} from x_1..x_t at each position t; observations (B, T). At position t,
    the prediction of the candidate whose squared errors over the context, Σ_{i<t} (x_{i+1} -
    next_means[g, i])², are smallest (B, T); ties, as at t = 0 before any error, go to the
    first candidate."""
    # computed in place and in next_means' own layout (white_noise_next_means: time outermost),
    # since each temporary here is as large as next_means
    context_loss = torch.empty_like(next_means)
    context_loss[..., 0] = 0
    torch.sub(observations[:, None, 1:], next_means[..., :-1], out=context_loss[..., 1:])
    context_loss.square_().cumsum_(-1)
    best = context_loss.argmin(1, keepdim=True)  # first minimum: torch.argmin's documented rule
    return next_means.gather(1, best)[:, 0]


def uniform_prior_rule(lo: float, hi: float, size: int,
                       device: torch.device | str) -> tuple[Tensor, Tensor]:
    """Gauss-Legendre nodes on [lo, hi] and the logs of their weights under U(lo, hi) (the
    weights divided by the interval's length: they sum to one), float64."""
    points, weights = np.polynomial.legendre.leggauss(size)
    nodes = torch.as_tensor(0.5 * (lo + hi) + 0.5 * (hi - lo) * points, device=device)
    return nodes, torch.as_tensor(np.log(0.5 * weights), device=device)


def loglog_slope(context_lengths: list[int], values: list[float]) -> float | None:
    """Least-squares slope β of log(value) = β log(k) + c over k >= SLOPE_MIN_CONTEXT (values:
    an MSE or an excess risk per k); None when fewer than two such k exist or a value there is
    not positive (log undefined)."""
    points = [(k, e) for k, e in zip(context_lengths, values) if k >= SLOPE_MIN_CONTEXT]
    if len(points) < 2 or any(e <= 0 for _, e in points):
        return None
    log_k = np.log([k for k, _ in points])
    log_e = np.log([e for _, e in points])
    return float(np.polyfit(log_k, log_e, 1)[0])


def loglog_slope_interval(context_lengths: list[int], per_sequence: Tensor) -> list | None:
    """The bootstrap interval over sequences of loglog_slope of the bins' means, from each
    sequence's bin means (B, len(context_lengths)); None where loglog_slope is undefined on
    some resample (a bin's mean not positive)."""
    use = [i for i, k in enumerate(context_lengths) if k >= SLOPE_MIN_CONTEXT]
    if len(use) < 2 or len(per_sequence) < 2:
        return None
    weights = resample_counts(len(per_sequence))
    log_e = (weights @ per_sequence[:, use].double() / len(per_sequence)).log()  # NaN if <= 0
    log_k = torch.tensor([math.log(context_lengths[i]) for i in use], dtype=torch.float64)
    centred = log_k - log_k.mean()
    slopes = ((log_e - log_e.mean(1, keepdim=True)) @ centred) / centred.square().sum()
    return percentile_interval(slopes)


class LGSSMColoredTask(Task):
    family = "lgssm_colored"
    kind = "vectors"
    Config = LGSSMColoredConfig
    description = ("AR(1) signal + AR(1) noise of unknown correlation rho ~ U(0.9, 0.99) "
                   "(paper 004 Thm 2), optionally of unknown signal coefficient a too; "
                   "Bayes = Kalman quadrature over rho (and a)")

    @property
    def input_dim(self) -> int:
        return 1

    output_dim = input_dim

    # --- sampling -----------------------------------------------------------------------------
    def sample(self, n: int, generator: torch.Generator) -> Batch:
        """Training sequences: ρ (and an unknown a) from the training prior."""
        return self.sample_at(n, generator, rho=None)

    def sample_at(self, n: int, generator: torch.Generator, rho: float | None) -> Batch:
        """n sequences at correlation rho, or with ρ ~ U(rho_min, rho_max) when rho is None;
        a ~ U(signal_decay, signal_decay_max) when a is unknown (drawn after ρ, so that a known
        a leaves the paper task's draws as they were)."""
        c, T = self.config, self.config.seq_len
        device = generator.device
        u = torch.rand(n, generator=generator, device=device, dtype=torch.float64)
        rhos = (c.rho_min + (c.rho_max - c.rho_min) * u) if rho is None else torch.full_like(
            u, rho)
        if c.signal_decay_unknown:
            u = torch.rand(n, generator=generator, device=device, dtype=torch.float64)
            decays = c.signal_decay + (c.signal_decay_max - c.signal_decay) * u
        else:
            decays = torch.full_like(rhos, c.signal_decay)
        signal = stationary_ar1(decays, torch.ones_like(rhos), T + 1, generator)
        noise = stationary_ar1(rhos, torch.sqrt(1 - rhos**2), T + 1, generator)
        x = (signal + noise).float().unsqueeze(-1)
        return Batch(inputs=x[:, :T], targets=x[:, 1:],
                     loss_mask=torch.ones(n, T, dtype=torch.bool, device=device),
                     latent={"rho": rhos, "signal_decay": decays})

    @property
    def held_out_from_prior(self) -> bool:
        return self.config.eval_rho == USE_TRAINING_PRIOR

    def held_out(self, n: int, split: int = TEST_STREAM) -> Batch:
        """The fixed evaluation set, at ρ = eval_rho (or the training prior when it is -1)."""
        rho = None if self.config.eval_rho == USE_TRAINING_PRIOR else self.config.eval_rho
        return self.sample_at(n, make_generator(split, 0), rho=rho)

    # --- references ---------------------------------------------------------------------------
    def references(self) -> dict[str, Reference]:
        # with a known, the paper task's descriptions, word for word
        unknown = self.config.signal_decay_unknown
        return {
            "bayes": Reference("bayes", "bayes", "posterior predictive under the training prior "
                               + ("on (a, rho): a Gauss-Legendre product quadrature" if unknown
                                  else "on rho: Gauss-Legendre quadrature")
                               + " of Kalman filters weighted by their likelihood", self.bayes),
            "clairvoyant": Reference("clairvoyant", "bound", "Kalman filter on [z, v] with the "
                                     + ("true a and rho" if unknown else "true rho")
                                     + " (knows the latent)", self.clairvoyant),
            "misspecified_kalman": Reference("misspecified_kalman", "baseline", "Kalman filter "
                                             "that treats v as white N(0,1) noise"
                                             + (", at the prior mean of a" if unknown else ""),
                                             self.misspecified_kalman),
            "erm": Reference("erm", "baseline", "pooled ridge mean sum(x_i)/(t+lambda): the "
                             "paper's Transformer-as-gradient-descent (ERM) predictor", self.erm),
            "erm_fitted": Reference("erm_fitted", "baseline", "in-context ERM under i.i.d. "
                                    "noise: the white-noise Kalman filter whose (a, r) on a grid "
                                    "minimise the context's squared one-step errors (Thm. 2's "
                                    "best ERM predictor)", self.erm_fitted),
        }

    def rho_grid(self, grid_size: int, device: torch.device | str) -> tuple[Tensor, Tensor]:
        """Gauss-Legendre nodes on [rho_min, rho_max] and their log prior weights (the weights,
        divided by the interval's length, sum to one: the uniform prior's quadrature)."""
        return uniform_prior_rule(self.config.rho_min, self.config.rho_max, grid_size, device)

    def parameter_grid(self, grid_size: int, signal_grid_size: int,
                       device: torch.device | str) -> tuple[float | Tensor, Tensor, Tensor]:
        """The quadrature nodes (a, ρ) of the Bayes predictor and their log prior weights: with
        a known, a itself and the ρ rule; else the product of the Gauss-Legendre rules on
        [signal_decay, signal_decay_max] (signal_grid_size nodes) and [rho_min, rho_max]
        (grid_size), flattened a-major to (signal_grid_size · grid_size,)."""
        rho, log_rho = self.rho_grid(grid_size, device)
        c = self.config
        if not c.signal_decay_unknown:
            return c.signal_decay, rho, log_rho
        decay, log_decay = uniform_prior_rule(c.signal_decay, c.signal_decay_max,
                                              signal_grid_size, device)
        # the prior is a product of uniforms, so the weights multiply
        return (decay.repeat_interleave(grid_size), rho.repeat(signal_grid_size),
                (log_decay[:, None] + log_rho[None, :]).flatten())

    def quadrature_predictive(self, inputs: Tensor, grid_size: int,
                              signal_grid_size: int | None = None) -> Tensor:
        """Σ_g p(θ_g | x_1..x_t) E[x_{t+1} | x_1..x_t, θ_g] over the nodes θ_g = (a_g, ρ_g) of
        `parameter_grid` (signal_grid_size: the config's by default), for inputs (B, T, 1);
        float64."""
        x = inputs.double()
        if signal_grid_size is None:
            signal_grid_size = self.config.signal_grid_size
        decays, nodes, log_prior = self.parameter_grid(grid_size, signal_grid_size, x.device)
        # bound the (T, chunk, nodes) intermediates to ~2^23 floats each
        chunk = max(1, 2**23 // (len(nodes) * x.shape[1]))
        out = []
        for part in x[..., 0].split(chunk):
            next_mean, log_lik = colored_noise_filter(part, nodes, decays)  # (T, b, G)
            for t in range(1, len(log_lik)):  # log_lik.cumsum(0), in place and by rows
                log_lik[t] += log_lik[t - 1]
            posterior = torch.softmax(log_prior + log_lik, dim=-1)
            out.append((posterior * next_mean).sum(-1).T)  # (b, T)
        return torch.cat(out).unsqueeze(-1)

    def bayes(self, batch: Batch) -> Tensor:
        return self.quadrature_predictive(batch.inputs, self.config.grid_size)

    def clairvoyant(self, batch: Batch) -> Tensor:
        rho = batch.latent["rho"].double()
        system = colored_noise_system(rho, batch.latent["signal_decay"].double())
        return kalman_filter(batch.inputs.double(), *system).next_mean

    def misspecified_kalman(self, batch: Batch) -> Tensor:
        x = batch.inputs.double()
        c = self.config
        decay = 0.5 * (c.signal_decay + c.signal_decay_max) if c.signal_decay_unknown \
            else c.signal_decay  # the prior mean of a: a fixed filter, no latent read
        return kalman_filter(x, *white_noise_system(decay, x)).next_mean

    def erm(self, batch: Batch) -> Tensor:
        return pooled_ridge_mean(batch.inputs.double(), self.config.erm_ridge)

    def fit_grid(self, device: torch.device | str) -> tuple[Tensor, Tensor]:
        """The (a, r) candidates of `erm_fitted`, flattened (G,) each: first the misspecified
        filter's own (a, r = 1), the choice before any error is seen, then the grid."""
        c = self.config
        own = 0.5 * (c.signal_decay + c.signal_decay_max) if c.signal_decay_unknown \
            else c.signal_decay
        decays = torch.tensor([own, *FIT_DECAYS], dtype=torch.float64, device=device)
        variances = torch.tensor([1.0, *FIT_NOISE_VARIANCES], dtype=torch.float64,
                                 device=device)
        a, r = decays[:, None].expand(-1, len(variances)), variances.expand(len(decays), -1)
        return a.flatten(), r.flatten()  # a-major: (own a, r = 1) comes first

    def erm_fitted(self, batch: Batch) -> Tensor:
        x = batch.inputs.double()[..., 0]  # (B, T)
        decays, variances = self.fit_grid(x.device)
        chunk = max(1, 2**23 // (len(decays) * x.shape[1]))  # (chunk, G, T) intermediates
        out = []
        for part in x.split(chunk):
            means = white_noise_next_means(part, decays, variances)
            out.append(fitted_predictions(means, part))
        return torch.cat(out).unsqueeze(-1)

    # --- the paper's risk-vs-context-length analysis (B.2) ------------------------------------
    def context_lengths(self) -> list[int]:
        """k ∈ {8, 16, 32, ...} up to seq_len (paper B.2 uses up to 512)."""
        return doubling_lengths(8, self.config.seq_len)

    def summarize(self, batch: Batch, losses: dict[str, Tensor],
                  scores: dict[str, dict[str, Tensor]] | None = None) -> dict:
        """Against context length k, for every predictor: its MSE (`mse`, with `mse_stderr`)
        and the slope β of the paper's regression log(MSE) = β log k + c over k >= 32
        (`loglog_slope_of_mse`, B.2); and its excess risk over `bayes` and over `clairvoyant`
        (the irreducible error at a fixed ρ) with the same slope of log(excess), which Thm. 2's
        c/k rates are about (undefined where an excess is not positive). Standard errors are
        over sequences, and each slope has its bootstrap interval over them (`*_ci`). The paper
        scores the single position k on 100 sequences; here the value "at k" averages the
        context lengths k/2 < t <= k (the loss at position t predicts x_{t+1} from x_1..x_t):
        the bins tile the axis on a log scale, so a power law keeps its exponent, and the
        estimate is far less noisy."""
        ks = self.context_lengths()
        some_loss = next(iter(losses.values()))
        bins = context_bins(ks, some_loss.shape[1], some_loss.device)
        bins = bins / bins.sum(1, keepdim=True)  # positions t = k//2 + 1 .. k, equal weights

        def per_k(values: Tensor) -> tuple[list, list, list | None]:
            """The mean over sequences of each bin's mean of values (B, T), its standard error,
            and the bootstrap interval of their log-log slope."""
            per_sequence = values @ bins.T  # (B, len(ks)); no bin at all at seq_len 1
            stderr = (per_sequence.std(0) / math.sqrt(len(per_sequence))).tolist() \
                if len(per_sequence) > 1 and ks else [None] * len(ks)
            return (per_sequence.mean(0).tolist(), stderr,
                    loglog_slope_interval(ks, per_sequence.cpu()))

        summary: dict = {"context_lengths": ks, "eval_rho": self.config.eval_rho,
                         "mse": {}, "mse_stderr": {}, "loglog_slope_of_mse": {},
                         "loglog_slope_of_mse_ci": {}}
        for name, loss in losses.items():
            summary["mse"][name], summary["mse_stderr"][name], ci = per_k(loss.double())
            summary["loglog_slope_of_mse"][name] = loglog_slope(ks, summary["mse"][name])
            summary["loglog_slope_of_mse_ci"][name] = ci
        for base in ("bayes", "clairvoyant"):
            if base not in losses:
                continue
            excess, stderr, slope, slope_ci = {}, {}, {}, {}
            for name, loss in losses.items():
                if name == base:
                    continue
                excess[name], stderr[name], slope_ci[name] = per_k(
                    loss.double() - losses[base].double())
                slope[name] = loglog_slope(ks, excess[name])
            summary[f"excess_over_{base}"] = excess
            summary[f"excess_over_{base}_stderr"] = stderr
            summary[f"loglog_slope_over_{base}"] = slope
            summary[f"loglog_slope_over_{base}_ci"] = slope_ci
        return summary
