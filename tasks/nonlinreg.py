"""In-context sinusoid regression (paper 002 §4.3 and A.8, the task of Finn et al. 2017).

Each sequence draws an amplitude a ~ U[a_min, a_max] (0.1 .. 5) and a phase φ ~ U[0, π]; examples
are x_k ~ U[-x_max, x_max] (x_max = 5) and y_k = a sin(x_k + φ) + ε_k with ε_k ~ N(0, σ²). Finn et
al.'s targets are noiseless; here σ > 0 (default 0.1) so the posterior over (a, φ) has a density
and the Bayes predictor is a well-defined integral.

Prompt: the interleaved format of tasks/linreg.py with f = N = 1: x-token [x_k, 0, 1], y-token
[0, y_k, 0]; the target y_k sits at the x_k position, the only scored positions, so the causal
prediction at x_k is of y_k from the k earlier examples and the query. seq_len = 2n for n examples.
`score`: "all" scores every query (the loss curve over context sizes), "last" only the final one,
as the paper trains and evaluates (tasks/linreg.py); the mask sets the training loss and the
held-out scores alike.

Writing a sin(x + φ) = θᵀψ(x) with θ = (a cos φ, a sin φ) and features ψ(x) = (sin x, cos x), the
log-likelihood of the j examples before a query is θᵀb/σ² - θᵀSθ/(2σ²) + const with the prefix
statistics S = Σ ψψᵀ and b = Σ ψ y, and every prediction below is linear in some estimate of θ.

References:
- bayes: the posterior mean E[θ | data]ᵀψ(x_q) under the uniform prior on (a, φ), by quadrature
  over (a, φ). Along each ray θ = a (cos φ, sin φ) the log-likelihood is quadratic in a, so the
  integral over a is a truncated normal integral, done in closed form (`ray_integral`); the
  integral over φ uses the midpoint rule on grid_phase nodes (the uniform prior gives every node
  the same weight). With the defaults, doubling grid_phase moves the held-out Bayes loss by ~3e-7
  relatively (tests/test_nonlinreg.py checks < 0.1%), and a brute-force 2-D midpoint grid over
  (a, φ) agrees to 1e-4.
- gd1: one gradient step from θ = 0 on L(θ) = 1/(2j) Σ (θᵀψ(x_k) - y_k)² with the fixed features
  ψ, the implicit model of paper 002 applied to the right feature map, with the MSE-optimal step
  for every context size j in closed form (`gd1_step_size`).
- knn: the mean of the y's of the knn_k context examples nearest to the query in x (all of them
  while j < knn_k; 0 for an empty context).
- oracle (bound): a sin(x_q + φ) with the true (a, φ); its loss is the noise floor σ².
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from tasks.base import Batch, Reference, Task
from tasks.configs import NonLinRegConfig
from tasks.linreg import (exclusive_cumsum, interleave, last_scored,
                          split_interleaved, to_positions)

RAY_CHUNK = 1 << 18  # (query, φ-node) pairs evaluated at once: the temporaries stay in cache
SMOOTH_SPAN = 10.0  # below this variation of the log-weight along a ray, use Gauss–Legendre
GL_NODES = 16  # error ~1e-12 for exp of a quadratic varying by < SMOOTH_SPAN


def features(x: Tensor) -> Tensor:
    """ψ(x) = (sin x, cos x), shape (..., 2)."""
    return torch.stack([torch.sin(x), torch.cos(x)], dim=-1)


def log1mexp(x: Tensor) -> Tensor:
    """log(1 - exp(x)) for x < 0, accurate near 0 and far below it (Mächler 2012)."""
    return torch.where(x > -math.log(2), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def log_normal_mass(lower: Tensor, upper: Tensor) -> Tensor:
    """log(Φ(upper) - Φ(lower)) for lower < upper; intervals right of 0 are reflected so both
    ends lie in the lower tail, where log Φ keeps its relative precision."""
    reflect = lower > 0
    low = torch.where(reflect, -upper, lower)
    high = torch.where(reflect, -lower, upper)
    log_high = torch.special.log_ndtr(high)
    return log_high + log1mexp(torch.special.log_ndtr(low) - log_high)


def ray_integral(alpha: Tensor, beta: Tensor, lower: float, upper: float) -> tuple[Tensor, Tensor]:
    """log ∫ exp(a β - a² α / 2) da over [lower, upper] and the mean of a under that weight.

    The weight is a normal density in a with mean μ = β/α and sd 1/√α, truncated to the interval
    [z0, z1] in standard units: mass sd √(2π) exp(β²/2α) (Φ(z1) - Φ(z0)) and mean
    μ + sd (φ(z0) - φ(z1)) / (Φ(z1) - Φ(z0)). Where the log-weight varies by less than
    SMOOTH_SPAN over the interval (flat or gently sloped, α → 0, e.g. an empty context) that
    formula cancels digits (μ and sd are huge); there Gauss–Legendre quadrature, accurate to
    ~1e-12 for such an integrand, is used instead. α is floored at a 1e-6 sd wide interval only
    to keep the discarded closed form finite."""
    width = upper - lower
    root = alpha.clamp_min((1e-6 / width) ** 2).sqrt()
    z_low = lower * root - beta / root
    z_high = upper * root - beta / root
    log_mass_std = log_normal_mass(z_low, z_high)
    log_mass = (beta / root).pow(2) / 2 - root.log() + 0.5 * math.log(2 * math.pi) + log_mass_std
    q = width * root * (z_high + z_low) / 2  # (z1² - z0²)/2: φ(z0) - φ(z1) = φ(z0)(1 - e^-q)
    log_density = -torch.where(q >= 0, z_low, z_high).pow(2) / 2 - 0.5 * math.log(2 * math.pi)
    log_gap = log_density + log1mexp(-q.abs().clamp_min(1e-300))  # log |φ(z0) - φ(z1)|
    mean_std = torch.sign(q) * (log_gap - log_mass_std).exp()
    mean = beta / root.pow(2) + mean_std / root
    span = q.abs() + (width * root).pow(2)  # bounds the log-weight's variation over the interval
    smooth = span < SMOOTH_SPAN
    if smooth.any():
        t, w = (torch.from_numpy(v).to(alpha) for v in np.polynomial.legendre.leggauss(GL_NODES))
        a = (lower + upper) / 2 + width / 2 * t
        exponent = a * beta[smooth, None] - a * a * alpha[smooth, None] / 2
        log_mass[smooth] = torch.logsumexp(exponent + (w * width / 2).log(), -1)
        mean[smooth] = (torch.softmax(exponent + w.log(), -1) * a).sum(-1)
    return log_mass, mean.clamp(lower, upper)


def gd1_step_size(context: Tensor, amplitude_min: float, amplitude_max: float, x_max: float,
                  noise_std: float) -> Tensor:
    """MSE-optimal step η of one GD step from θ = 0 (1/j-scaled gradient) per context size j.

    The prediction is c g with g = ψ_qᵀ Σ_k ψ_k y_k and c = η/j, so the best c is E[g y_q] / E[g²].
    With the raw second moments Σθ = E[θθᵀ] = (E[a²]/2) I (φ ~ U[0, π] gives
    E cos²φ = E sin²φ = 1/2, E cos φ sin φ = 0) and M = E[ψψᵀ] for x ~ U[-L, L],
    diag(1/2 - sin(2L)/(4L), 1/2 + sin(2L)/(4L)), and |ψ| = 1:
        E[g y_q] = j tr(M Σθ M),
        E[g²]    = j E[(ψᵀMψ)(ψᵀΣθψ)] + j σ² tr(M²) + j(j-1) tr(M Σθ M²),
    and with s = E[a²]/2: tr(M Σθ M) = s tr M², E[(ψᵀMψ)(ψᵀΣθψ)] = s E[ψᵀMψ] = s tr M²,
    tr(M Σθ M²) = s tr M³, so c = s tr M² / (s tr M² + σ² tr M² + (j-1) s tr M³)."""
    j = context.to(torch.float64)
    s = (amplitude_max ** 3 - amplitude_min ** 3) / (3 * (amplitude_max - amplitude_min)) / 2
    wobble = math.sin(2 * x_max) / (4 * x_max)
    m = (0.5 - wobble, 0.5 + wobble)
    tr2, tr3 = m[0] ** 2 + m[1] ** 2, m[0] ** 3 + m[1] ** 3
    c = s * tr2 / (s * tr2 + noise_std ** 2 * tr2 + (j - 1) * s * tr3)
    return torch.where(j > 0, j * c, torch.zeros_like(j))


class SineRegression(Task):
    family = "nonlinreg"
    kind = "vectors"
    description = ("in-context sinusoid regression y = a sin(x + φ) + noise, interleaved (x, y) "
                   "prompts (paper 002 §4.3, Finn et al. 2017)")

    Config = NonLinRegConfig

    @property
    def n_examples(self) -> int:
        return (self.config.seq_len + 1) // 2

    @property
    def input_dim(self) -> int:
        return 3

    @property
    def output_dim(self) -> int:
        return 1

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        c = self.config
        device = generator.device
        amplitude = c.amplitude_min + (c.amplitude_max - c.amplitude_min) * torch.rand(
            n, generator=generator, device=device)
        phase = math.pi * torch.rand(n, generator=generator, device=device)
        x = c.x_max * (2 * torch.rand(n, self.n_examples, generator=generator, device=device) - 1)
        noise = torch.randn(n, self.n_examples, generator=generator, device=device)
        y = amplitude[:, None] * torch.sin(x + phase[:, None]) + c.noise_std * noise
        inputs, targets, loss_mask = interleave(x.unsqueeze(-1), y.unsqueeze(-1), c.seq_len)
        if c.score == "last":
            loss_mask = last_scored(loss_mask)
        return Batch(inputs, targets, loss_mask, {"amplitude": amplitude, "phase": phase})

    # --- what the references see ---------------------------------------------------------
    def examples(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """x (B, n) and y (B, n) in float64, read from the inputs (y of a trailing query is 0)."""
        x, y = split_interleaved(batch.inputs.to(torch.float64), 1, 1)
        return x.squeeze(-1), y.squeeze(-1)

    def prefix_statistics(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """S = Σ_{k<j} ψ_k ψ_kᵀ (B, n, 2, 2), b = Σ_{k<j} ψ_k y_k (B, n, 2), ψ(x_j) (B, n, 2)."""
        x, y = self.examples(batch)
        psi = features(x)
        gram = exclusive_cumsum(psi.unsqueeze(-1) * psi.unsqueeze(-2))
        moment = exclusive_cumsum(psi * y.unsqueeze(-1))
        return gram, moment, psi

    def phase_nodes(self, grid_phase: int | None = None) -> Tensor:
        """Midpoint nodes of φ ∈ [0, π], shape (n_φ,)."""
        n_phi = grid_phase or self.config.grid_phase
        return math.pi * (torch.arange(n_phi, dtype=torch.float64) + 0.5) / n_phi

    def posterior_mean(self, batch: Batch, grid_phase: int | None = None) -> Tensor:
        """E[θ | examples before each query], (B, n, 2).

        Along the ray θ = a e_φ, e_φ = (cos φ, sin φ), the log-likelihood is a β - a² α / 2 with
        β = e_φᵀb/σ² and α = e_φᵀSe_φ/σ², so the integral over a ∈ [a_min, a_max] is exact
        (`ray_integral`); the integral over φ is the midpoint rule with grid_phase nodes."""
        c = self.config
        gram, moment, _ = self.prefix_statistics(batch)
        phase = self.phase_nodes(grid_phase).to(gram.device)
        direction = torch.stack([torch.cos(phase), torch.sin(phase)], dim=-1)  # (n_φ, 2)
        means = []
        rows = max(1, RAY_CHUNK // (gram.shape[1] * len(phase)))  # sequences per chunk
        for gram_part, moment_part in zip(gram.split(rows), moment.split(rows)):
            beta = moment_part @ direction.T / c.noise_std ** 2  # (b, n, n_φ)
            alpha = ((gram_part @ direction.T) * direction.T).sum(-2) / c.noise_std ** 2
            log_mass, mean_amplitude = ray_integral(alpha, beta, c.amplitude_min,
                                                    c.amplitude_max)
            means.append((torch.softmax(log_mass, dim=-1) * mean_amplitude) @ direction)
        return torch.cat(means)

    def _bayes(self, batch: Batch) -> Tensor:
        _, _, psi = self.prefix_statistics(batch)
        prediction = (self.posterior_mean(batch) * psi).sum(-1, keepdim=True)
        return to_positions(prediction, self.config.seq_len)

    def _gd1(self, batch: Batch) -> Tensor:
        c = self.config
        _, moment, psi = self.prefix_statistics(batch)
        context = torch.arange(self.n_examples, dtype=torch.float64)
        eta = gd1_step_size(context, c.amplitude_min, c.amplitude_max, c.x_max, c.noise_std)
        rate = (eta / context.clamp_min(1)).to(moment)
        prediction = rate * (moment * psi).sum(-1)
        return to_positions(prediction.unsqueeze(-1), c.seq_len)

    def _knn(self, batch: Batch) -> Tensor:
        x, y = self.examples(batch)
        n = self.n_examples
        earlier = torch.ones(n, n, dtype=torch.bool, device=x.device).tril(-1)  # [query, example]
        distance = (x.unsqueeze(-1) - x.unsqueeze(-2)).abs().masked_fill(~earlier, math.inf)
        k = min(self.config.knn_k, n)
        nearest, index = distance.topk(k, dim=-1, largest=False)
        found = nearest.isfinite()
        neighbours = torch.gather(y.unsqueeze(1).expand(-1, n, -1), 2, index)
        total = (neighbours * found).sum(-1)
        prediction = total / found.sum(-1).clamp_min(1)
        return to_positions(prediction.unsqueeze(-1), self.config.seq_len)

    def _oracle(self, batch: Batch) -> Tensor:
        x, _ = self.examples(batch)
        a = batch.latent["amplitude"].to(x)
        phi = batch.latent["phase"].to(x)
        prediction = a[:, None] * torch.sin(x + phi[:, None])
        return to_positions(prediction.unsqueeze(-1), self.config.seq_len)

    def references(self) -> dict[str, Reference]:
        c = self.config
        return {
            "bayes": Reference("bayes", "bayes",
                               f"posterior mean, exact in a, {c.grid_phase}-node midpoint rule "
                               "in φ", self._bayes),
            "gd1": Reference("gd1", "baseline",
                             "one GD step from 0 on the features (sin x, cos x), closed-form "
                             "MSE-optimal step per context size", self._gd1),
            "knn": Reference("knn", "baseline",
                             f"mean y of the {c.knn_k} context examples nearest in x", self._knn),
            "oracle": Reference("oracle", "bound",
                                "the true a sin(x + φ) (noise floor σ²)", self._oracle),
        }
