"""tasks/nonlinreg.py: the sinusoid sampler against its definition (paper 002 §4.3, Finn et al.
2017), the exact ray integral and the Bayes quadrature against brute-force integration and
importance sampling, the grid's convergence, the optimality of the one-step-GD step size, and
Bayes beating every other reference on held-out data."""
import dataclasses
import math
from pathlib import Path

import pytest
import torch
import yaml

from tasks.stats import sequence_means
from tasks import task_families
from conftest import check_score_last
from tasks.base import make_generator
from tasks.nonlinreg import SineRegression, features, gd1_step_size, ray_integral

Z = 5.0  # tolerance of the statistical checks, in standard errors



def within(samples: torch.Tensor, expected: float) -> bool:
    stderr = samples.std().item() / math.sqrt(samples.numel())
    return abs(samples.mean().item() - expected) <= Z * stderr


def test_family_registered_and_yaml_lists_every_field():
    assert task_families()["nonlinreg"] is SineRegression
    text = (Path(__file__).parents[1] / "conf/task/nonlinreg.yaml").read_text()
    assert text.startswith("# ")
    values = yaml.safe_load(text)
    assert values.pop("family") == "nonlinreg"
    assert values == dataclasses.asdict(SineRegression.Config())
    with pytest.raises(ValueError, match="noise_std > 0"):
        SineRegression.Config(noise_std=0.0)


def test_sampler_moments_match_the_definition():
    """a ~ U[0.1, 5], φ ~ U[0, π], x ~ U[-5, 5], y - a sin(x + φ) ~ N(0, σ²)."""
    task = SineRegression(SineRegression.Config(seq_len=10, noise_std=0.3))
    batch = task.sample(20000, make_generator(1))
    a, phase = batch.latent["amplitude"].double(), batch.latent["phase"].double()
    assert a.min() >= 0.1 and a.max() <= 5 and phase.min() >= 0 and phase.max() <= math.pi
    assert within(a, 2.55) and within((a - 2.55) ** 2, 4.9 ** 2 / 12)
    assert within(phase, math.pi / 2) and within((phase - math.pi / 2) ** 2, math.pi ** 2 / 12)
    x, y = task.examples(batch)
    assert x.abs().max() <= 5
    assert within(x, 0.0) and within(x ** 2, 25 / 3)
    residual = y - a[:, None] * torch.sin(x + phase[:, None])
    assert within(residual, 0.0) and within(residual ** 2, 0.09)


def test_interleaved_layout():
    task = SineRegression(SineRegression.Config(seq_len=9))
    batch = task.sample(3, make_generator(2))
    assert batch.inputs.shape == (3, 9, 3) and task.input_dim == 3 and task.output_dim == 1
    x, y = batch.inputs[:, 0::2, 0], batch.inputs[:, 1::2, 1]
    assert torch.equal(batch.inputs[:, 0::2, 1:], torch.stack([0 * x, 1 + 0 * x], -1))
    assert torch.equal(batch.inputs[:, 1::2, ::2], torch.zeros(3, 4, 2))
    assert torch.equal(batch.targets[:, 0::2, 0][:, :4], y)  # y_k is the target at x_k
    assert batch.loss_mask[:, 0::2].all() and not batch.loss_mask[:, 1::2].any()
    truth = batch.latent["amplitude"][:, None] * torch.sin(x + batch.latent["phase"][:, None])
    assert (batch.targets[:, 0::2, 0] - truth).abs().max() < 1  # σ = 0.1


def test_references_are_causal():
    task = SineRegression(SineRegression.Config(seq_len=12, grid_phase=64))
    batch = task.sample(6, make_generator(3))
    changed = dataclasses.replace(batch, inputs=batch.inputs.clone())
    changed.inputs[:, 7:] = torch.randn_like(changed.inputs[:, 7:])
    for name, ref in task.references().items():
        before, after = ref.predict(batch), ref.predict(changed)
        assert before.shape == (6, 12, 1)
        assert torch.equal(before[:, :7], after[:, :7]), name


def test_ray_integral_matches_brute_force_quadrature():
    """log ∫ exp(aβ - a²α/2) da over [0.1, 5] and the mean of a, against a 400001-node midpoint
    rule; cases: empty context, nearly flat, sloped, peaked inside, peaked far outside on either
    side (there the midpoint rule's own error is ~1e-6, halving the spacing quarters it)."""
    alpha = torch.tensor([0.0, 1e-13, 1e-9, 1e-8, 1e-6, 0.5, 0.3, 40.0, 1e3, 1e4, 100.0, 100.0],
                         dtype=torch.float64)
    beta = torch.tensor([0.0, 1e-7, 3e-5, 2e-2, -2e-3, -1.0, 1.5, 100.0, 2550.0, 2.5e4, -300.0,
                         900.0], dtype=torch.float64)
    log_mass, mean = ray_integral(alpha, beta, 0.1, 5.0)
    nodes = 400001
    a = 0.1 + 4.9 * (torch.arange(nodes, dtype=torch.float64) + 0.5) / nodes
    exponent = a * beta[:, None] - a ** 2 * alpha[:, None] / 2
    expected_log_mass = torch.logsumexp(exponent, -1) + math.log(4.9 / nodes)
    expected_mean = (torch.softmax(exponent, -1) * a).sum(-1)
    assert torch.allclose(log_mass, expected_log_mass, rtol=0, atol=2e-6)
    assert torch.allclose(mean, expected_mean, rtol=0, atol=2e-8)


def brute_force_posterior_mean(task: SineRegression, batch, n_a: int, n_phi: int):
    """E[θ | data] by a plain 2-D midpoint rule over (a, φ) with the full Gaussian likelihood."""
    c = task.config
    x, y = task.examples(batch)
    a = c.amplitude_min + (c.amplitude_max - c.amplitude_min) * (torch.arange(n_a) + 0.5) / n_a
    phi = math.pi * (torch.arange(n_phi) + 0.5) / n_phi
    a, phi = [t.double().reshape(-1) for t in torch.meshgrid(a, phi, indexing="ij")]
    theta = torch.stack([a * torch.cos(phi), a * torch.sin(phi)], -1)
    out = torch.zeros(*x.shape, 2, dtype=torch.float64)
    log_lik = torch.zeros(x.shape[0], len(a), dtype=torch.float64)
    for j in range(x.shape[1]):
        out[:, j] = torch.softmax(log_lik, -1) @ theta
        fit = a * torch.sin(x[:, j, None] + phi)
        log_lik = log_lik - (y[:, j, None] - fit) ** 2 / (2 * c.noise_std ** 2)
    return out


def test_bayes_matches_brute_force_grid_and_importance_sampling():
    task = SineRegression()
    batch = task.held_out(3)
    posterior = task.posterior_mean(batch)
    brute = brute_force_posterior_mean(task, batch, 1000, 2000)
    assert (posterior - brute).abs().max() < 1e-4
    # Self-normalised importance sampling with the prior as proposal, for short contexts.
    x, y = task.examples(batch)
    gen = make_generator(4)
    draws = 1_000_000
    a = 0.1 + 4.9 * torch.rand(draws, generator=gen, dtype=torch.float64)
    phi = math.pi * torch.rand(draws, generator=gen, dtype=torch.float64)
    for b in range(3):
        for j in (1, 2):
            log_lik = -((y[b, :j, None] - a * torch.sin(x[b, :j, None] + phi)) ** 2).sum(0) / 0.02
            weight = torch.softmax(log_lik, 0)
            prediction = a * torch.sin(x[b, j] + phi)
            estimate = (weight * prediction).sum()
            stderr = (weight ** 2 * (prediction - estimate) ** 2).sum().sqrt()
            bayes = (posterior[b, j] * features(x[b, j])).sum()
            assert abs(estimate - bayes) <= Z * stderr + 1e-9, (b, j, estimate, bayes, stderr)
            assert stderr < 0.05


def test_bayes_grid_has_converged():
    """Doubling the φ grid moves the held-out Bayes loss by far less than 1%."""
    task = SineRegression()
    batch = task.held_out(300)
    _, _, psi = task.prefix_statistics(batch)
    y = task.examples(batch)[1]
    loss, prediction = {}, {}
    for nodes in (task.config.grid_phase, 2 * task.config.grid_phase):
        prediction[nodes] = (task.posterior_mean(batch, nodes) * psi).sum(-1)
        loss[nodes] = (prediction[nodes] - y).pow(2).mean().item()
    (base, base_prediction), (double, double_prediction) = zip(loss.values(), prediction.values())
    assert abs(double - base) / base < 1e-3
    assert (base_prediction - double_prediction).abs().max() < 1e-2


def test_gd1_step_size_is_mse_optimal():
    task = SineRegression(SineRegression.Config(seq_len=20, noise_std=0.3))
    batch = task.sample(40000, make_generator(5))
    x, y = task.examples(batch)
    psi = features(x)
    eta = gd1_step_size(torch.arange(10), 0.1, 5.0, 5.0, 0.3)
    for j in (1, 3, 6, 9):
        g = (psi[:, j] * (psi[:, :j] * y[:, :j, None]).sum(1)).sum(-1)
        best = (g * y[:, j]).mean() / (g * g).mean()
        stderr = (g * y[:, j] - best * g * g).std() / (math.sqrt(len(g)) * (g * g).mean())
        c = eta[j].item() / j
        assert abs(best - c) <= Z * stderr, (j, best, c, stderr)
        assert stderr < 0.03 * c
    prediction = task.references()["gd1"].predict(batch)[:, 0::2, 0]
    j = 4
    direct = eta[j] / j * (psi[:, j] * (psi[:, :j] * y[:, :j, None]).sum(1)).sum(-1)
    assert torch.allclose(prediction[:, j], direct, atol=1e-12)


def test_knn_is_the_nearest_neighbours_mean():
    task = SineRegression(SineRegression.Config(knn_k=3))
    batch = task.sample(4, make_generator(6))
    prediction = task.references()["knn"].predict(batch)[:, 0::2, 0]
    x, y = task.examples(batch)
    for b in range(4):
        assert prediction[b, 0] == 0
        for j in range(1, 10):
            order = (x[b, :j] - x[b, j]).abs().argsort()[:3]
            assert prediction[b, j].item() == pytest.approx(y[b, order].mean().item(), abs=1e-12)


def test_bayes_beats_every_reference_on_held_out_data():
    task = SineRegression()
    batch = task.held_out(2000)
    losses = {name: sequence_means(task.position_loss(ref.predict(batch), batch.targets.double()),
                                   batch.loss_mask)
              for name, ref in task.references().items()}
    bayes = losses.pop("bayes")
    oracle = losses.pop("oracle")
    assert within(oracle, 0.01)
    assert (bayes - oracle).mean() > 0
    for name, loss in losses.items():
        diff = loss - bayes
        assert diff.mean() > Z * diff.std() / math.sqrt(len(diff)), name


def test_score_last_scores_only_the_final_query():
    config = dict(seq_len=12, grid_phase=64)
    check_score_last(SineRegression(SineRegression.Config(**config)),
                     SineRegression(SineRegression.Config(**config, score="last")), 10)
