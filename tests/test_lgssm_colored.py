"""tasks/lgssm_colored.py: the AR(1)-in-AR(1) sampler against its definition (paper 004 appendix
A.3, B.2), every reference against dense Gaussian algebra, the Bayes quadrature against the
identities only the exact posterior mean satisfies, and the excess-risk summary."""
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tasks import task_families
from tasks.base import TEST_STREAM, make_generator
from tasks.lgssm import kalman_filter
from tasks.lgssm_colored import (LGSSMColoredConfig, LGSSMColoredTask, colored_noise_filter,
                                 colored_noise_system, fitted_predictions, loglog_slope,
                                 stationary_ar1, stationary_ar1_sequential,
                                 white_noise_next_means)

Z = 4.0  # tolerance of the statistical checks, in standard errors
A = 0.9  # the signal's AR coefficient (paper 004 B.2)


def mean_within_standard_errors(samples: torch.Tensor, expected: float) -> bool:
    stderr = samples.std() / math.sqrt(samples.numel())
    return abs(samples.mean().item() - expected) <= Z * stderr.item()


def test_family_registered_and_yaml_lists_every_field():
    assert task_families()["lgssm_colored"] is LGSSMColoredTask
    text = (Path(__file__).parents[1] / "conf/task/lgssm_colored.yaml").read_text()
    assert text.startswith("# ")
    values = yaml.safe_load(text)
    assert values.pop("family") == "lgssm_colored"
    assert values == dataclasses.asdict(LGSSMColoredConfig())


def test_stationary_ar1_has_unit_variance_and_lag_one_correlation_rho():
    rho = torch.full((20000,), 0.95, dtype=torch.float64)
    v = stationary_ar1(rho, torch.sqrt(1 - rho**2), 40, make_generator(1))
    for t in (0, 38):  # stationary from the first step: Var v_t = 1, E v_{t+1} v_t = ρ
        assert mean_within_standard_errors(v[:, t] ** 2, 1.0)
        assert mean_within_standard_errors(v[:, t + 1] * v[:, t], 0.95)
    assert mean_within_standard_errors(v[:, 20], 0.0)


@pytest.mark.parametrize("steps", [1, 2, 257])
def test_stationary_ar1_is_its_sequential_loop_up_to_rounding(steps):
    """The same draws, the path by a scan: equal to float64 rounding (measured ~1e-15 of the
    largest |y|; allowed 1e-13)."""
    rho = torch.linspace(0.9, 0.99, 8, dtype=torch.float64)
    fast = stationary_ar1(rho, torch.sqrt(1 - rho**2), steps, make_generator(5))
    slow = stationary_ar1_sequential(rho, torch.sqrt(1 - rho**2), steps, make_generator(5))
    assert fast.shape == slow.shape == (8, steps)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-13 * float(slow.abs().max()))


def test_observation_autocovariance_is_signal_plus_noise():
    """Cov(x_{t+h}, x_t) = a^h/(1-a²) + ρ^h for a stationary start."""
    task = LGSSMColoredTask(LGSSMColoredConfig(seq_len=30))
    batch = task.sample_at(20000, make_generator(2), rho=0.95)
    x = torch.cat([batch.inputs, batch.targets[:, -1:]], 1)[..., 0].double()
    for t in (0, 25):
        for h in (0, 1, 5):
            expected = A**h / (1 - A**2) + 0.95**h
            assert mean_within_standard_errors(x[:, t + h] * x[:, t], expected)


def test_training_uses_the_prior_and_held_out_the_evaluation_rho():
    config = LGSSMColoredConfig(seq_len=8)
    task = LGSSMColoredTask(config)
    rho = task.sample(4000, make_generator(3)).latent["rho"]
    assert rho.min() >= 0.9 and rho.max() <= 0.99
    assert mean_within_standard_errors(rho, 0.945)  # U(0.9, 0.99)
    assert mean_within_standard_errors((rho - 0.945) ** 2, 0.09**2 / 12)
    held = task.held_out(50)
    assert torch.all(held.latent["rho"] == 0.95)
    expected = task.sample_at(50, make_generator(TEST_STREAM, 0), rho=0.95)
    assert torch.equal(held.inputs, expected.inputs) and torch.equal(held.targets,
                                                                     expected.targets)
    prior_task = LGSSMColoredTask(dataclasses.replace(config, eval_rho=-1.0))
    prior_rho = prior_task.held_out(50).latent["rho"]
    assert prior_rho.min() >= 0.9 and prior_rho.max() <= 0.99 and prior_rho.std() > 0.01
    assert torch.equal(task.held_out(50).inputs, held.inputs)  # a fixed set


def dense_covariance(rho: float, steps: int, white_noise: bool = False) -> torch.Tensor:
    """Cov(x_s, x_t) = a^|t-s|/(1-a²) + ρ^|t-s| (or + δ_st when v is white)."""
    lag = torch.arange(steps, dtype=torch.float64)
    lag = (lag[:, None] - lag[None, :]).abs()
    noise = (lag == 0).double() if white_noise else rho**lag
    return A**lag / (1 - A**2) + noise


def dense_predictions(x: torch.Tensor, cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """E[x_{t+1} | x_1..x_t] and log p(x_1..x_t) for t = 1..len(x)-1, by dense conditioning."""
    means, log_liks = [], []
    for t in range(1, len(x)):
        weights = torch.linalg.solve(cov[:t, :t], cov[:t, t])
        means.append(weights @ x[:t])
        log_liks.append(torch.distributions.MultivariateNormal(
            torch.zeros(t, dtype=torch.float64), cov[:t, :t]).log_prob(x[:t]))
    return torch.stack(means), torch.stack(log_liks)


def full_sequences(batch) -> torch.Tensor:
    return torch.cat([batch.inputs, batch.targets[:, -1:]], 1)[..., 0].double()


def test_clairvoyant_and_misspecified_kalman_equal_dense_conditioning():
    T = 8
    task = LGSSMColoredTask(LGSSMColoredConfig(seq_len=T))
    batch = task.sample(5, make_generator(4))
    clairvoyant, misspecified = task.clairvoyant(batch), task.misspecified_kalman(batch)
    x = full_sequences(batch)
    for b in range(len(batch)):
        truth, _ = dense_predictions(x[b], dense_covariance(batch.latent["rho"][b].item(), T + 1))
        assert torch.allclose(clairvoyant[b, :, 0], truth, atol=1e-10)
        white, _ = dense_predictions(x[b], dense_covariance(0.0, T + 1, white_noise=True))
        assert torch.allclose(misspecified[b, :, 0], white, atol=1e-10)


def test_bayes_quadrature_equals_dense_mixture_over_the_grid():
    """Independent computation: Gauss-Legendre nodes from numpy, per node a dense Gaussian
    likelihood and conditional mean, mixed with posterior weights."""
    T, G = 6, 5
    task = LGSSMColoredTask(LGSSMColoredConfig(seq_len=T, grid_size=G))
    batch = task.sample(4, make_generator(5))
    bayes = task.bayes(batch)
    points, weights = np.polynomial.legendre.leggauss(G)
    nodes = 0.945 + 0.045 * points
    x = full_sequences(batch)
    for b in range(len(batch)):
        per_node = [dense_predictions(x[b], dense_covariance(r, T + 1)) for r in nodes]
        means = torch.stack([m for m, _ in per_node])  # (G, T)
        log_post = torch.stack([ll for _, ll in per_node]) + torch.tensor(weights).log()[:, None]
        mixture = (torch.softmax(log_post, 0) * means).sum(0)
        assert torch.allclose(bayes[b, :, 0], mixture, atol=1e-10)


def test_white_noise_means_are_the_kalman_filter_of_each_white_noise_model():
    batch = LGSSMColoredTask(LGSSMColoredConfig(seq_len=40)).sample(3, make_generator(6))
    x = batch.inputs.double()[..., 0]
    decays = torch.tensor([0.0, 0.5, 0.9, 0.99], dtype=torch.float64)
    variances = torch.tensor([1e-3, 1.0, 7.0, 100.0], dtype=torch.float64)
    one = torch.ones(4, 1, 1, dtype=torch.float64)
    a = decays[:, None, None]
    oracle = kalman_filter(x[:, None, :, None], a, one, one, variances[:, None, None],
                           one / (1 - a**2)).next_mean[..., 0]
    assert torch.allclose(white_noise_next_means(x, decays, variances), oracle, atol=1e-12)


def test_fitted_predictions_take_the_candidate_with_the_least_squared_context_error():
    """The definition by loops: at position t, sum each candidate's squared errors on the
    targets x_2..x_t it predicted, and take the first candidate with the smallest sum."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 9, generator=generator, dtype=torch.float64)
    means = torch.randn(3, 5, 9, generator=generator, dtype=torch.float64)
    means[:, 3] = means[:, 1]  # a tie: the first of the two must win
    got = fitted_predictions(means, x)
    for b in range(3):
        for t in range(9):
            losses = [sum((x[b, i + 1] - means[b, g, i]).item() ** 2 for i in range(t))
                      for g in range(5)]
            best = min(range(5), key=lambda g: (losses[g], g))
            assert got[b, t] == means[b, best, t]


def test_erm_fitted_is_least_squares_over_white_noise_models_by_dense_conditioning():
    """Independent computation of `erm_fitted`: per candidate (a, r) of the task's grid, the
    white-noise model's predictions by dense Gaussian conditioning, Cov(x_s, x_t) =
    a^|t-s|/(1-a²) + r δ_st; at each t the candidate with the least squared context error."""
    T = 6
    task = LGSSMColoredTask(LGSSMColoredConfig(seq_len=T))
    batch = task.sample(2, make_generator(8))
    got = task.erm_fitted(batch)[..., 0]
    decays, variances = task.fit_grid("cpu")
    assert (decays[0].item(), variances[0].item()) == (A, 1.0)  # the choice before any error
    lag = torch.arange(T + 1, dtype=torch.float64)
    lag = (lag[:, None] - lag[None, :]).abs()
    x = full_sequences(batch)  # x_1..x_{T+1}: inputs and the last target
    for b in range(2):
        candidates = []  # per candidate, its prediction of x_j from x_1..x_{j-1}, j = 1..T+1
        for a, r in zip(decays.tolist(), variances.tolist()):
            cov = a**lag / (1 - a**2) + r * (lag == 0).double()
            candidates.append([0.0] + [(torch.linalg.solve(cov[:j, :j], cov[:j, j])
                                        @ x[b, :j]).item() for j in range(1, T + 1)])
        for t in range(T):  # position t predicts x_{t+2} (1-based) from x_1..x_{t+1}
            losses = [sum((x[b, j].item() - c[j]) ** 2 for j in range(1, t + 1))
                      for c in candidates]
            best = min(range(len(candidates)), key=lambda g: (losses[g], g))
            assert abs(got[b, t].item() - candidates[best][t + 1]) < 1e-9


@pytest.mark.parametrize("grid_size", [3, 8])
def test_quadrature_rule_is_exact_for_polynomials_under_the_uniform_prior(grid_size):
    task = LGSSMColoredTask(LGSSMColoredConfig())
    nodes, log_weights = task.rho_grid(grid_size, "cpu")
    lo, hi = 0.9, 0.99
    for power in range(2 * grid_size):  # Gauss-Legendre: exact up to degree 2G - 1
        exact = (hi ** (power + 1) - lo ** (power + 1)) / ((power + 1) * (hi - lo))
        assert math.isclose((log_weights.exp() * nodes**power).sum().item(), exact,
                            rel_tol=1e-12)


def test_bayes_is_the_posterior_mean_under_the_training_prior():
    """Identities that hold only for the exact conditional mean b = E[x_{t+1} | x_1..x_t]:
    for any predictor f of the context, E loss(f) - E loss(b) = E (f - b)²; for the clairvoyant
    c = E[x_{t+1} | x_1..x_t, ρ], E loss(b) - E loss(c) = E (c - b)². So bayes beats every
    baseline, and no predictor without ρ can beat it."""
    task = LGSSMColoredTask(LGSSMColoredConfig(seq_len=48, eval_rho=-1.0))
    batch = task.held_out(600)
    y = batch.targets.double()
    bayes = task.bayes(batch)
    bayes_loss = task.position_loss(bayes, y)
    for name in ("misspecified_kalman", "erm", "erm_fitted"):
        other = task.references()[name].predict(batch)
        gap = (task.position_loss(other, y) - bayes_loss).mean(1)
        assert gap.mean() > Z * gap.std() / math.sqrt(len(gap))  # bayes is strictly better
        identity = gap - task.position_loss(other, bayes).mean(1)
        assert mean_within_standard_errors(identity, 0.0)
    clairvoyant = task.clairvoyant(batch)
    gap = (bayes_loss - task.position_loss(clairvoyant, y)).mean(1)
    assert mean_within_standard_errors(gap - task.position_loss(clairvoyant, bayes).mean(1), 0.0)


@pytest.mark.parametrize("eval_rho", [0.99, -1.0])
def test_bayes_quadrature_is_converged_at_the_default_grid(eval_rho):
    task = LGSSMColoredTask(LGSSMColoredConfig(seq_len=256, eval_rho=eval_rho))
    batch = task.held_out(100)
    y = batch.targets.double()
    default = task.quadrature_predictive(batch.inputs, task.config.grid_size)
    doubled = task.quadrature_predictive(batch.inputs, 2 * task.config.grid_size)
    excess = (task.position_loss(default, y) - task.position_loss(task.clairvoyant(batch), y))
    moved = task.position_loss(doubled, y) - task.position_loss(default, y)
    assert abs(moved.mean()) < 1e-2 * task.position_loss(default, y).mean()  # the brief's 1%
    assert abs(moved.mean()) < 1e-6 * abs(excess.mean())  # and of the excess over the bound
    assert (doubled - default).abs().max() < 1e-8


def test_summary_reports_binned_excess_risk_and_loglog_slope():
    task = LGSSMColoredTask(LGSSMColoredConfig(seq_len=100))
    t = torch.arange(1, 101, dtype=torch.float64)  # context length of each position
    bayes = torch.ones(3, 100, dtype=torch.float64)
    losses = {"model": bayes + 3.0 / t, "bayes": bayes, "clairvoyant": bayes - 0.1,
              "erm": bayes + 0.5 * t**-0.5}
    summary = task.summarize(None, losses)
    ks = [8, 16, 32, 64]
    assert summary["context_lengths"] == ks
    model = [sum(3.0 / c for c in range(k // 2 + 1, k + 1)) / (k - k // 2) for k in ks]
    assert np.allclose(summary["excess_over_bayes"]["model"], model, rtol=1e-12)
    fitted = np.polyfit(np.log(ks[2:]), np.log(model[2:]), 1)[0]  # the paper fits k >= 32
    assert math.isclose(summary["loglog_slope_over_bayes"]["model"], fitted, rel_tol=1e-9)
    assert abs(fitted + 1) < 0.02  # bins (k/2, k] keep a power law's exponent
    assert abs(summary["loglog_slope_over_bayes"]["erm"] + 0.5) < 0.02
    assert summary["loglog_slope_over_bayes"]["clairvoyant"] is None  # negative excess
    assert np.allclose(summary["excess_over_clairvoyant"]["bayes"], [0.1] * 4)
    assert summary["excess_over_bayes_stderr"]["model"] == [0.0] * 4
    assert loglog_slope([8, 16], [1.0, 0.5]) is None  # no k >= 32 to fit


def test_summary_reports_binned_mse_and_the_papers_loglog_slope_of_it():
    """B.2 regresses log(MSE) = β log k + c over k >= 32: an MSE that is a power law of the
    context length gives its exponent, for every predictor, references included; and the slope
    is defined where the excess over a reference is not (a model equal to bayes)."""
    task = LGSSMColoredTask(LGSSMColoredConfig(seq_len=256))
    t = torch.arange(1, 257, dtype=torch.float64)
    scale = 1 + 0.1 * torch.rand(5, 1, generator=torch.Generator().manual_seed(0),
                                 dtype=torch.float64)  # sequences differ: a standard error
    losses = {"model": 2.0 * scale * t**-0.7, "bayes": 2.0 * scale * t**-0.7,
              "clairvoyant": 0.5 * scale * t**-0.25}
    summary = task.summarize(None, losses)
    ks = summary["context_lengths"]
    assert ks == [8, 16, 32, 64, 128, 256]
    for name, loss in losses.items():
        per_sequence = torch.stack([loss[:, k // 2:k].mean(1) for k in ks], 1)
        assert np.allclose(summary["mse"][name], per_sequence.mean(0), rtol=1e-12)
        assert np.allclose(summary["mse_stderr"][name], per_sequence.std(0) / math.sqrt(5),
                           rtol=1e-9)
        fitted = np.polyfit(np.log(ks[2:]), np.log(summary["mse"][name][2:]), 1)[0]
        assert math.isclose(summary["loglog_slope_of_mse"][name], fitted, rel_tol=1e-12)
    assert abs(summary["loglog_slope_of_mse"]["model"] + 0.7) < 0.01  # bins keep the exponent
    assert abs(summary["loglog_slope_of_mse"]["clairvoyant"] + 0.25) < 0.01
    assert summary["loglog_slope_over_bayes"]["model"] is None  # log of a zero excess
    assert summary["excess_over_bayes"]["model"] == [0.0] * len(ks)  # kept beside the MSE


@pytest.mark.parametrize("bad", [dict(rho_min=0.0), dict(rho_max=1.0),
                                 dict(rho_min=0.95, rho_max=0.9), dict(eval_rho=1.0),
                                 dict(eval_rho=-0.5), dict(grid_size=0), dict(erm_ridge=-1.0)])
def test_config_rejects_invalid_values(bad):
    with pytest.raises(ValueError):
        LGSSMColoredConfig(**bad)


def test_a_summary_with_no_context_bin_warns_nothing():
    """At seq_len 1 no bin k >= 8 exists: torch's std() warned of zero degrees of freedom."""
    import warnings
    task = LGSSMColoredTask(LGSSMColoredConfig(seq_len=1))
    losses = {name: torch.ones(4, 1, dtype=torch.float64) for name in ("model", "bayes")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = task.summarize(None, losses)
    assert summary["context_lengths"] == [] and summary["mse_stderr"]["model"] == []


@pytest.mark.parametrize("known_decay", [True, False])
def test_colored_noise_filter_is_the_kalman_filter_of_each_node(known_decay):
    """The Bayes quadrature's filter, written out for the two diagonal states, against
    kalman_filter on colored_noise_system: every prediction and log-likelihood term, at nodes
    with a known signal coefficient and with one a node."""
    rho = torch.linspace(0.9, 0.99, 5, dtype=torch.float64)
    decay = 0.9 if known_decay else torch.linspace(0.0, 0.95, 5, dtype=torch.float64)
    x = torch.randn(3, 40, generator=make_generator(30), dtype=torch.float64)
    next_mean, log_lik = colored_noise_filter(x, rho, decay)
    dense = kalman_filter(x[:, None, :, None], *colored_noise_system(rho, decay))
    torch.testing.assert_close(next_mean, dense.next_mean[..., 0].permute(2, 0, 1),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(log_lik, dense.log_lik.permute(2, 0, 1), rtol=1e-12, atol=1e-12)
