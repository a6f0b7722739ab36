"""tasks/lgssm_colored.py with the signal's coefficient unknown too (conf/task/
lgssm_colored_room.yaml): the sampler against its definition, the 2-D (a, ρ) Bayes quadrature
against dense Gaussian algebra on its own nodes and against adaptive integration of the exact
posterior, its two limits (a point-mass prior gives the clairvoyant filter, a fixed a the paper
task's 1-D quadrature), its optimality on prior draws, its convergence at the preset's grid,
the new fields' validation, and the paper task's draws left as they were."""
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from scipy import integrate

from bench.cli.main import main
from bench.config import compose
from tasks.base import make_generator
from tasks.lgssm_colored import LGSSMColoredConfig, LGSSMColoredTask

Z = 4.0  # tolerance of the statistical checks, in standard errors
CONF = Path(__file__).parents[1] / "conf/task"


def room(**changes) -> LGSSMColoredConfig:
    """The preset's config (conf/task/lgssm_colored_room.yaml), with changes."""
    values = yaml.safe_load((CONF / "lgssm_colored_room.yaml").read_text())
    values.pop("family")
    return dataclasses.replace(LGSSMColoredConfig(**values), **changes)


def within_standard_errors(samples: torch.Tensor, expected: float) -> bool:
    stderr = samples.std() / math.sqrt(samples.numel())
    return abs(samples.mean().item() - expected) <= Z * stderr.item()


def full_sequences(batch) -> torch.Tensor:
    return torch.cat([batch.inputs, batch.targets[:, -1:]], 1)[..., 0].double()


def dense_covariance(a: float, rho: float, steps: int, white_noise: bool = False) -> np.ndarray:
    """Cov(x_s, x_t) = a^|t-s|/(1-a²) + ρ^|t-s| (or + δ_st when v is white), stationary start."""
    lag = np.abs(np.subtract.outer(np.arange(steps), np.arange(steps))).astype(float)
    return a**lag / (1 - a**2) + ((lag == 0) * 1.0 if white_noise else rho**lag)


def dense_predictions(x: np.ndarray, cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """E[x_{t+1} | x_1..x_t] and log p(x_1..x_t) for t = 1..len(x)-1, by dense conditioning."""
    means, log_liks = [], []
    for t in range(1, len(x)):
        block = cov[:t, :t]
        means.append(np.linalg.solve(block, cov[:t, t]) @ x[:t])
        _, log_det = np.linalg.slogdet(block)
        log_liks.append(-0.5 * (x[:t] @ np.linalg.solve(block, x[:t]) + log_det
                                + t * math.log(2 * math.pi)))
    return np.array(means), np.array(log_liks)


# --- the preset and the paper task's defaults ----------------------------------------------

def test_preset_composes_to_an_unknown_a_held_out_from_the_prior_and_lists_every_field():
    text = (CONF / "lgssm_colored_room.yaml").read_text()
    assert text.startswith("# ")
    values = yaml.safe_load(text)
    assert values.pop("family") == "lgssm_colored"
    composed = compose(["task=lgssm_colored_room"]).task
    assert dataclasses.asdict(composed) == values  # every field written out, none converted
    task = LGSSMColoredTask(composed)
    assert composed.signal_decay_unknown and task.held_out_from_prior  # bayes exactly optimal
    assert 64 <= composed.seq_len <= 128


def test_paper_task_draws_are_the_definitions_with_no_draw_for_a():
    """The paper task (a known) draws ρ's uniform, then the signal's and the noise's Gaussians
    and nothing else: a sequential construction from the same generator gives its sequences.
    With a unknown, a's uniform comes right after ρ's."""
    for config in (LGSSMColoredConfig(seq_len=20), room(seq_len=20)):
        batch = LGSSMColoredTask(config).sample(300, make_generator(1, 9))
        g = make_generator(1, 9)
        draw = dict(generator=g, dtype=torch.float64)
        rho = config.rho_min + (config.rho_max - config.rho_min) * torch.rand(300, **draw)
        if config.signal_decay_max == -1:
            a = torch.full((300,), config.signal_decay, dtype=torch.float64)
        else:
            a = config.signal_decay + (config.signal_decay_max - config.signal_decay) * \
                torch.rand(300, **draw)
        z_eps, v_eps = torch.randn(300, 21, **draw), torch.randn(300, 21, **draw)
        z, v = z_eps[:, 0] / torch.sqrt(1 - a**2), v_eps[:, 0]
        xs = [z + v]
        for t in range(1, 21):
            z = a * z + z_eps[:, t]
            v = rho * v + torch.sqrt(1 - rho**2) * v_eps[:, t]
            xs.append(z + v)
        x = torch.stack(xs, 1).float()
        torch.testing.assert_close(full_sequences(batch).float(), x, rtol=1e-6, atol=1e-6)
        assert torch.equal(batch.latent["rho"], rho)
        assert torch.equal(batch.latent["signal_decay"], a)


def test_paper_defaults_are_unchanged():
    """The new fields default to the paper task (a known); the paper's conf file sets every field
    it lists to its default and leaves out only the new ones."""
    config = LGSSMColoredConfig()
    assert config.signal_decay_max == -1.0 and not config.signal_decay_unknown
    listed = yaml.safe_load((CONF / "lgssm_colored.yaml").read_text())
    listed.pop("family")
    defaults = dataclasses.asdict(config)
    assert {k: defaults[k] for k in listed} == listed
    assert set(defaults) - set(listed) <= {"signal_decay_max", "signal_grid_size"}
    assert compose(["task=lgssm_colored"]).task == config


# --- the sampler ---------------------------------------------------------------------------

def test_sampler_draws_a_and_rho_from_their_priors_and_each_sequence_from_its_own():
    """a ~ U(0, 0.95), ρ ~ U(0.1, 0.99) independently; given them, the sequence is stationary
    with Cov(x_{t+h}, x_t) = a^h/(1-a²) + ρ^h, so x_{t+h} x_t / Cov has mean 1 over sequences."""
    config = room(seq_len=12)
    batch = LGSSMColoredTask(config).sample(20000, make_generator(2))
    a, rho = batch.latent["signal_decay"], batch.latent["rho"]
    assert a.min() >= 0 and a.max() <= 0.95 and rho.min() >= 0.1 and rho.max() <= 0.99
    for values, lo, hi in ((a, 0.0, 0.95), (rho, 0.1, 0.99)):
        assert within_standard_errors(values, (lo + hi) / 2)
        assert within_standard_errors((values - (lo + hi) / 2) ** 2, (hi - lo) ** 2 / 12)
    assert within_standard_errors((a - 0.475) * (rho - 0.545), 0.0)  # independent
    x = full_sequences(batch)
    for t in (0, 8):
        for h in (0, 1, 3):
            covariance = a**h / (1 - a**2) + rho**h
            assert within_standard_errors(x[:, t + h] * x[:, t] / covariance, 1.0)


def test_held_out_set_is_fixed_and_drawn_from_the_prior():
    task = LGSSMColoredTask(room(seq_len=8))
    held = task.held_out(400)
    assert torch.equal(held.inputs, task.held_out(400).inputs)
    assert within_standard_errors(held.latent["signal_decay"], 0.475)
    assert within_standard_errors(held.latent["rho"], 0.545)


# --- the references against dense Gaussian algebra ------------------------------------------

def test_clairvoyant_and_misspecified_kalman_equal_dense_conditioning():
    """The bound conditions on each sequence's own (a, ρ); the misspecified filter on white
    noise and the prior mean of a, (0 + 0.95)/2, whatever the sequence's a."""
    T = 8
    task = LGSSMColoredTask(room(seq_len=T))
    batch = task.sample(5, make_generator(4))
    clairvoyant, misspecified = task.clairvoyant(batch), task.misspecified_kalman(batch)
    x = full_sequences(batch).numpy()
    for b in range(len(batch)):
        a, rho = batch.latent["signal_decay"][b].item(), batch.latent["rho"][b].item()
        truth, _ = dense_predictions(x[b], dense_covariance(a, rho, T + 1))
        np.testing.assert_allclose(clairvoyant[b, :, 0].numpy(), truth, rtol=0, atol=1e-10)
        white, _ = dense_predictions(x[b], dense_covariance(0.475, 0.0, T + 1, white_noise=True))
        np.testing.assert_allclose(misspecified[b, :, 0].numpy(), white, rtol=0, atol=1e-10)


def test_bayes_equals_the_dense_mixture_over_the_product_grid():
    """Independent computation of the quadrature: Gauss-Legendre nodes from numpy on each axis,
    per (a, ρ) pair a dense Gaussian likelihood and conditional mean, mixed with the posterior
    weights ∝ w_a w_ρ p(x_1..x_t | a, ρ)."""
    T, grid_a, grid_rho = 6, 3, 4
    task = LGSSMColoredTask(room(seq_len=T, signal_grid_size=grid_a, grid_size=grid_rho))
    batch = task.sample(4, make_generator(5))
    bayes = task.bayes(batch)
    (pa, wa), (pr, wr) = np.polynomial.legendre.leggauss(grid_a), np.polynomial.legendre.leggauss(
        grid_rho)
    x = full_sequences(batch).numpy()
    for b in range(len(batch)):
        means, log_post = [], []
        for i in range(grid_a):
            for j in range(grid_rho):
                a, rho = 0.475 + 0.475 * pa[i], 0.545 + 0.445 * pr[j]
                mean, log_lik = dense_predictions(x[b], dense_covariance(a, rho, T + 1))
                means.append(mean)
                log_post.append(log_lik + math.log(wa[i] * wr[j]))
        log_post = np.array(log_post)
        weights = np.exp(log_post - log_post.max(0))
        mixture = (weights * np.array(means)).sum(0) / weights.sum(0)
        np.testing.assert_allclose(bayes[b, :, 0].numpy(), mixture, rtol=0, atol=1e-10)


def test_bayes_is_the_exact_posterior_mean_by_adaptive_integration():
    """No quadrature rule of the task's: E[x_{t+1} | x_1..x_t] = ∫∫ m L / ∫∫ L over the prior's
    rectangle, L(a, ρ) the dense Gaussian likelihood and m the dense conditional mean, by
    scipy's adaptive dblquad. The preset's 32 x 32 Gauss-Legendre rule reproduces it."""
    T = 7
    task = LGSSMColoredTask(room(seq_len=T))
    batch = task.sample(2, make_generator(6))
    bayes = task.bayes(batch)
    x = full_sequences(batch).numpy()
    for b in range(len(batch)):
        for t in (1, 3, T):  # the prediction of x_{t+1} from x_1..x_t (index t - 1)
            def pieces(rho, a):
                cov = dense_covariance(a, rho, t + 1)
                block, xs = cov[:t, :t], x[b, :t]
                solved = np.linalg.solve(block, xs)
                likelihood = np.exp(-0.5 * xs @ solved) / math.sqrt(np.linalg.det(block))
                return likelihood, likelihood * (cov[t, :t] @ solved)

            options = dict(epsabs=0, epsrel=1e-9)
            normaliser = integrate.dblquad(lambda r, a: pieces(r, a)[0], 0.0, 0.95, 0.1, 0.99,
                                           **options)[0]
            numerator = integrate.dblquad(lambda r, a: pieces(r, a)[1], 0.0, 0.95, 0.1, 0.99,
                                          **options)[0]
            assert math.isclose(bayes[b, t - 1, 0].item(), numerator / normaliser,
                                rel_tol=1e-7, abs_tol=1e-8)


@pytest.mark.parametrize("grid_a,grid_rho", [(2, 3), (5, 4)])
def test_product_rule_is_exact_for_polynomials_under_the_product_prior(grid_a, grid_rho):
    """Σ_g w_g a_g^i ρ_g^j = E[a^i] E[ρ^j] for i < 2·grid_a, j < 2·grid_rho (Gauss-Legendre on
    each axis, the weights multiplied: the prior is a product of uniforms)."""
    task = LGSSMColoredTask(room())
    a, rho, log_w = task.parameter_grid(grid_rho, grid_a, "cpu")
    assert a.shape == rho.shape == log_w.shape == (grid_a * grid_rho,)

    def moment(lo, hi, k):
        return (hi ** (k + 1) - lo ** (k + 1)) / ((k + 1) * (hi - lo))

    for i in range(2 * grid_a):
        for j in range(2 * grid_rho):
            got = (log_w.exp() * a**i * rho**j).sum().item()
            assert math.isclose(got, moment(0.0, 0.95, i) * moment(0.1, 0.99, j), rel_tol=1e-12)


# --- the two limits -------------------------------------------------------------------------

def test_a_point_mass_prior_gives_the_clairvoyant_filter():
    """Priors 1e-9 wide around (a, ρ) = (0.6, 0.8): every node of the 2-D rule is that system,
    so the posterior mixture is its Kalman filter, the bound (to the prior's width times the
    predictions' sensitivity, ~1e-8)."""
    task = LGSSMColoredTask(room(seq_len=40, signal_decay=0.6, signal_decay_max=0.6 + 1e-9,
                                 rho_min=0.8, rho_max=0.8 + 1e-9, grid_size=4,
                                 signal_grid_size=3))
    assert task.config.signal_decay_unknown
    batch = task.held_out(16)
    torch.testing.assert_close(task.bayes(batch), task.clairvoyant(batch), rtol=0, atol=1e-6)


def test_a_fixed_a_gives_the_papers_one_dimensional_quadrature():
    """The 2-D rule with a's prior 1e-9 wide at a = 0.9 equals the paper task's quadrature over
    ρ alone (a known), on the paper's held-out sequences."""
    paper = LGSSMColoredTask(LGSSMColoredConfig(seq_len=64, grid_size=16))
    nearly_fixed = LGSSMColoredTask(dataclasses.replace(
        paper.config, signal_decay_max=0.9 + 1e-9, signal_grid_size=4))
    assert nearly_fixed.config.signal_decay_unknown and not paper.config.signal_decay_unknown
    batch = paper.held_out(32)
    torch.testing.assert_close(nearly_fixed.bayes(batch), paper.bayes(batch), rtol=0, atol=1e-6)


# --- optimality and convergence --------------------------------------------------------------

def test_bayes_beats_every_other_predictor_on_prior_draws():
    """On sequences of the prior, for any predictor f of the context E loss(f) - E loss(b) =
    E (f - b)² > 0 holds only for the exact conditional mean b: checked for the baselines, the
    paper's 1-D quadrature at a = the prior mean of a (a wrong model), and the 2-D quadrature
    under a wrong prior; and E loss(b) - E loss(c) = E (c - b)² for the clairvoyant c."""
    config = room(seq_len=64, grid_size=16, signal_grid_size=16)
    task = LGSSMColoredTask(config)
    batch = task.held_out(500)
    y = batch.targets.double()
    bayes = task.bayes(batch)
    bayes_loss = task.position_loss(bayes, y)
    fixed_a = LGSSMColoredTask(dataclasses.replace(config, signal_decay=0.475,
                                                   signal_decay_max=-1.0))
    wrong_prior = LGSSMColoredTask(dataclasses.replace(config, signal_decay=0.5,
                                                       rho_min=0.5))
    others = {name: ref.predict(batch) for name, ref in task.references().items()
              if ref.role == "baseline"}
    others |= {"fixed_a_bayes": fixed_a.bayes(batch), "wrong_prior_bayes": wrong_prior.bayes(batch)}
    for name, prediction in others.items():
        gap = (task.position_loss(prediction, y) - bayes_loss).mean(1)
        assert gap.mean() > Z * gap.std() / math.sqrt(len(gap)), name  # bayes strictly better
        identity = gap - task.position_loss(prediction, bayes).mean(1)
        assert within_standard_errors(identity, 0.0), name
    clairvoyant = task.clairvoyant(batch)
    gap = (bayes_loss - task.position_loss(clairvoyant, y)).mean(1)
    assert gap.mean() > Z * gap.std() / math.sqrt(len(gap))  # the bound is strictly better
    assert within_standard_errors(gap - task.position_loss(clairvoyant, bayes).mean(1), 0.0)


def test_bayes_quadrature_is_converged_at_the_presets_grid():
    """Doubling both axes of the preset's 32 x 32 rule moves no prediction by 1e-4 and the mean
    loss by less than 1e-6 of Bayes's excess over the bound (measured: 2e-6 and 2e-10 on 512
    sequences)."""
    task = LGSSMColoredTask(room())
    batch = task.held_out(16)
    y = batch.targets.double()
    c = task.config
    default = task.bayes(batch)
    doubled = task.quadrature_predictive(batch.inputs, 2 * c.grid_size, 2 * c.signal_grid_size)
    excess = task.position_loss(default, y) - task.position_loss(task.clairvoyant(batch), y)
    moved = task.position_loss(doubled, y) - task.position_loss(default, y)
    assert (doubled - default).abs().max() < 1e-4
    assert abs(moved.mean()) < 1e-6 * excess.mean()


# --- validation -----------------------------------------------------------------------------

@pytest.mark.parametrize("bad,needle", [
    (dict(signal_decay_max=1.0), "signal_decay <= signal_decay_max < 1"),
    (dict(signal_decay=0.5, signal_decay_max=0.4), "signal_decay <= signal_decay_max < 1"),
    (dict(signal_decay_max=-0.5), "signal_decay <= signal_decay_max < 1"),
    (dict(signal_grid_size=0), "1 <= signal_grid_size <= 4096"),
    (dict(signal_grid_size=4097), "1 <= signal_grid_size <= 4096"),
    (dict(signal_decay_max=0.95, grid_size=128, signal_grid_size=64),
     "grid_size * signal_grid_size <= 4096"),
])
def test_config_rejects_invalid_values_in_one_line(bad, needle):
    with pytest.raises(ValueError, match=needle.replace("*", r"\*")) as error:
        LGSSMColoredConfig(**bad)
    assert "\n" not in str(error.value)


def test_the_product_limit_binds_only_when_a_is_unknown():
    LGSSMColoredConfig(grid_size=4096, signal_grid_size=4096)  # a known: one axis of 4096
    LGSSMColoredConfig(signal_decay_max=0.9, grid_size=64, signal_grid_size=64)
    LGSSMColoredConfig(signal_decay_max=0.9)  # a point mass is a known a


def test_cli_names_the_bad_field_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "task=lgssm_colored_room", "task.signal_decay_max=1.5"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "signal_decay_max" in lines[0]
    assert list(tmp_path.iterdir()) == []
