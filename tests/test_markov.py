"""Random Markov chains: the sampler against its kernel, add-beta against its definitions."""
import itertools
import math

import pytest
import torch

from tasks.base import TRAIN_STREAM, make_generator
from tasks.markov import MarkovConfig, MarkovTask, context_ids


def task(order=1, S=2, beta=1.0, T=64):
    return MarkovTask(MarkovConfig(order=order, vocab_size=S, beta=beta, seq_len=T))


def transition_z_scores(batch, order, S, positions):
    """Σ(1[x_{t+1}=j] − P[c_t, j]) / sqrt(Σ P(1−P)) over the given positions, per symbol j:
    each is approximately N(0, 1) if the targets are drawn from the kernel rows."""
    ids = context_ids(batch.inputs, order, S)[:, positions]
    kernel = batch.latent["kernel"].double()
    p = kernel.gather(1, ids.unsqueeze(-1).expand(-1, -1, S))
    hits = torch.nn.functional.one_hot(batch.targets[:, positions], S).double()
    return (hits - p).sum((0, 1)) / (p * (1 - p)).sum((0, 1)).sqrt()


@pytest.mark.parametrize("order,S", [(1, 2), (2, 3), (3, 2)])
def test_transitions_follow_the_kernel(order, S):
    t = task(order, S, beta=0.7, T=96)
    batch = t.sample(600, make_generator(0))
    everywhere = transition_z_scores(batch, order, S, slice(order - 1, None))
    assert everywhere.abs().max() < 4.5
    # The last `order` targets are sampled too (the reference code leaves them at 0):
    last = transition_z_scores(batch, order, S, slice(-order, None))
    assert last.abs().max() < 4.5


@pytest.mark.parametrize("order,S", [(1, 3), (3, 2)])
def test_first_k_tokens_uniform(order, S):
    n = 6000
    batch = task(order, S, T=8).sample(n, make_generator(1))
    first = batch.inputs[:, :order].reshape(-1)
    freq = torch.bincount(first, minlength=S).double() / first.numel()
    assert ((freq - 1 / S).abs() < 5 * math.sqrt((1 / S) * (1 - 1 / S) / first.numel())).all()


def test_kernel_rows_are_dirichlet():
    S, beta = 3, 0.5
    kernel = task(2, S, beta=beta).sample(4000, make_generator(2)).latent["kernel"].double()
    rows = kernel.reshape(-1, S)
    var = (1 / S) * (1 - 1 / S) / (S * beta + 1)
    assert (rows.mean(0) - 1 / S).abs().max() < 5 * math.sqrt(var / len(rows))
    assert abs(rows[:, 0].var() - var) < 0.05 * var


def test_batches_are_reproducible_and_distinct_per_rank():
    t = task()
    a = t.sample(4, make_generator(TRAIN_STREAM, 0, 0, 5))
    b = t.sample(4, make_generator(TRAIN_STREAM, 0, 0, 5))
    c = t.sample(4, make_generator(TRAIN_STREAM, 0, 1, 5))
    assert torch.equal(a.inputs, b.inputs) and not torch.equal(a.inputs, c.inputs)
    assert torch.equal(a.targets[:, :-1], a.inputs[:, 1:])


def naive_add_beta(x, order, S, beta):
    """Counting loop straight from the definition: n_j = #{i : (x_{i-k..i-1}, x_i) = (ctx, j)}."""
    T = len(x) - 1
    out = torch.empty(T, S, dtype=torch.float64)
    for t in range(T):  # predict x[t+1] from x[0..t]
        if t < order - 1:
            out[t] = 1.0 / S
            continue
        ctx = tuple(x[t - order + 1:t + 1])
        counts = [0] * S
        for i in range(order, t + 1):
            if tuple(x[i - order:i]) == ctx:
                counts[x[i]] += 1
        n = sum(counts)
        out[t] = torch.tensor([(c + beta) / (n + S * beta) for c in counts])
    return out


def dirichlet_marginal_predictive(x, order, S, beta):
    """P(x_{t+1} = j | x_1..t) as a ratio of Dirichlet-multinomial marginal likelihoods
    p(x_1..t, j) / p(x_1..t), each a product over contexts of B(n_c + β) / B(β)."""
    def log_marginal(seq):
        counts = {}
        for i in range(order, len(seq)):
            row = counts.setdefault(tuple(seq[i - order:i]), [0] * S)
            row[seq[i]] += 1
        total = 0.0
        for row in counts.values():
            total += sum(math.lgamma(c + beta) - math.lgamma(beta) for c in row)
            total += math.lgamma(S * beta) - math.lgamma(sum(row) + S * beta)
        return total - len(seq[:order]) * math.log(S)  # first k tokens uniform

    T = len(x) - 1
    out = torch.empty(T, S, dtype=torch.float64)
    for t in range(T):
        prefix = list(x[:t + 1])
        base = log_marginal(prefix)
        out[t] = torch.tensor([math.exp(log_marginal(prefix + [j]) - base) for j in range(S)])
    return out


@pytest.mark.parametrize("order,S", list(itertools.product([1, 2, 3], [2, 3, 5])))
def test_add_beta_equals_counting_and_dirichlet_posterior(order, S):
    beta = 0.6
    t = task(order, S, beta=beta, T=40)
    batch = t.sample(3, make_generator(order * 10 + S))
    fast = t.add_beta(batch).exp()
    for b in range(3):
        x = torch.cat([batch.inputs[b], batch.targets[b, -1:]]).tolist()
        assert torch.allclose(fast[b], naive_add_beta(x, order, S, beta), atol=1e-12)
        assert torch.allclose(fast[b], dirichlet_marginal_predictive(x, order, S, beta),
                              atol=1e-10)


def test_references_are_distributions_and_clairvoyant_is_the_kernel():
    t = task(2, 3, T=32)
    batch = t.sample(16, make_generator(3))
    refs = {name: ref.predict(batch) for name, ref in t.references().items()}
    assert {ref.role for ref in t.references().values()} == {"bayes", "bound", "baseline"}
    for logp in refs.values():
        assert torch.allclose(logp.exp().sum(-1), torch.ones(16, 32, dtype=torch.float64))
    ids = context_ids(batch.inputs, 2, 3)
    b, pos = 5, 20
    kernel = batch.latent["kernel"][b, ids[b, pos]].double()
    assert torch.allclose(refs["clairvoyant"][b, pos].exp(), kernel / kernel.sum(), atol=1e-12)


def test_bayes_beats_unigram_and_clairvoyant_bounds_bayes():
    t = task(1, 2, T=128)
    batch = t.sample(512, make_generator(4))
    loss = {name: t.position_loss(ref.predict(batch), batch.targets).mean(1)
            for name, ref in t.references().items()}
    for worse, better in (("unigram", "bayes"), ("bayes", "clairvoyant")):
        diff = loss[worse] - loss[better]
        assert diff.mean() > 4 * diff.std() / math.sqrt(len(diff))
