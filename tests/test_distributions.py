"""Generator-driven samplers against the moments of their distributions."""
import math

import pytest
import torch

from tasks.base import make_generator
from tasks.distributions import (batch_chunks, categorical, chain_states, dirichlet, gamma,
                                 inverse_cdf, inverse_cdf_table)


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


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_gamma_rejects_a_concentration_that_would_never_be_accepted(bad):
    # NaN used to spin forever in the rejection loop; it must fail at once and say why.
    alpha = torch.tensor([1.0, bad, 0.5], dtype=torch.float64)
    with pytest.raises(ValueError, match="finite and > 0"):
        gamma(alpha, generator())
    with pytest.raises(ValueError, match="finite and > 0"):
        dirichlet(alpha, generator())


def test_gamma_rejection_rounds_are_bounded():
    alpha = torch.full((100_000,), 1.0, dtype=torch.float64)
    # One round accepts ~95-99%, so some of 100k variates are still pending after it...
    with pytest.raises(RuntimeError, match="still rejected after 1 rounds"):
        gamma(alpha, generator(), max_rounds=1)
    # ...and all are accepted well within the default bound.
    assert torch.isfinite(gamma(alpha, generator())).all()


def beta_marginal_moments(a: float, b: float) -> tuple[float, float, float]:
    """Mean, variance and fourth central moment of Beta(a, b): the law of one Dirichlet
    component with concentration a among total a + b."""
    s = a + b
    mean, var = a / s, a * b / (s * s * (s + 1))
    excess = 6 * ((a - b) ** 2 * (s + 1) - a * b * (s + 2)) / (a * b * (s + 2) * (s + 3))
    return mean, var, (excess + 3) * var * var


@pytest.mark.parametrize("alpha", [0.01, 0.05, 1.0, 10.0])
def test_dirichlet_rows_are_finite_normalised_and_have_dirichlet_moments(alpha):
    S, n = 3, 100_000
    p = dirichlet(torch.full((n, S), alpha), generator(5))
    assert p.dtype == torch.float64
    assert torch.isfinite(p).all() and (p >= 0).all()
    assert torch.allclose(p.sum(-1), torch.ones(n, dtype=torch.float64), rtol=0, atol=1e-12)
    assert (p.max(-1).values >= 1 / S - 1e-12).all()  # never an all-zero row
    mean, var, mu4 = beta_marginal_moments(alpha, (S - 1) * alpha)
    x = p[:, 0]
    # Standard errors of the sample mean and variance of n i.i.d. draws: sqrt(var / n) and
    # sqrt((mu4 - var^2) / n); 5 of them is far outside chance for a fixed seed.
    assert abs(float(x.mean()) - mean) < 5 * math.sqrt(var / n)
    assert abs(float(x.var()) - var) < 5 * math.sqrt((mu4 - var * var) / n)


def test_dirichlet_with_a_vanishing_concentration_puts_all_mass_on_one_symbol():
    # log(U)/α is about -1e300 here: finite in log space, where U^(1/α) would be 0 for every
    # entry and the row 0/0. Each row is then a vertex of the simplex.
    p = dirichlet(torch.full((2000, 4), 1e-300, dtype=torch.float64), generator(6))
    assert torch.isfinite(p).all()
    assert torch.equal(p.max(-1).values, torch.ones(2000, dtype=torch.float64))
    # ...and each vertex is equally likely (4 symbols, 2000 rows: SE of a frequency ~0.0097).
    freq = torch.bincount(p.argmax(-1), minlength=4).double() / 2000
    assert (freq - 0.25).abs().max() < 5 * math.sqrt(0.25 * 0.75 / 2000)


def test_categorical_never_draws_a_zero_probability_symbol():
    # Inverse CDF at the edges: u = 0 must skip leading zeros, u just below 1 trailing zeros.
    cdf = torch.tensor([[0.0, 0.5, 0.5, 1.0, 1.0]], dtype=torch.float64).expand(3, 5)
    u = torch.tensor([[0.0], [0.5], [1 - 2**-53]], dtype=torch.float64)
    assert inverse_cdf(cdf, u).tolist() == [1, 3, 3]


def test_inverse_cdf_table_is_inverse_cdf_of_every_row_at_every_uniform():
    """Bit for bit, with zero-probability entries (leading, inner, trailing), u = 0, u just below
    1, float32 uniforms, and a non-contiguous u (a transposed draw, as the samplers pass it)."""
    g = generator(8)
    probs = torch.rand(3, 4, 6, generator=g, dtype=torch.float64)
    probs[probs < 0.35] = 0
    probs[:, 0] = torch.tensor([0.0, 0.5, 0.0, 0.0, 0.5, 0.0], dtype=torch.float64)
    cdf = probs.cumsum(-1)
    u = torch.rand(9, 3, generator=g).T  # (3, 9), non-contiguous
    u[:, 0], u[:, 1] = 0.0, 1 - 2**-24
    table = inverse_cdf_table(cdf, u)
    assert table.shape == (3, 9, 4)
    assert torch.equal(table, inverse_cdf(cdf[:, None], u[:, :, None, None]))


def sequential_chain(step_maps, start):
    states, state = [], start
    for t in range(step_maps.shape[-2]):
        state = step_maps[..., t, :].gather(-1, state.unsqueeze(-1)).squeeze(-1)
        states.append(state)
    return torch.stack(states, -1) if states else start.new_empty(start.shape + (0,))


@pytest.mark.parametrize("length", [0, 1, 2, 3, 5, 8, 100])
@pytest.mark.parametrize("states", [1, 2, 5])
def test_chain_states_is_the_step_by_step_chain(length, states):
    g = generator(length * 10 + states)
    step_maps = torch.randint(states, (2, 3, length, states), generator=g)
    start = torch.randint(states, (2, 3), generator=g)
    assert torch.equal(chain_states(step_maps, start), sequential_chain(step_maps, start))


def test_batch_chunks_cover_the_batch_in_bounded_slices(monkeypatch):
    monkeypatch.setattr("tasks.distributions.SCAN_CHUNK_ELEMENTS", 100)
    chunks = batch_chunks(23, 30)  # 3 sequences of 30 elements per chunk
    assert [(c.start, c.stop) for c in chunks] == [(i, min(i + 3, 23)) for i in range(0, 23, 3)]
    assert batch_chunks(5, 1000) == [slice(i, i + 1) for i in range(5)]  # at least one each
    assert batch_chunks(5, 0) == [slice(0, 5)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_successive_cpu_uniform_draws_are_the_rows_of_one_draw(dtype):
    """What makes the vectorised hmm and switching_markov samplers bit-identical to their loops on
    the CPU: T draws of n uniforms are the rows of one (T, n) draw, and leave the generator in
    the same state."""
    one, steps = generator(5), generator(5)
    rows = torch.stack([torch.rand(7, 1, generator=steps, dtype=dtype)[:, 0] for _ in range(33)])
    assert torch.equal(torch.rand(33, 7, generator=one, dtype=dtype), rows)
    assert torch.equal(one.get_state(), steps.get_state())


@pytest.mark.parametrize("family,config", [
    ("markov", {"order": 1, "vocab_size": 2, "beta": 0.01, "seq_len": 64}),
    ("markov", {"order": 2, "vocab_size": 3, "beta": 0.01, "seq_len": 64}),
    ("switching_markov", {"order": 1, "vocab_size": 3, "beta": 0.01, "p_switch": 0.05,
                          "seq_len": 64}),
    ("hmm", {"num_states": 8, "vocab_size": 10, "transition_concentration": 0.01,
             "emission_concentration": 0.01, "seq_len": 64}),
])
def test_tasks_with_tiny_concentrations_have_valid_latents_and_finite_references(family, config):
    # With beta = 0.01 many kernel entries are exactly 0 in float64; none may be NaN, and no
    # sampled token may be one of them, so every reference's loss on the targets is finite.
    from tasks import task_families
    cls = task_families()[family]
    task = cls(cls.Config(**config))
    batch = task.sample(256, make_generator(9))
    for name, value in batch.latent.items():
        if value.is_floating_point():
            assert torch.isfinite(value).all(), name
            assert torch.allclose(value.sum(-1), torch.ones_like(value.sum(-1)), atol=1e-12)
    for name, ref in task.references().items():
        loss = task.position_loss(ref.predict(batch), batch.targets)
        assert torch.isfinite(loss).all(), name
