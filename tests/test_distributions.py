"""Generator-driven samplers against the moments of their distributions."""
import math

import pytest
import torch

from tasks.distributions import categorical, dirichlet, gamma


def generator(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("alpha", [0.05, 0.3, 1.0, 2.5, 10.0])
def test_gamma_mean_and_variance(alpha):
    n = 200_000
    x = gamma(torch.full((n,), alpha, dtype=torch.float64), generator())
    assert (x >= 0).all()
    # Gamma(alpha, 1): mean alpha, variance alpha; the mean's standard error is sqrt(alpha / n),
    # the variance's is sqrt((mu4 - var^2) / n) with mu4 = 3 alpha^2 + 6 alpha.
    assert abs(x.mean() - alpha) < 5 * math.sqrt(alpha / n)
    var_se = math.sqrt((3 * alpha**2 + 6 * alpha - alpha**2) / n)
    assert abs(x.var() - alpha) < 5 * var_se


def test_dirichlet_moments():
    S, beta, n = 4, 0.5, 100_000
    p = dirichlet(torch.full((n, S), beta, dtype=torch.float64), generator(1))
    assert torch.allclose(p.sum(-1), torch.ones(n, dtype=torch.float64))
    a0 = S * beta
    mean, var = 1 / S, (1 / S) * (1 - 1 / S) / (a0 + 1)
    assert (p.mean(0) - mean).abs().max() < 5 * math.sqrt(var / n)
    # Cov(p_i, p_j) = -m_i m_j / (a0 + 1) for i != j
    cov = torch.cov(p.T)
    assert abs(cov[0, 1] - (-mean * mean / (a0 + 1))) < 0.02 * var * 5
    assert (cov.diagonal() - var).abs().max() < 0.05 * var


def test_categorical_frequencies():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    n = 100_000
    draws = categorical(probs.expand(n, 4), generator(2))
    freq = torch.bincount(draws, minlength=4).double() / n
    assert ((freq - probs).abs() < 5 * torch.sqrt(probs * (1 - probs) / n)).all()


def test_same_generator_state_same_samples():
    a = dirichlet(torch.ones(8, 3), generator(7))
    b = dirichlet(torch.ones(8, 3), generator(7))
    assert torch.equal(a, b)
