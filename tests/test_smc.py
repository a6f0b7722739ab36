"""tasks/smc.py: the Kalman recursion against tasks/lgssm.py's filter (itself tested against dense
Gaussian conditioning), systematic resampling and the importance weights against their
definitions, and the whole sampler against exact quadrature on a family with one unknown
parameter, lgssm_colored's ρ (tasks/lgssm_colored.py `bayes`)."""
import math

import pytest
import torch

from tasks.base import make_generator
from tasks.lgssm import LGSSMConfig, LGSSMPrior, kalman_filter
from tasks.lgssm_colored import LGSSMColoredConfig, LGSSMColoredTask, colored_noise_system
import tasks.smc
from tasks.smc import (SMC_STREAM, DiagonalSystem, ParameterPrior, Particles, _filter_where,
                       kalman_prefix, kalman_start, kalman_step, smc_predictive, smc_runs,
                       systematic_resampling)


def matrices_last(tensor: torch.Tensor, axes: int) -> torch.Tensor:
    """A tensor with `axes` leading matrix axes, moved last (tasks/lgssm.py's layout)."""
    return tensor.movedim(tuple(range(axes)), tuple(range(-axes, 0)))


def dense_filter(system: DiagonalSystem, observations: torch.Tensor):
    """tasks/lgssm.py kalman_filter on the same systems, written as full matrices."""
    basis = matrices_last(system.obs_basis, 2)
    obs_noise = basis @ torch.diag_embed(matrices_last(system.obs_variances, 1)) @ basis.mT
    transition = torch.diag_embed(matrices_last(system.transition, 1))
    return kalman_filter(observations[:, None], transition, matrices_last(system.emission, 2),
                         matrices_last(system.state_noise, 2), obs_noise,
                         matrices_last(system.stationary_covariance(), 2))


class RhoPrior(ParameterPrior):
    """lgssm_colored's model with ρ ~ U(rho_min, rho_max) the one unknown: the system of
    colored_noise_system (observation noise 0), in the sampler's layout."""

    dim = 1

    def __init__(self, config: LGSSMColoredConfig):
        self.config = config

    def sample(self, shape, generator):
        u = torch.rand(1, *shape, generator=generator, dtype=torch.float64)
        return self.config.rho_min + (self.config.rho_max - self.config.rho_min) * u

    def evaluate(self, coords):
        rho = coords[0]
        transition, emission, state_noise, obs_noise, _ = colored_noise_system(
            rho, self.config.signal_decay)
        system = DiagonalSystem(transition.diagonal(dim1=-2, dim2=-1).movedim(-1, 0),
                                emission.movedim((-2, -1), (0, 1)),
                                state_noise.movedim((-2, -1), (0, 1)),
                                torch.ones_like(obs_noise).movedim((-2, -1), (0, 1)),
                                obs_noise[..., 0].movedim(-1, 0))
        inside = (rho >= self.config.rho_min) & (rho <= self.config.rho_max)
        return torch.where(inside, 0.0, -math.inf), system


def test_kalman_recursion_equals_the_dense_filter_at_every_step():
    """The scalar updates in the noise eigenbasis, with a diagonal transition, against the
    matrix Kalman filter: every one-step log-likelihood and predicted mean and covariance."""
    prior = LGSSMPrior(LGSSMConfig())
    _, system = prior.evaluate(prior.sample((3, 5), make_generator(0)))
    x = torch.randn(3, 20, 2, generator=make_generator(1), dtype=torch.float64)
    dense = dense_filter(system, x)
    state = kalman_start(system)
    for t in range(x.shape[1]):
        log_lik, state = kalman_step(system, x[:, t].T[..., None], state)
        torch.testing.assert_close(log_lik, dense.log_lik[..., t], rtol=0, atol=1e-12)
        predicted = (system.emission * state.mean).sum(1)
        torch.testing.assert_close(matrices_last(predicted, 1), dense.next_mean[:, :, t],
                                   rtol=0, atol=1e-12)
        cov = torch.einsum("ik...,kl...,jl...->...ij", system.emission, state.cov,
                           system.emission)
        obs = matrices_last(system.obs_basis, 2)
        cov = cov + obs @ torch.diag_embed(matrices_last(system.obs_variances, 1)) @ obs.mT
        torch.testing.assert_close(cov, dense.next_cov[:, :, t], rtol=0, atol=1e-12)
    total, _ = kalman_prefix(system, x)
    torch.testing.assert_close(total, dense.log_lik.sum(-1), rtol=0, atol=1e-10)


def test_kalman_recursion_takes_noise_free_observations():
    """lgssm_colored's observations have no noise (R = 0): still the dense filter."""
    config = LGSSMColoredConfig()
    prior = RhoPrior(config)
    _, system = prior.evaluate(prior.sample((2, 4), make_generator(2)))
    task = LGSSMColoredTask(LGSSMColoredConfig(seq_len=30, eval_rho=-1.0))
    x = task.sample(2, make_generator(3)).inputs.double()
    total, state = kalman_prefix(system, x)
    dense = dense_filter(system, x)
    torch.testing.assert_close(total, dense.log_lik.sum(-1), rtol=0, atol=1e-9)
    torch.testing.assert_close(matrices_last((system.emission * state.mean).sum(1), 1),
                               dense.next_mean[:, :, -1], rtol=0, atol=1e-10)


def test_systematic_resampling_gives_each_particle_floor_or_ceil_of_n_w_copies():
    weights = torch.softmax(3 * torch.randn(50, 40, generator=make_generator(4),
                                            dtype=torch.float64), -1)
    uniforms = torch.rand(50, 1, generator=make_generator(5), dtype=torch.float64)
    ancestors = systematic_resampling(weights, uniforms)
    copies = torch.zeros_like(weights).scatter_add_(1, ancestors, torch.ones_like(weights))
    expected = weights.shape[1] * weights
    assert (copies >= expected.floor() - 1e-9).all() and (copies <= expected.ceil() + 1e-9).all()
    assert (ancestors.diff(dim=1) >= 0).all()


def test_without_resampling_the_prediction_is_importance_sampling_from_the_prior():
    """ess_fraction = 0 never resamples: the estimate is then Σ_i w_i E[x_{t+1} | x_≤t, θ_i] with
    w_i ∝ p(x_≤t | θ_i), over the prior draws θ_i of the chunk's generator."""
    prior = LGSSMPrior(LGSSMConfig())
    x = torch.randn(3, 12, 2, generator=make_generator(6), dtype=torch.float64)
    result = smc_predictive(x, prior, 16, 2, seed=9, ess_fraction=0.0)
    assert result.resamplings.sum() == 0 and math.isnan(result.acceptance)
    coords = prior.sample((3, 16), make_generator(SMC_STREAM, 9, 0))
    dense = dense_filter(prior.evaluate(coords)[1], x)
    weights = torch.softmax(dense.log_lik.cumsum(-1), 1)  # over the particles
    expected = (weights[..., None] * dense.next_mean).sum(1)
    torch.testing.assert_close(result.prediction, expected, rtol=0, atol=1e-12)


def test_the_estimate_is_a_function_of_the_observations_and_the_seed():
    prior = LGSSMPrior(LGSSMConfig())
    x = torch.randn(5, 16, 2, generator=make_generator(7))
    first = smc_predictive(x, prior, 32, 1, seed=3)
    assert first.resamplings.sum() > 0
    assert torch.equal(first.prediction, smc_predictive(x, prior, 32, 1, seed=3).prediction)
    assert not torch.equal(first.prediction, smc_predictive(x, prior, 32, 1, seed=4).prediction)


@pytest.mark.parametrize("ess_fraction", [0.5, 0.95])
def test_smc_agrees_with_quadrature_when_one_parameter_is_unknown(ess_fraction):
    """lgssm_colored with a wide prior ρ ~ U(0.3, 0.99), so that the posterior narrows and the
    particles are resampled and moved (half the sequences once at ess_fraction 0.5; ~7 times
    each at 0.95, after almost every observation once the posterior narrows).
    Quadrature on 400 Gauss-Legendre nodes is exact here to far below the Monte Carlo error.
    With R independent runs of per-position Monte Carlo variance V (estimated by their sample
    variance), an unbiased estimate has E|mean of runs - exact|² = V/R; a sampler that targets
    another posterior adds its squared bias. Measured ratio 1.17 and 0.96; allowed below 2, and
    the variance is far below the gap between Bayes and the clairvoyant filter (0.3-0.4%)."""
    config = LGSSMColoredConfig(seq_len=48, rho_min=0.3, eval_rho=-1.0, grid_size=400)
    task = LGSSMColoredTask(config)
    batch = task.held_out(32)
    exact = task.bayes(batch)
    results = [smc_predictive(batch.inputs, RhoPrior(config), 128, 2, seed, ess_fraction)
               for seed in range(4)]
    assert all(r.resamplings.sum() > 0 and r.acceptance > 0.5 for r in results)
    runs = torch.stack([r.prediction for r in results])
    variance = runs.var(0).mean()
    squared_error = (runs.mean(0) - exact).square().mean()
    assert squared_error < 2 * variance / len(runs)
    y = batch.targets.double()
    floor = (task.position_loss(exact, y) - task.position_loss(task.clairvoyant(batch), y)).mean()
    assert variance < 0.05 * floor


def test_filtering_only_the_proposals_inside_the_support_is_filtering_all_of_them():
    """The Metropolis step filters the proposals inside the prior's support alone
    (_filter_where): each of those gets exactly kalman_prefix's log-likelihood and state over all
    systems, the others 0 and the particle's own state."""
    prior = LGSSMPrior(LGSSMConfig())
    _, system = prior.evaluate(prior.sample((3, 8), make_generator(10)))
    _, other = prior.evaluate(prior.sample((3, 8), make_generator(11)))
    x = torch.randn(3, 9, 2, generator=make_generator(12), dtype=torch.float64)
    own_log_lik, own_state = kalman_prefix(other, x)
    particles = Particles(torch.zeros(1, 3, 8), torch.zeros(3, 8), own_log_lik, other, own_state)
    mask = torch.rand(3, 8, generator=make_generator(13)) < 0.5
    log_lik, state = _filter_where(mask, system, particles, x)
    full_log_lik, full_state = kalman_prefix(system, x)
    assert torch.equal(log_lik, torch.where(mask, full_log_lik, 0.0))
    for field in ("mean", "cov"):
        kept, full, own = (getattr(s, field) for s in (state, full_state, own_state))
        assert torch.equal(kept, torch.where(mask, full, own))


def test_runs_computed_together_are_the_runs_computed_alone(monkeypatch):
    """smc_runs advances several runs' chunks of sequences side by side, each chunk with its
    own generator: every run is the one its chunks give alone, resampled at the same times,
    accepting the same proposals. The values agree up to rounding, not bitwise: LAPACK and
    BLAS take another path for a batch of one matrix, which a chunk alone meets where
    side by side it does not."""
    monkeypatch.setattr(tasks.smc, "SYSTEMS_PER_CHUNK", 64)  # 4 sequences of 16 particles
    prior = LGSSMPrior(LGSSMConfig())
    x = torch.randn(10, 24, 2, generator=make_generator(18), dtype=torch.float64)
    together = smc_runs(x, prior, 16, 2, [3, 4])  # 2 runs x 3 chunks, all side by side
    monkeypatch.setattr(tasks.smc, "SYSTEMS_TOGETHER", 1)  # every chunk alone
    for seed, run in zip([3, 4], together):
        alone = smc_predictive(x, prior, 16, 2, seed)
        assert torch.equal(run.resamplings, alone.resamplings) and run.resamplings.sum() > 10
        torch.testing.assert_close(run.prediction, alone.prediction, rtol=0, atol=1e-10)
        assert run.acceptance == pytest.approx(alone.acceptance, rel=1e-12)


def test_runs_in_worker_processes_are_the_runs_in_one(monkeypatch):
    """Worker processes advance the groups of chunks that one process would (two here), each
    with its chunks' generators: the runs are bitwise the same. Where there are more processes
    than such groups, the groups are smaller, which is the side-by-side difference above: that
    case's groups are computed here, in turn (the two processes have shown that a group in a
    worker is the group computed here; four would cost seconds of imports each)."""
    monkeypatch.setattr(tasks.smc, "SYSTEMS_PER_CHUNK", 64)  # 4 sequences of 16 particles
    monkeypatch.setattr(tasks.smc, "SYSTEMS_TOGETHER", 128)  # 2 chunks a group
    prior = LGSSMPrior(LGSSMConfig())
    x = torch.randn(8, 24, 2, generator=make_generator(18), dtype=torch.float64)
    one = smc_runs(x, prior, 16, 2, [3, 4], processes=1)  # 2 runs x 2 chunks: 2 groups
    groups = []

    def here(function, jobs, processes):
        groups.append((len(jobs), processes))
        return [function(*job) for job in jobs]

    for processes, exact in ((2, True), (4, False)):
        if not exact:
            monkeypatch.setattr(tasks.smc, "map_in_processes", here)
        workers = smc_runs(x, prior, 16, 2, [3, 4], processes=processes)
        for a, b in zip(one, workers):
            assert torch.equal(a.resamplings, b.resamplings) and a.resamplings.sum() > 10
            if exact:
                assert torch.equal(a.prediction, b.prediction) and a.acceptance == b.acceptance
            else:
                torch.testing.assert_close(a.prediction, b.prediction, rtol=0, atol=1e-10)
    assert groups == [(4, 4)]  # a chunk a group, for four workers


def test_worker_processes_are_taken_for_work_of_many_seconds_only(monkeypatch):
    """One a thread, where the work is many seconds and the memory holds them."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr(tasks.smc, "host_available_bytes", lambda: 8 * tasks.smc.WORKER_BYTES)
    default = LGSSMConfig()
    x = torch.zeros(64, default.seq_len + 1, default.obs_dim)  # the default task's, T + 1 inputs
    assert tasks.smc.default_processes(x, default.bayes_particles, 2) == 3
    assert tasks.smc.default_processes(x[:16], default.bayes_particles, 2) == 1
    assert tasks.smc.default_processes(x, 32, 2) == 1
    for available, processes in ((2.5, 2), (0.5, 1), (None, 3)):
        monkeypatch.setattr(tasks.smc, "host_available_bytes", lambda: None if available is None
                            else int(available * tasks.smc.WORKER_BYTES))
        assert tasks.smc.default_processes(x, default.bayes_particles, 2) == processes
