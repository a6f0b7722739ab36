"""tasks/lgssm.py: the random LG-SSM sampler against its definition (paper 004 appendix B.1), the
Kalman filter against dense Gaussian conditioning, the erm baseline against its objective, the
prior in the Bayes reference's coordinates against the task's, and the Bayes reference against
the properties of the posterior predictive mean (tests/test_smc.py checks its sampler against
exact quadrature)."""
import dataclasses
import math
from pathlib import Path

import pytest
import torch
import yaml

from bench.training.evaluate import score
from tasks import task_families
from tasks.base import Batch, make_generator
from tasks.lgssm import (ERROR_BIN_EDGES, LGSSMConfig, LGSSMPrior, LGSSMTask, eigh_where,
                         binned_excess, error_distribution, error_moments, kalman_filter, linear_recurrence, pooled_ridge_mean,
                         random_orthogonal, simulate, simulate_sequential, stationary_covariance,
                         symmetric_from_upper, upper_of_symmetric)
from tasks.smc import Particles, Streams, _independent_metropolis_move, kalman_start

Z = 4.0  # tolerance of the statistical checks, in standard errors
EPS = torch.finfo(torch.float64).eps


def within_standard_errors(samples: torch.Tensor, expected: float) -> bool:
    """The sample mean is within Z standard errors of `expected`."""
    stderr = samples.std() / math.sqrt(samples.numel())
    return abs(samples.mean().item() - expected) <= Z * stderr.item()


def test_family_registered_and_yaml_lists_every_field():
    assert task_families()["lgssm"] is LGSSMTask
    text = (Path(__file__).parents[1] / "conf/task/lgssm.yaml").read_text()
    assert text.startswith("# ")
    values = yaml.safe_load(text)
    assert values.pop("family") == "lgssm"
    assert values == dataclasses.asdict(LGSSMConfig())


def test_batch_layout_and_reproducibility():
    task = LGSSMTask(LGSSMConfig(seq_len=10))
    batch = task.sample(5, make_generator(7))
    again = task.sample(5, make_generator(7))
    other = task.sample(5, make_generator(8))
    assert batch.inputs.shape == batch.targets.shape == (5, 10, 2)
    assert batch.inputs.dtype == torch.float32
    assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])  # targets are the next x
    assert batch.loss_mask.all() and batch.loss_mask.shape == (5, 10)
    assert torch.equal(batch.inputs, again.inputs) and torch.equal(batch.latent["A"],
                                                                   again.latent["A"])
    assert not torch.equal(batch.inputs, other.inputs)
    assert task.input_dim == task.output_dim == 2


def test_random_orthogonal_is_orthogonal_with_haar_moments():
    d, n = 4, 4000
    q = random_orthogonal(n, d, make_generator(1))
    assert torch.allclose(q.mT @ q, torch.eye(d, dtype=q.dtype).expand(n, d, d), atol=1e-12)
    # Haar: every entry has mean 0 and variance 1/d (without the QR sign fix the diagonal is
    # biased towards positive values)
    assert within_standard_errors(q.diagonal(dim1=-2, dim2=-1).flatten(), 0.0)
    assert within_standard_errors(q[:, 0, 1] ** 2, 1 / d)


def test_system_parameters_follow_appendix_b1():
    c = LGSSMConfig(seq_len=2)
    theta = LGSSMTask(c).sample(1000, make_generator(2)).latent
    A, C, Q, R = theta["A"], theta["C"], theta["Q"], theta["R"]
    assert A.shape == (1000, 4, 4) and C.shape == (1000, 2, 4)
    assert Q.shape == (1000, 4, 4) and R.shape == (1000, 2, 2)
    for sym in (A, Q, R):
        assert torch.allclose(sym, sym.mT, atol=1e-12)
    eig_a = torch.linalg.eigvalsh(A)
    assert eig_a.min() >= c.eig_min - 1e-12 and eig_a.max() <= c.eig_max + 1e-12
    assert within_standard_errors(eig_a.flatten(), (c.eig_min + c.eig_max) / 2)  # uniform
    for cov, lo, hi in ((Q, c.state_noise_min, c.state_noise_max),
                        (R, c.obs_noise_min, c.obs_noise_max)):
        eig = torch.linalg.eigvalsh(cov)  # SPD, with log-uniform eigenvalues
        assert eig.min() >= lo * (1 - 1e-12) and eig.max() <= hi * (1 + 1e-12)
        assert within_standard_errors(eig.log().flatten(), (math.log(lo) + math.log(hi)) / 2)
    assert within_standard_errors(C.flatten(), 0.0)
    assert within_standard_errors(C.flatten() ** 2, 1.0)


def test_stationary_covariance_is_the_lyapunov_series():
    theta = LGSSMTask().sample(8, make_generator(3)).latent
    A, Q = theta["A"], theta["Q"]
    series, power = torch.zeros_like(Q), torch.eye(4, dtype=A.dtype).expand_as(A)
    for _ in range(600):  # 0.95^1200 is far below float64 resolution
        series = series + power @ Q @ power.mT
        power = power @ A
    assert torch.allclose(stationary_covariance(A, Q), series, rtol=1e-10, atol=1e-12)


def test_observations_are_stationary_from_the_first_step():
    """E|x_t|² = tr(C P∞ Cᵀ + R) and E x_{t+1}ᵀ x_t = tr(C A P∞ Cᵀ) at the first and last steps."""
    task = LGSSMTask(LGSSMConfig(seq_len=12))
    batch = task.sample(4000, make_generator(4))
    A, C, Q, R = (batch.latent[k] for k in "ACQR")
    P = stationary_covariance(A, Q)
    x = torch.cat([batch.inputs, batch.targets[:, -1:]], 1).double()
    variance = (C @ P @ C.mT + R).diagonal(dim1=-2, dim2=-1).sum(-1)
    lag_one = (C @ A @ P @ C.mT).diagonal(dim1=-2, dim2=-1).sum(-1)
    for t in (0, x.shape[1] - 2):
        assert within_standard_errors(x[:, t].square().sum(-1) - variance, 0.0)
        assert within_standard_errors((x[:, t + 1] * x[:, t]).sum(-1) - lag_one, 0.0)


def dense_observation_covariance(A, C, R, P, steps):
    """Cov of (x_1..x_steps) stacked, built directly: Cov(x_t, x_s) = C A^{t-s} P Cᵀ (t > s),
    C P Cᵀ + R on the diagonal, for a stationary start z_1 ~ N(0, P)."""
    m = C.shape[0]
    cov = torch.zeros(steps * m, steps * m, dtype=torch.float64)
    for t in range(steps):
        for s in range(t + 1):
            block = C @ torch.linalg.matrix_power(A, t - s) @ P @ C.T + (R if t == s else 0)
            cov[t * m:(t + 1) * m, s * m:(s + 1) * m] = block
            cov[s * m:(s + 1) * m, t * m:(t + 1) * m] = block.T
    return cov


def sequential_recurrence(transition: torch.Tensor, drive: torch.Tensor) -> torch.Tensor:
    states = [drive[:, 0]]
    for t in range(1, drive.shape[1]):
        states.append((transition @ states[-1][..., None])[..., 0] + drive[:, t])
    return torch.stack(states, 1)


@pytest.mark.parametrize("length", [1, 2, 5, 64, 100])
def test_linear_recurrence_is_the_loop_up_to_rounding(length):
    """Non-symmetric A (|A| has spectral radius ~1.5: the envelope grows), lengths that are and
    are not powers of two. A computed sum of products is off by at most n·2eps·Σ|terms|, with n
    the operations on a term's path and Σ|terms| the loop on |A| and |drive| (it bounds every
    power of A the scan forms): a term passes ≤ L(d + 2) operations in the loop and
    ≤ log2(L)²(d + 1) in the scan, so n = 4L(d + 1) bounds both together."""
    d = 3
    g = make_generator(length)
    transition = torch.randn(4, d, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    drive = torch.randn(4, length, d, generator=g, dtype=torch.float64)
    fast, slow = linear_recurrence(transition, drive), sequential_recurrence(transition, drive)
    envelope = sequential_recurrence(transition.abs(), drive.abs())
    assert ((fast - slow).abs() <= 4 * length * (d + 1) * 2 * EPS * envelope).all()


@pytest.mark.parametrize("steps", [1, 2, 129])
def test_simulate_is_its_sequential_loop_up_to_rounding(steps):
    """The same draws, the states by a scan: equal to float64 rounding (measured ~5e-16 of the
    largest |x|; allowed 1e-13)."""
    theta = LGSSMTask().draw_latent(16, make_generator(11))
    system = (theta["A"], theta["C"], theta["Q"], theta["R"],
              stationary_covariance(theta["A"], theta["Q"]))
    fast = simulate(*system, steps, make_generator(12))
    slow = simulate_sequential(*system, steps, make_generator(12))
    assert fast.shape == slow.shape == (16, steps, 2)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-13 * float(slow.abs().max()))


def test_kalman_filter_equals_dense_gaussian_conditioning():
    T, m = 7, 2
    task = LGSSMTask(LGSSMConfig(seq_len=T))
    batch = task.sample(6, make_generator(5))
    kalman = task.clairvoyant(batch)
    for b in range(len(batch)):
        A, C, Q, R = (batch.latent[k][b] for k in "ACQR")
        P = stationary_covariance(A, Q)
        filt = kalman_filter(batch.inputs[b].double(), A, C, Q, R, P)
        x = torch.cat([batch.inputs[b], batch.targets[b, -1:]]).double().flatten()
        cov = dense_observation_covariance(A, C, R, P, T + 1)
        for t in range(1, T + 1):  # predict x_{t+1} from x_1..x_t
            past, nxt = slice(0, t * m), slice(t * m, (t + 1) * m)
            weights = torch.linalg.solve(cov[past, past], cov[past, nxt]).T
            assert torch.allclose(kalman[b, t - 1], weights @ x[past], atol=1e-10)
            cond_cov = cov[nxt, nxt] - weights @ cov[past, nxt]
            assert torch.allclose(filt.next_cov[t - 1], cond_cov, atol=1e-10)
        whole = slice(0, T * m)
        dense_ll = torch.distributions.MultivariateNormal(
            torch.zeros(T * m, dtype=torch.float64), cov[whole, whole]).log_prob(x[whole])
        assert torch.allclose(filt.log_lik.sum(), dense_ll, atol=1e-9)


def test_clairvoyant_error_equals_its_predicted_variance():
    """Kalman innovations are white with covariance next_cov, so the mean squared error of the
    clairvoyant equals the mean of tr(next_cov)/m; erm, which ignores the dynamics, is worse."""
    task = LGSSMTask(LGSSMConfig(seq_len=24))
    batch = task.sample(2000, make_generator(6))
    A, C, Q, R = (batch.latent[k] for k in "ACQR")
    filt = kalman_filter(batch.inputs.double(), A, C, Q, R, stationary_covariance(A, Q))
    loss = task.position_loss(filt.next_mean, batch.targets.double())
    predicted = filt.next_cov.diagonal(dim1=-2, dim2=-1).mean(-1)
    assert within_standard_errors((loss - predicted).mean(1), 0.0)
    gap = task.position_loss(task.erm(batch), batch.targets.double()) - loss
    assert gap.mean() > Z * gap.mean(1).std() / math.sqrt(len(batch))


def test_lemma_4_1_references_on_sequences_of_different_systems():
    """Paper 004 Lemma 4.1 with each sequence's own θ: the recursion (A - K_t C) h + K_t x with
    the predictor's gain is the clairvoyant Kalman filter to rounding; with the filter's gain and
    the state read as ẑ_{t|t}, as the lemma writes it, its predictions and loss are off."""
    task = LGSSMTask(LGSSMConfig(seq_len=24, bayes_particles=0))
    batch = task.held_out(300)
    clairvoyant = task.clairvoyant(batch)
    torch.testing.assert_close(task.lemma41(batch), clairvoyant, rtol=0, atol=1e-12)
    as_written = task.lemma41(batch, as_written=True)
    assert (as_written - clairvoyant).abs().amax() > 0.1
    y = batch.targets.double()
    excess = (task.position_loss(as_written, y) - task.position_loss(clairvoyant, y)).mean(1)
    assert excess.mean() > Z * excess.std() / math.sqrt(len(batch))


@pytest.mark.parametrize("ridge", [0.0, 0.7])
def test_erm_is_the_ridge_argmin(ridge):
    x = torch.randn(3, 9, 2, dtype=torch.float64, generator=make_generator(7))
    predicted = pooled_ridge_mean(x, ridge)
    for t in range(1, 10):
        # argmin_y Σ_i ||y - x_i||² + λ||y||² as a least-squares problem [I; ...; I; √λ I] y
        design = torch.cat([torch.eye(2, dtype=x.dtype)] * t
                           + [math.sqrt(ridge) * torch.eye(2, dtype=x.dtype)])
        for b in range(3):
            rhs = torch.cat([x[b, :t].flatten(), torch.zeros(2, dtype=x.dtype)])
            y = torch.linalg.lstsq(design, rhs.unsqueeze(-1)).solution.squeeze(-1)
            assert torch.allclose(predicted[b, t - 1], y, atol=1e-12)


@pytest.mark.parametrize("bad", [dict(eig_max=1.0), dict(eig_min=0.9, eig_max=0.8),
                                 dict(state_noise_min=0.0), dict(erm_ridge=-1.0),
                                 dict(seq_len=0), dict(bayes_particles=1),
                                 dict(bayes_particles=-2), dict(bayes_moves=-1)])
def test_config_rejects_invalid_values(bad):
    with pytest.raises(ValueError):
        LGSSMConfig(**bad)


# --- the Bayes reference ----------------------------------------------------------------------
def observable_moments(A, C, Q, R):
    """Moments of x that do not depend on the basis of the latent state: Cov(x_t) and
    Cov(x_{t+1}, x_t), flattened (n, 2m²)."""
    P = stationary_covariance(A, Q)
    return torch.cat([(C @ P @ C.mT + R).flatten(1), (C @ A @ P @ C.mT).flatten(1)], 1)


def test_sampler_coordinates_carry_the_task_prior():
    """Systems drawn in LGSSMPrior's coordinates (diagonal A, canonical signs and order) and
    systems drawn by the task give x the same law: the moments of x agree in mean and spread
    (two-sample z within Z)."""
    config = LGSSMConfig()
    prior = LGSSMPrior(config)
    log_density, system = prior.evaluate(prior.sample((4000,), make_generator(20)))
    assert torch.isfinite(log_density).all()
    basis = system.obs_basis.movedim((0, 1), (-2, -1))
    ours = observable_moments(torch.diag_embed(system.transition.T),
                              system.emission.movedim((0, 1), (-2, -1)),
                              system.state_noise.movedim((0, 1), (-2, -1)),
                              basis @ torch.diag_embed(system.obs_variances.T) @ basis.mT)
    theta = LGSSMTask(config).draw_latent(4000, make_generator(21))
    theirs = observable_moments(theta["A"], theta["C"], theta["Q"], theta["R"])
    for a, b in ((ours, theirs), (ours.square(), theirs.square())):
        z = (a.mean(0) - b.mean(0)) / ((a.var(0) + b.var(0)) / len(a)).sqrt()
        assert z.abs().max() < Z, z


def test_moves_leave_the_prior_invariant():
    """With no observations the posterior is the prior, so 30 independent Metropolis-Hastings
    moves of prior draws must leave their law alone. Their acceptance uses the prior density in
    the sampler's coordinates (the Weyl Vandermonde factor included: without it the smallest of
    Q's four spectrum fractions moves from 0.20 to 0.14). Checked: the order statistics of the
    fractions of A's and Q's spectra (E = k/(d + 1) for sorted uniforms) and of R's, and C's
    moments (first row ≥ 0: E = √(2/π)); standard errors from 16 independent populations."""
    config = LGSSMConfig()
    prior = LGSSMPrior(config)
    generator = make_generator(22)
    start = prior.sample((16, 512), generator)
    log_prior, system = prior.evaluate(start)
    particles = Particles(start, log_prior, torch.zeros_like(log_prior), system,
                          kalman_start(system))
    no_observations = torch.zeros(16, 0, 2, dtype=torch.float64)
    for _ in range(30):
        particles, rate = _independent_metropolis_move(prior, particles, no_observations,
                                                       Streams([generator], [16]))
    moved = (particles.coords != start).any(0).double().mean()
    assert moved > 0.3, moved  # the prior is far from a Gaussian here: ~2.5% accepted a step
    fractions, emission, state_upper, obs_upper = particles.coords.split(prior.sizes)
    spectra = [torch.linalg.eigvalsh(symmetric_from_upper(upper.movedim(0, -1), dim)).movedim(-1, 0)
               for upper, dim in ((state_upper, 4), (obs_upper, 2))]
    checks = [(fractions, torch.arange(1, 5) / 5), (spectra[0], torch.arange(1, 5) / 5),
              (spectra[1], torch.arange(1, 3) / 3), (emission.square().mean(0, keepdim=True),
                                                     torch.ones(1)),
              (emission[:4].mean(0, keepdim=True), torch.full((1,), math.sqrt(2 / math.pi)))]
    for values, expected in checks:
        per_population = values.mean(-1)  # (k, 16)
        z = (per_population.mean(1) - expected) / (per_population.std(1) / 4)
        assert z.abs().max() < Z, (expected, per_population.mean(1))


def bayes_task(seq_len: int = 16, particles: int = 64) -> LGSSMTask:
    return LGSSMTask(LGSSMConfig(seq_len=seq_len, bayes_particles=particles))


def test_bayes_is_odd_in_the_observations():
    """p(x | θ) is a centred Gaussian, so p(θ | x) = p(θ | -x) and the posterior predictive mean
    is odd: E[x_{t+1} | -x_≤t] = -E[x_{t+1} | x_≤t]. The sampler sees the same likelihoods either
    way, so this holds exactly; averaged over the prior it is 0, the prior predictive mean, and
    so is the prediction from x_1 = 0."""
    task = bayes_task(12, 32)
    batch = task.held_out(6)
    flipped = Batch(-batch.inputs, -batch.targets, batch.loss_mask)
    assert torch.equal(task.bayes(flipped), -task.bayes(batch))
    zero = Batch(torch.zeros_like(batch.inputs), batch.targets, batch.loss_mask)
    assert (task.bayes(zero) == 0).all()


def test_bayes_lies_between_the_clairvoyant_filter_and_predictors_without_theta():
    """On 400 sequences: Bayes loses to the clairvoyant filter, which knows θ, and beats erm
    and a Kalman filter with one fixed θ drawn from the prior, each by Z standard errors
    (measured z 5.4, 14, 9.9). For a predictor f of the context the exact posterior mean b
    satisfies E loss(f) - E loss(b) = E|f - b|²/m; an estimate with independent Monte Carlo
    error ε gets -2E|ε|²/m more, which bayes_mc_inflation estimates (summarize), so the identity
    checks that bayes targets the posterior. For the clairvoyant c, E loss(b) - E loss(c)
    = E|b - c|²/m with or without ε."""
    task = bayes_task()
    batch = task.held_out(400)
    y = batch.targets.double()
    bayes = task.bayes(batch)
    runs = [task.bayes_run(run, batch) for run in range(2)]
    inflation = (runs[0] - runs[1]).square().mean(-1) / 4
    bayes_loss = task.position_loss(bayes, y)
    clairvoyant = task.clairvoyant(batch)
    gap = (bayes_loss - task.position_loss(clairvoyant, y)).mean(1)
    assert gap.mean() > Z * gap.std() / math.sqrt(len(gap))
    assert within_standard_errors(gap - task.position_loss(clairvoyant, bayes).mean(1), 0.0)
    fixed = task.draw_latent(1, make_generator(99))
    fixed_kalman = kalman_filter(batch.inputs.double(), fixed["A"], fixed["C"], fixed["Q"],
                                 fixed["R"], stationary_covariance(fixed["A"], fixed["Q"]))
    for other in (task.erm(batch), fixed_kalman.next_mean):
        gap = (task.position_loss(other, y) - bayes_loss).mean(1)
        assert gap.mean() > Z * gap.std() / math.sqrt(len(gap))
        identity = gap - task.position_loss(other, bayes).mean(1) + 2 * inflation.mean(1)
        assert within_standard_errors(identity, 0.0)


def test_bayes_is_the_mean_of_its_runs_and_they_are_scored_as_computed():
    task = bayes_task(10, 16)
    refs = task.references()
    assert [(name, ref.role) for name, ref in refs.items()] == [
        ("bayes", "bayes"), ("bayes_run1", "replicate"), ("bayes_run2", "replicate"),
        ("clairvoyant", "bound"), ("lemma41", "bound"), ("lemma41_as_written", "bound"),
        ("erm", "baseline")]
    batch = task.held_out(4)
    bayes = refs["bayes"].predict(batch)
    fresh = task.smc_runs(batch.inputs)
    assert torch.equal(bayes, (fresh[0] + fresh[1]) / 2)
    for _ in range(2):  # handed out once after bayes, then computed: the same either way
        assert torch.equal(refs["bayes_run1"].predict(batch), fresh[0])
        assert torch.equal(refs["bayes_run2"].predict(batch), fresh[1])
    assert list(bayes_task(10, 0).references()) == ["clairvoyant", "lemma41",
                                                    "lemma41_as_written", "erm"]


def test_summary_monte_carlo_error_estimators():
    """The Monte Carlo model: runs a, b = b* + independent N(0, σ²) errors around the exact
    predictor b*, bayes their mean. Over 400 draws of the errors (the sequences fixed):
    bayes_mc_inflation averages to E[L_bayes] - L_b* = σ²/2, and bayes_mc_stderr to the spread
    of the bin mean of L_bayes across draws; the excess over exact Bayes is the excess over
    bayes plus the inflation."""
    task = LGSSMTask(LGSSMConfig(seq_len=32, bayes_particles=0))
    generator = make_generator(23)
    n, sigma = 64, 0.1
    exact = torch.randn(n, 32, 2, generator=generator, dtype=torch.float64)
    x = exact + torch.randn(n, 32, 2, generator=generator, dtype=torch.float64)
    mask = torch.ones(n, 32, dtype=torch.bool)
    batch = Batch(x, x, mask)
    model_loss = task.position_loss(exact + 0.3, x)
    inflations, stderrs, bayes_means = [], [], []
    for _ in range(400):
        a, b = (exact + sigma * torch.randn(n, 32, 2, generator=generator, dtype=torch.float64)
                for _ in range(2))
        losses = {"bayes": task.position_loss((a + b) / 2, x),
                  "bayes_run1": task.position_loss(a, x),
                  "bayes_run2": task.position_loss(b, x), "model": model_loss}
        summary = task.summarize(batch, losses)
        inflations.append(summary["bayes_mc_inflation"])
        stderrs.append(summary["bayes_mc_stderr"])
        bayes_means.append([float(losses["bayes"][:, k // 2:k].mean()) for k in (8, 16, 32)])
        excess = summary["excess_over_bayes"]["model"]
        assert summary["excess_over_exact_bayes"]["model"] == pytest.approx(
            [e + i for e, i in zip(excess, summary["bayes_mc_inflation"])], abs=1e-15)
    assert summary["context_lengths"] == [8, 16, 32]
    assert set(summary["excess_over_bayes"]) == {"model"}  # the runs are not predictors here
    inflations = torch.tensor(inflations)
    assert within_standard_errors(inflations.flatten() - sigma**2 / 2, 0.0)
    spread = torch.tensor(bayes_means).std(0)
    ratio = torch.tensor(stderrs).mean(0) / spread
    assert ((ratio > 0.85) & (ratio < 1.15)).all(), ratio  # the spread's own error: ~3.5%


def test_error_distribution_of_known_errors():
    """At one position (index 31: context k = 32) and only there, over the sequences scored
    there: the pooled mean of the coordinates, its standard error over sequences (a sequence's
    coordinates are one unit), the pooled standard deviation, and the counts on the fixed
    edges (the last bin holds its right edge; errors beyond the edges counted apart)."""
    errors = torch.full((4, 40, 2), 100.0)  # at every other position: beyond the edges
    errors[:, 31] = torch.tensor([[0.125, -0.375], [-8.0, 8.0], [9.0, 0.125], [-8.5, 0.25]])
    mask = torch.ones(4, 40, dtype=torch.bool)
    mask[3, 31] = False  # not scored there: not counted
    out = error_distribution({"model": errors}, mask, 31)
    scored = errors[:3, 31].double()
    mean, stderr = float(scored.mean()), float(scored.mean(1).std() / math.sqrt(3))
    assert (out["context_length"], out["position"], out["coordinates"]) == (32, 31, "pooled")
    assert out["count"]["model"] == 6
    assert out["mean"]["model"] == pytest.approx(mean, abs=1e-12)
    assert out["mean_stderr"]["model"] == pytest.approx(stderr, abs=1e-12)
    assert out["mean_ci"]["model"] == pytest.approx([mean - 1.96 * stderr, mean + 1.96 * stderr])
    assert out["std"]["model"] == pytest.approx(float(scored.flatten().std()), abs=1e-12)
    assert out["bin_edges"] == ERROR_BIN_EDGES and len(ERROR_BIN_EDGES) == 65
    expected = [0] * 64
    expected[0] = expected[63] = 1  # -8.0 and 8.0, the outer edges
    expected[32] = 2  # 0.125 twice: [0, 0.25)
    expected[30] = 1  # -0.375: [-0.5, -0.25)
    assert out["histogram"]["model"] == expected
    assert (out["below"]["model"], out["above"]["model"]) == (0, 1)  # 9.0; -8.5 is unscored


def test_error_distribution_of_a_reference_without_errors():
    out = error_distribution({"bayes": torch.zeros(5, 32, 2)}, torch.ones(5, 32, dtype=torch.bool),
                             31)
    assert (out["mean"]["bayes"], out["mean_stderr"]["bayes"], out["std"]["bayes"]) == (0, 0, 0)
    assert out["mean_ci"]["bayes"] == [0, 0]
    assert out["histogram"]["bayes"] == [0] * 32 + [10] + [0] * 31  # all in [0, 0.25)


def test_the_evaluation_gives_summarize_the_signed_errors_at_k_32():
    """The scored predictions' errors reach the summary: a model that is the clairvoyant filter
    shifted by 0.5 has its errors' mean 0.5 higher and the same spread; the runs of bayes are
    no predictors; a task shorter than k = 32 has no error distribution."""
    task = LGSSMTask(LGSSMConfig(seq_len=32, bayes_particles=0))
    batch = task.held_out(64)
    predictions = {name: ref.predict(batch) for name, ref in task.references().items()}
    predictions["model"] = (predictions["clairvoyant"] + 0.5).float()
    found = score(task, batch, predictions, resamples=10)["metrics"]["task"]["error_distribution"]
    direct = predictions["clairvoyant"][:, 31] - batch.targets[:, 31].double()
    assert set(found["std"]) == {"clairvoyant", "lemma41", "lemma41_as_written", "erm", "model"}
    assert found["mean"]["clairvoyant"] == pytest.approx(float(direct.mean()), abs=1e-6)
    assert found["std"]["clairvoyant"] == pytest.approx(float(direct.flatten().std()), rel=1e-6)
    assert found["mean"]["model"] - found["mean"]["clairvoyant"] == pytest.approx(0.5, abs=1e-5)
    assert found["std"]["model"] == pytest.approx(found["std"]["clairvoyant"], rel=1e-5)
    assert sum(found["histogram"]["erm"]) + found["below"]["erm"] + found["above"]["erm"] == 128
    short = LGSSMTask(LGSSMConfig(seq_len=16, bayes_particles=0))
    batch = short.held_out(4)
    predictions = {name: ref.predict(batch) for name, ref in short.references().items()}
    assert "error_distribution" not in score(short, batch, predictions, 10)["metrics"]["task"]


def test_error_moments_give_the_distributions_mean_and_std():
    """Each sequence's mean error and mean squared error at the position: the mean of the first
    is error_distribution's mean, and pooled_std of the two means (count = sequences x
    coordinates) its std; only where every sequence is scored there."""
    from tasks.stats import pooled_std
    generator = torch.Generator().manual_seed(7)
    errors = torch.randn(50, 40, 3, generator=generator) * 1.7 + 0.3
    mask = torch.ones(50, 40, dtype=torch.bool)
    out, moments = error_distribution({"m": errors}, mask, 31), error_moments({"m": errors}, mask, 31)
    assert moments["coordinates"] == 3 and moments["mean"]["m"].shape == (50,)
    assert float(moments["mean"]["m"].mean()) == pytest.approx(out["mean"]["m"], rel=1e-12)
    std = pooled_std(moments["mean"]["m"].mean(), moments["square"]["m"].mean(), 150)
    assert float(std) == pytest.approx(out["std"]["m"], rel=1e-12)
    mask[7, 31] = False
    assert error_moments({"m": errors}, mask, 31) is None


def test_binned_excess_gives_the_excess_over_bayes_per_sequence():
    """Each sequence's mean excess over bayes in each context-length bin: their mean over the
    sequences is summarize's excess_over_bayes (binned_means, its definition) bin by bin, and a
    bin where some sequence has no scored position is left out, not averaged over fewer."""
    from tasks.base import doubling_lengths
    from tasks.stats import binned_means
    generator = torch.Generator().manual_seed(8)
    losses = {n: torch.rand(40, 64, generator=generator, dtype=torch.float64) * (1 + i)
              for i, n in enumerate(("bayes", "model", "erm"))}
    mask = torch.ones(40, 64, dtype=torch.bool)
    mask[3, 4:8] = False  # sequence 3 has no scored position in the bin 4 < t <= 8
    ks = doubling_lengths(8, 64)
    found = binned_excess(losses, "bayes", mask, ks)
    assert set(found) == {"model", "erm"} and set(found["model"]) == {"1", "2", "3"}
    for name in ("model", "erm"):
        means, _ = binned_means(losses[name] - losses["bayes"], mask, ks)
        for i, values in found[name].items():
            assert values.shape == (40,)
            assert float(values.mean()) == pytest.approx(means[int(i)], rel=1e-12)


def test_the_evaluation_records_the_error_moments_per_sequence():
    """score keeps summarize_sequences' values in per_sequence.task, one rounded number per
    held-out sequence, and a value of the wrong shape is an error, not a record."""
    from bench.training.evaluate import recorded_sequences
    task = LGSSMTask(LGSSMConfig(seq_len=32, bayes_particles=0))
    batch = task.held_out(16)
    predictions = {name: ref.predict(batch) for name, ref in task.references().items()}
    predictions["model"] = (predictions["clairvoyant"] + 0.5).float()
    found = score(task, batch, predictions, resamples=10)["per_sequence"]["task"]
    moments = found["error_distribution"]
    assert moments["coordinates"] == 2 and set(moments["mean"]) == set(moments["square"])
    error = predictions["clairvoyant"][:, 31] - batch.targets[:, 31].double()
    assert moments["square"]["clairvoyant"] == pytest.approx(error.square().mean(1).tolist(),
                                                             rel=1e-6)
    with pytest.raises(ValueError, match="one value per held-out sequence"):
        recorded_sequences({"x": {"y": torch.zeros(3, 2)}}, 3)


def test_eigh_where_decomposes_the_chosen_matrices_as_eigh_of_all():
    """Spectra and bases where the mask holds, bitwise those of one eigh of every matrix (and
    in its layout); zero spectra and identity bases elsewhere."""
    matrices = torch.randn(3, 7, 4, 4, generator=make_generator(16), dtype=torch.float64)
    matrices = matrices + matrices.mT
    mask = torch.rand(3, 7, generator=make_generator(17)) < 0.6
    spectrum, basis = eigh_where(mask, upper_of_symmetric(matrices).movedim(-1, 0), 4)
    all_spectrum, all_basis = torch.linalg.eigh(matrices)
    assert torch.equal(spectrum[mask], all_spectrum[mask])
    assert torch.equal(basis[mask], all_basis[mask]) and basis.stride()[-2:] == (1, 4)
    assert (spectrum[~mask] == 0).all() and torch.equal(basis[~mask],
                                                       torch.eye(4).expand(int((~mask).sum()),
                                                                           4, 4).double())
