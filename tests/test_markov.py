"""Random Markov chains: the sampler against its kernel, add-beta against its definitions."""
import itertools
import math

import pytest
import torch

from tasks.base import TEST_STREAM, TRAIN_STREAM, make_generator
from tasks.distributions import SCAN_MAX_ENTRIES
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


# --- the hold-out experiment (paper 000 App. E.5, Table 2) --------------------------------------
def split_task(S=2, split=0.5, order=2, T=32, **kw):
    return MarkovTask(MarkovConfig(order=order, vocab_size=S, seq_len=T, simplex_split=split,
                                   **kw), batch_size=500)


def within(samples: torch.Tensor, expected: float, z: float = 5.0) -> bool:
    return abs(samples.mean().item() - expected) <= z * samples.std().item() / math.sqrt(
        samples.numel())


def test_hold_out_split_trains_below_and_evaluates_above():
    """Binary chains, β = 1, split 0.5: every training row has p = P(1 | context) ~ U[0, 0.5]
    (mean 1/4, variance 1/48), every held-out row p ~ U(0.5, 1] (mean 3/4); the training batch
    drawn by the Lightning path obeys it too, and the held-out set leaves the prior."""
    t = split_task()
    train = t.training_batch(0).latent["kernel"].reshape(-1, 2)
    held = t.held_out(500).latent["kernel"].reshape(-1, 2)
    assert len(train) == len(held) == 2000
    p, q = train[:, 1], held[:, 1]
    assert p.max() <= 0.5 and q.min() > 0.5
    assert within(p, 0.25) and within((p - 0.25) ** 2, 1 / 48)
    assert within(q, 0.75) and within((q - 0.75) ** 2, 1 / 48)
    assert not t.held_out_from_prior and split_task(split=0.0).held_out_from_prior
    # the training batches' tokens follow the restricted kernels (z-scores of transitions)
    batch = t.training_batch(0)
    assert transition_z_scores(batch, 2, 2, slice(1, None)).abs().max() < 4.5
    # the held-out set without a split is the one every other markov config gets
    plain = task(order=2, S=2, T=32).held_out(50)
    assert torch.equal(split_task(split=0.0).held_out(50).inputs, plain.inputs)


def test_hold_out_split_scored_in_the_training_region_for_its_control():
    """simplex_eval=training: the same training region, held-out kernels drawn from it (the
    in-distribution control of Table 2); the training batches are unchanged."""
    t = split_task(simplex_eval="training")
    held = t.held_out(500).latent["kernel"].reshape(-1, 2)[:, 1]
    assert held.max() <= 0.5 and within(held, 0.25)
    assert torch.equal(t.training_batch(0).inputs, split_task().training_batch(0).inputs)
    assert not t.held_out_from_prior
    with pytest.raises(ValueError, match="simplex_eval must be one of complement, training"):
        MarkovConfig(simplex_split=0.5, simplex_eval="inside")
    with pytest.raises(ValueError, match="simplex_eval=training needs a simplex_split"):
        MarkovConfig(simplex_eval="training")


def test_hold_out_split_with_three_symbols_conditions_only_p1():
    """S = 3, β = 1: P(1) ~ Beta(1, 2) restricted to [0, 0.5], density 2(1 - p)/0.75, mean
    (1/2 - 1/12)·2/0.75 = 2/9; given P(1), the other two split the rest uniformly."""
    t = split_task(S=3, order=1)
    rows = t.draw_latent(6000, make_generator(4))["kernel"].reshape(-1, 3)
    assert rows[:, 1].max() <= 0.5 and within(rows[:, 1], 2 / 9)
    share = rows[:, 0] / (rows[:, 0] + rows[:, 2])
    assert within(share, 0.5) and within((share - 0.5) ** 2, 1 / 12)
    torch.testing.assert_close(rows.sum(-1), torch.ones(len(rows), dtype=torch.float64))


def test_hold_out_split_validation_and_pool():
    with pytest.raises(ValueError, match="simplex_split must be 0"):
        MarkovConfig(simplex_split=1.0)
    # S = 10, β = 1: P(p_1 > 0.9) = 0.1^9, far below MIN_REGION_MASS
    with pytest.raises(ValueError, match=r"each side needs >= 0.01"):
        MarkovConfig(vocab_size=10, simplex_split=0.9)
    pooled = split_task(num_tasks=4)
    pool = pooled.task_pool("cpu")["kernel"]
    assert pool.shape == (4, 4, 2) and pool[..., 1].max() <= 0.5  # the pool is in the region


def test_hold_out_summary_is_table_2_distance_by_context_length():
    """Through bench.training.evaluate.score: the distance of each predictor to add-β per bin is the mean
    over the bin's positions of |P(1) - P_add-β(1)| (binary: TV = |Δ P(1)|), 0 for add-β."""
    from bench.training.evaluate import score
    t = split_task(T=16)
    batch = t.held_out(300)
    predictions = {name: ref.predict(batch) for name, ref in t.references().items()}
    predictions["model"] = predictions["unigram"]
    summary = score(t, batch, predictions, resamples=10)["metrics"]["task"]
    assert summary["context_lengths"] == [1, 2, 4, 8, 16] and summary["simplex_split"] == 0.5
    distance = summary["tv_to_bayes_by_context_length"]
    assert distance["bayes"] == [0.0] * 5
    direct = (predictions["unigram"][..., 1].exp() - predictions["bayes"][..., 1].exp()).abs()
    for k, value in zip(summary["context_lengths"], distance["model"]):
        assert value == pytest.approx(float(direct[:, k // 2:k].mean()), rel=1e-9)
    assert distance["model"] == distance["unigram"]
    assert task().summarize(batch, {}, None) == {}  # nothing without a split


# --- the vectorised sampler against its step-by-step twin ---------------------------------------
def equal_batches(a, b) -> bool:
    return (torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
            and torch.equal(a.latent["kernel"], b.latent["kernel"]))


@pytest.mark.parametrize("order,S,T,n,split", [
    (1, 2, 256, 32, 0.0), (1, 8, 37, 9, 0.0), (2, 3, 50, 6, 0.0), (3, 2, 100, 5, 0.0),
    (2, 4, 33, 4, 0.5), (3, 2, 1, 3, 0.0), (3, 2, 2, 3, 0.0), (2, 5, 19, 1, 0.3)])
def test_sampler_is_its_sequential_loop_bit_for_bit(order, S, T, n, split):
    """Kernels fresh from the prior, from the held-out region (simplex_split), and T shorter than
    the order (no kernel step at all) or not a power of two."""
    t = MarkovTask(MarkovConfig(order=order, vocab_size=S, seq_len=T, beta=0.4,
                                simplex_split=split))
    latent = t.draw_latent(n, make_generator(order, S), held_out=bool(split))
    assert equal_batches(t.sample_given(latent, make_generator(T)),
                         t._sample_sequential(latent, make_generator(T)))


def test_chunked_pooled_and_held_out_batches_are_the_loops(monkeypatch):
    """A batch scanned a few sequences at a time, a training batch from a pool of kernels, and the
    held-out set (tasks/base.py: sample_train, held_out) are what the loop gives."""
    t = MarkovTask(MarkovConfig(order=2, vocab_size=3, seq_len=40, num_tasks=5), batch_size=16)
    latent = t.draw_latent(16, make_generator(1))
    whole = t.sample_given(latent, make_generator(2))
    monkeypatch.setattr("tasks.distributions.SCAN_CHUNK_ELEMENTS", 3 * 40 * 9)
    assert equal_batches(t.sample_given(latent, make_generator(2)), whole)
    assert equal_batches(whole, t._sample_sequential(latent, make_generator(2)))
    train, g = t.sample_train(16, make_generator(3)), make_generator(3)
    index = torch.randint(5, (16,), generator=g)
    pooled = {"kernel": t.task_pool("cpu")["kernel"][index]}
    assert equal_batches(train, t._sample_sequential(pooled, g))
    g = make_generator(TEST_STREAM, 0)
    assert equal_batches(t.held_out(20), t._sample_sequential(t.draw_latent(20, g), g))


def test_large_batches_keep_the_loop(monkeypatch):
    """Past SCAN_MAX_ENTRIES table entries per step the loop is the faster form, and is used."""
    t = MarkovTask(MarkovConfig(order=3, vocab_size=8, seq_len=5))
    loop_calls = []
    monkeypatch.setattr(t, "_sample_sequential", lambda *args: loop_calls.append(args))
    largest = SCAN_MAX_ENTRIES // 8**3
    for n in (largest, largest + 1):
        t.sample_given(t.draw_latent(n, make_generator(0)), make_generator(1))
    assert len(loop_calls) == 1 and len(loop_calls[0][0]["kernel"]) == largest + 1


# --- paper 000 Fig. 5's count-mechanism summary against its definitions --------------------------
def brute_force_count_summary(tokens, b, c, write, direct, S):
    """Fig. 5's quantities by explicit loops: every mean inner product over all pairs of
    positions (s, t) with the given windows, never through group means."""
    n, length = tokens.shape
    later = [(q, t) for q in range(n) for t in range(1, length)]
    window = {(q, t): (int(tokens[q, t - 1]), int(tokens[q, t])) for q, t in later}

    def pair_mean(f, rows, cols):
        values = [f(r, col) for r in rows for col in cols]
        return sum(values) / len(values) if values else None

    def dot(r, col):
        return float((b[r] * c[col]).sum())

    at = {key: [p for p in later if window[p] == key]
          for key in itertools.product(range(S), repeat=2)}
    current = {k: [p for p in later if window[p][1] == k] for k in range(S)}
    by_window = {(i, j, l, k): pair_mean(dot, at[i, j], at[l, k])
                 for i, j, l, k in itertools.product(range(S), repeat=4)}
    inner = {(i, j, k): pair_mean(dot, at[i, j], current[k])
             for i, j, k in itertools.product(range(S), repeat=3)}
    scale, free = {}, {}
    for l, k, j in itertools.product(range(S), repeat=3):
        scale[l, k, j] = pair_mean(lambda r, col: float((write[r][:, j] * (b[r] * c[col]).sum(-1))
                                                        .sum()), at[k, j], at[l, k])
        for x1 in range(S):
            firsts = [(q, 0) for q in range(n) if tokens[q, 0] == x1]
            term = pair_mean(lambda r, col: float((write[r][:, j] * (b[r] * c[col]).sum(-1))
                                                  .sum()), firsts, at[l, k])
            embed = (sum(float(direct[r][j]) for r in current[k]) / len(current[k])
                     if current[k] else None)
            free[x1, l, k, j] = None if term is None or embed is None else embed + term
    return by_window, inner, scale, free


def test_count_probe_summary_is_its_definition():
    """MarkovTask.summarize_probes on random probes (3 symbols, 2 groups) equals the loops: the
    mean over pairs of positions is the inner product of group means; a window that never occurs
    (2 -> 2 here) is None and left out of the ratio and the β range; the ratio and β estimates
    from their formulas."""
    from tasks.markov import count_probe_summary
    S, n, length = 3, 4, 14
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, S, (n, length), generator=g)
    tokens[0, 0] = 2  # 2 starts a sequence ...
    for t in range(1, length):  # ... but never follows itself: the window (2, 2) never occurs
        tokens[:, t] = torch.where((tokens[:, t - 1] == 2) & (tokens[:, t] == 2), 0, tokens[:, t])
    probes = {"ssm_b": torch.randn(n, length, 2, 4, generator=g, dtype=torch.float64),
              "ssm_c": torch.randn(n, length, 2, 4, generator=g, dtype=torch.float64),
              "logit_write": torch.randn(n, length, 2, S, generator=g, dtype=torch.float64),
              "logit_direct": torch.randn(n, length, S, generator=g, dtype=torch.float64)}
    summary = count_probe_summary(tokens, probes, S)
    by_window, inner, scale, free = brute_force_count_summary(
        tokens, probes["ssm_b"], probes["ssm_c"], probes["logit_write"], probes["logit_direct"], S)

    def same(got, want):
        assert (got is None) == (want is None)
        if want is not None:
            assert got == pytest.approx(want, rel=1e-10, abs=1e-12)

    for i, j, l, k in itertools.product(range(S), repeat=4):
        same(summary["bc_inner_by_window"][i][j][l][k], by_window[i, j, l, k])
    for i, j, k in itertools.product(range(S), repeat=3):
        same(summary["bc_inner"][i][j][k], inner[i, j, k])
    assert summary["bc_inner_by_window"][2][2][0][0] is None
    wrong = [abs(v) for (i, j, l, k), v in by_window.items() if v is not None and i != k]
    right = [abs(v) for (i, j, l, k), v in by_window.items() if v is not None and i == k]
    assert summary["bc_wrong_ratio"] == pytest.approx(max(wrong) / min(right), rel=1e-10)
    betas = []
    for x1, l, k, j in itertools.product(range(S), repeat=4):
        same(summary["count_vector_scale"][l][k][j], scale[l, k, j])
        same(summary["count_free"][x1][l][k][j], free[x1, l, k, j])
        want = (None if free[x1, l, k, j] is None or scale[l, k, j] is None
                else free[x1, l, k, j] / scale[l, k, j])
        same(summary["count_free_beta"][x1][l][k][j], want)
        betas += [want] if want is not None else []
    assert summary["count_free_beta_min"] == pytest.approx(min(betas), rel=1e-10)
    assert summary["count_free_beta_max"] == pytest.approx(max(betas), rel=1e-10)
    # without the logit probes (a softmax head) only the inner products
    assert set(count_probe_summary(tokens, {k: probes[k] for k in ("ssm_b", "ssm_c")}, S)) == {
        "bc_inner", "bc_inner_by_window", "bc_wrong_ratio"}


def test_count_probe_summary_only_at_order_one_and_only_with_the_probes():
    probes = {"ssm_b": torch.ones(2, 8, 1, 2), "ssm_c": torch.ones(2, 8, 1, 2)}
    batch = task(1, 2, T=8).held_out(2)
    assert "bc_wrong_ratio" in task(1, 2, T=8).summarize_probes(batch, probes)
    assert task(2, 2, T=8).summarize_probes(task(2, 2, T=8).held_out(2), probes) == {}
    assert task(1, 2, T=8).summarize_probes(batch, {}) == {}  # a model without probes
    assert task(1, 2, T=8).summarize_probes(batch, {"ssm_b": probes["ssm_b"]}) == {}
