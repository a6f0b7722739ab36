"""HMM task: the clairvoyant forward filter against brute-force enumeration of hidden paths,
its stability on long sequences, the n-gram baselines against naive counts, and the sampler
against its definition (uniform initial state, Dirichlet rows, emissions and transitions drawn
from the recorded A and C).

Statistical checks use z-scores (or a χ² p-value) with a false-alarm rate of 1e-3 per test,
split (Bonferroni) over the number of simultaneous z-scores; seeds are fixed, so the outcome is
deterministic. Identities hold to float64 rounding (~1e-13), hence the 1e-10 tolerance.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from scipy.stats import chi2, norm

from bench.config import compose
from bench.training.evaluate import score
from tasks import task_families
from tasks.base import Batch, make_generator
from tasks.hmm import HMMConfig, HMMTask

CONF = Path(__file__).resolve().parents[1] / "conf" / "task" / "hmm.yaml"
FALSE_ALARM = 1e-3


def critical_z(simultaneous: int = 1) -> float:
    return float(norm.isf(FALSE_ALARM / (2 * simultaneous)))


def make_task(**overrides) -> HMMTask:
    return HMMTask(HMMConfig(**overrides))


def full_tokens(batch) -> torch.Tensor:
    return torch.cat([batch.inputs, batch.targets[:, -1:]], 1)


def joint_probability(tokens: list[int], A: torch.Tensor, C: torch.Tensor) -> float:
    """P(x_0..x_n | A, C) = Σ over all hidden paths of (1/H) Π C[z_s, x_s] Π A[z_s, z_{s+1}]."""
    H = A.shape[0]
    total = 0.0
    for path in itertools.product(range(H), repeat=len(tokens)):
        p = 1.0 / H
        for s, (z, x) in enumerate(zip(path, tokens)):
            p *= C[z, x].item() * (A[path[s - 1], z].item() if s > 0 else 1.0)
        total += p
    return total


def test_forward_filter_equals_brute_force_enumeration():
    H, V, T = 3, 4, 5
    task = make_task(num_states=H, vocab_size=V, transition_concentration=0.5,
                     emission_concentration=0.7, seq_len=T)
    batch = task.sample(4, make_generator(21))
    tokens = full_tokens(batch)
    predicted = task.clairvoyant(batch).exp()
    expected = torch.empty_like(predicted)
    for b in range(len(batch)):
        A, C = batch.latent["transition"][b], batch.latent["emission"][b]
        sequence = tokens[b].tolist()
        for t in range(T):
            past = joint_probability(sequence[:t + 1], A, C)
            for v in range(V):
                expected[b, t, v] = joint_probability(sequence[:t + 1] + [v], A, C) / past
    torch.testing.assert_close(predicted, expected, rtol=1e-10, atol=1e-10)


def scaled_forward_filter(A: torch.Tensor, C: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """The textbook filter in probability space, renormalised every step (Rabiner's scaling):
    P(x_{t+1} = · | x_0..x_t) for one sequence, shape (len(tokens) - 1, V)."""
    belief = C[:, tokens[0]] / C[:, tokens[0]].sum()
    out = []
    for x in tokens[1:]:
        state = belief @ A
        out.append(state @ C)
        belief = state * C[:, x]
        belief = belief / belief.sum()
    return torch.stack(out)


def test_forward_filter_is_stable_on_long_sequences():
    task = make_task(seq_len=1500)
    batch = task.sample(2, make_generator(22))
    prediction = task.clairvoyant(batch)
    assert torch.isfinite(task.position_loss(prediction, batch.targets)).all()
    tokens = full_tokens(batch)
    for b in range(len(batch)):
        expected = scaled_forward_filter(batch.latent["transition"][b],
                                         batch.latent["emission"][b], tokens[b].tolist())
        # Compare where the probability is not negligible: relative precision of log-probs.
        torch.testing.assert_close(prediction[b].exp(), expected, rtol=1e-9, atol=1e-12)


def test_baselines_equal_naive_counts():
    V = 5
    task = make_task(num_states=3, vocab_size=V, seq_len=30)
    batch = task.sample(3, make_generator(23))
    beta = task.baseline_beta
    unigram, bigram = task.unigram(batch).exp(), task.bigram(batch).exp()
    for b in range(len(batch)):
        x = batch.inputs[b].tolist() + [batch.targets[b, -1].item()]
        for t in range(task.seq_len):
            seen = torch.tensor([x[:t + 1].count(v) for v in range(V)], dtype=torch.float64)
            after = torch.tensor([sum(1 for s in range(t) if x[s] == x[t] and x[s + 1] == v)
                                  for v in range(V)], dtype=torch.float64)
            torch.testing.assert_close(unigram[b, t], (seen + beta) / (seen.sum() + V * beta))
            torch.testing.assert_close(bigram[b, t], (after + beta) / (after.sum() + V * beta))


def test_initial_state_is_uniform():
    H = 8
    task = make_task(num_states=H, vocab_size=2, seq_len=1)
    first = task.sample(2000, make_generator(24)).latent["states"][:, 0]
    counts = torch.bincount(first, minlength=H).double()
    statistic = float(((counts - 2000 / H) ** 2 / (2000 / H)).sum())
    assert chi2.sf(statistic, H - 1) > FALSE_ALARM, counts


def test_rows_have_dirichlet_moments():
    task = make_task(num_states=20, vocab_size=30, seq_len=1)
    batch = task.sample(100, make_generator(25))
    checks = []
    for name, alpha in (("transition", 0.1), ("emission", 0.05)):
        rows = batch.latent[name].reshape(-1, batch.latent[name].shape[-1])
        size = rows.shape[-1]
        torch.testing.assert_close(rows.sum(-1), torch.ones(len(rows), dtype=torch.float64))
        mean, variance = 1 / size, (1 / size) * (1 - 1 / size) / (size * alpha + 1)
        checks.append((rows[:, 0].mean() - mean) / math.sqrt(variance / len(rows)))
        # Rows are i.i.d.; Σ_j (P_j - 1/n)^2 has expectation n · Var(P_j).
        spread = (rows - mean).pow(2).sum(-1)
        checks.append((spread.mean() - size * variance) / (spread.std() / math.sqrt(len(rows))))
    z = torch.tensor(checks)
    assert z.abs().max() < critical_z(len(checks)), z


def log_likelihood_z(rows: torch.Tensor, outcomes: torch.Tensor) -> float:
    """z-score of Σ log P[x] against its mean Σ_j P_j log P_j and variance if x ~ P."""
    log_rows = rows.log()
    observed = log_rows.gather(1, outcomes.unsqueeze(1)).sum()
    mean = torch.special.xlogy(rows, rows).sum(-1)  # an exact zero contributes 0 · log 0 = 0
    second = torch.where(rows > 0, rows * log_rows.pow(2), torch.zeros_like(rows)).sum(-1)
    variance = second - mean.pow(2)
    return float((observed - mean.sum()) / variance.sum().sqrt())


def frequency_z(rows: torch.Tensor, outcomes: torch.Tensor) -> torch.Tensor:
    """Per outcome j: z-score of Σ (1[x = j] - P_j) over the events, variance Σ P_j (1 - P_j)."""
    excess = torch.nn.functional.one_hot(outcomes, rows.shape[-1]).double().sum(0) - rows.sum(0)
    return excess / (rows * (1 - rows)).sum(0).sqrt()


def test_emissions_and_transitions_follow_the_recorded_matrices():
    H, V = 10, 20
    task = make_task(num_states=H, vocab_size=V, seq_len=100)
    batch = task.sample(100, make_generator(26))
    states, tokens = batch.latent["states"], full_tokens(batch)
    sequence = torch.arange(len(batch)).unsqueeze(1)
    emission_rows = batch.latent["emission"][sequence, states]  # (B, T+1, V)
    transition_rows = batch.latent["transition"][sequence, states[:, :-1]]  # (B, T, H)
    events = {
        "emission": (emission_rows.reshape(-1, V), tokens.reshape(-1)),
        "transition": (transition_rows.reshape(-1, H), states[:, 1:].reshape(-1)),
    }
    tests = 2 * (1 + V + H)
    for name, (rows, outcomes) in events.items():
        z = frequency_z(rows, outcomes)
        assert z.abs().max() < critical_z(tests), (name, z)
        assert abs(log_likelihood_z(rows, outcomes)) < critical_z(tests), name
    # The likelihood statistic has power: the rows of the next hidden state do not fit.
    wrong = batch.latent["emission"][sequence, (states + 1) % H].reshape(-1, V)
    assert log_likelihood_z(wrong, tokens.reshape(-1)) < -10 * critical_z()


def test_references_normalised_and_clairvoyant_beats_baselines():
    task = make_task(seq_len=64)
    batch = task.held_out(64)
    losses = {}
    for name, reference in task.references().items():
        prediction = reference.predict(batch)
        assert prediction.shape == (64, 64, 100) and prediction.dtype == torch.float64
        torch.testing.assert_close(prediction.logsumexp(-1), torch.zeros(64, 64,
                                                                         dtype=torch.float64))
        losses[name] = task.position_loss(prediction, batch.targets).mean(1)
    assert {r.role for r in task.references().values()} == {"bound", "baseline"}
    for baseline in ("unigram", "bigram"):
        diff = losses[baseline] - losses["clairvoyant"]
        assert diff.mean() / (diff.std() / math.sqrt(len(diff))) > critical_z(2), baseline


def test_sampling_is_reproducible():
    task = make_task(num_states=5, vocab_size=7, seq_len=20)
    first, second = task.sample(4, make_generator(27)), task.sample(4, make_generator(27))
    assert torch.equal(first.inputs, second.inputs) and torch.equal(first.targets, second.targets)
    for key in ("transition", "emission", "states"):
        assert torch.equal(first.latent[key], second.latent[key])
    assert torch.equal(first.inputs[:, 1:], first.targets[:, :-1])


def equal_batches(a: Batch, b: Batch) -> bool:
    return torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets) and all(
        torch.equal(a.latent[key], b.latent[key]) for key in ("transition", "emission", "states"))


@pytest.mark.parametrize("H,V,T,n", [(50, 100, 256, 32), (1, 4, 9, 3), (7, 2, 30, 5),
                                     (5, 7, 1, 1), (12, 9, 100, 40)])
def test_sampler_is_its_sequential_loop_bit_for_bit(H, V, T, n):
    """On the CPU the uniforms drawn up front are the loop's (test_distributions.py), so the
    scanned path and its tokens are the loop's, bit for bit."""
    task = make_task(num_states=H, vocab_size=V, seq_len=T, transition_concentration=0.05)
    latent = task.draw_latent(n, make_generator(H, V))
    assert equal_batches(task.sample_given(latent, make_generator(T)),
                         task._sample_sequential(latent, make_generator(T)))


def test_chunked_and_pooled_batches_are_the_loops(monkeypatch):
    task = HMMTask(HMMConfig(num_states=6, vocab_size=5, seq_len=40, num_tasks=4), batch_size=16)
    latent = task.draw_latent(16, make_generator(1))
    whole = task.sample_given(latent, make_generator(2))
    monkeypatch.setattr("tasks.distributions.SCAN_CHUNK_ELEMENTS", 3 * (40 * 6 + 41 * 5))
    assert equal_batches(task.sample_given(latent, make_generator(2)), whole)
    assert equal_batches(whole, task._sample_sequential(latent, make_generator(2)))
    train, g = task.sample_train(16, make_generator(3)), make_generator(3)
    index = torch.randint(4, (16,), generator=g)
    pooled = {key: value[index] for key, value in task.task_pool("cpu").items()}
    assert equal_batches(train, task._sample_sequential(pooled, g))


def test_config_file_and_registry():
    assert task_families()["hmm"] is HMMTask
    lines = CONF.read_text().splitlines()
    assert lines[0].startswith("# ") and lines[1] == "family: hmm"
    values = OmegaConf.to_container(OmegaConf.load(CONF))
    assert values.pop("family") == "hmm"
    assert values == dataclasses.asdict(HMMConfig())


def test_paper_preset_is_appendix_b3():
    """conf/task/hmm_paper.yaml: hmm.yaml with B.3's training protocol, sequences of 512
    characters and a pool of 50,000 training HMMs; it composes with transformer_hmm."""
    paper = OmegaConf.to_container(OmegaConf.load(CONF.with_name("hmm_paper.yaml")))
    default = OmegaConf.to_container(OmegaConf.load(CONF))
    assert CONF.with_name("hmm_paper.yaml").read_text().startswith("# ")
    assert {k: v for k, v in paper.items() if default[k] != v} == {"seq_len": 512,
                                                                   "num_tasks": 50_000}
    config = compose(["task=hmm_paper", "model=transformer_hmm"])
    task = HMMTask(config.task)
    assert task.seq_len == 512 and task.num_tasks == 50_000
    assert task.pool_bytes() == 50_000 * (50 * 50 + 50 * 100) * 8  # 3.0 GB of float64


def test_accuracy_by_context_length_on_constructed_hits():
    """Paper 004 Fig. 3: top-1 accuracy binned by context length k ∈ {1, 2, 4, 8}, bin k holding
    the positions with context length in (k/2, k] (indices 0 | 1 | 2-3 | 4-7)."""
    task = make_task(num_states=2, vocab_size=3, seq_len=8)
    hits = torch.tensor([[1, 0, 1, 0, 1, 0, 1, 0], [1] * 8, [0] * 8], dtype=torch.bool)
    mask = torch.ones(3, 8, dtype=torch.bool)
    batch = Batch(torch.zeros(3, 8, dtype=torch.long), torch.zeros(3, 8, dtype=torch.long), mask)
    scores = {"model": {"loss": torch.zeros(3, 8), "correct": hits},
              "other": {"loss": torch.zeros(3, 8), "correct": ~hits},
              "no_hits": {"loss": torch.zeros(3, 8)}}
    summary = task.summarize(batch, {n: s["loss"] for n, s in scores.items()}, scores)
    assert summary["context_lengths"] == [1, 2, 4, 8]
    accuracy = summary["accuracy_by_context_length"]
    assert set(accuracy) == {"model", "other"}
    # per sequence: [1, 0, .5, .5], [1, 1, 1, 1], [0, 0, 0, 0]
    assert accuracy["model"] == pytest.approx([2 / 3, 1 / 3, 1 / 2, 1 / 2], abs=1e-15)
    assert accuracy["other"] == pytest.approx([1 / 3, 2 / 3, 1 / 2, 1 / 2], abs=1e-15)
    third = math.sqrt(1 / 3) / math.sqrt(3)  # sd of {1, 1, 0} (and of {0, 1, 0}) over √3
    assert summary["accuracy_by_context_length_stderr"]["model"] == pytest.approx(
        [third, third, 0.5 / math.sqrt(3), 0.5 / math.sqrt(3)], abs=1e-15)
    # an unscored position leaves its bin: sequence 0 keeps only index 2 of bin 4 (a hit)
    mask[0, 3] = False
    batch = Batch(batch.inputs, batch.targets, mask)
    accuracy = task.summarize(batch, {}, scores)["accuracy_by_context_length"]
    assert accuracy["model"][2] == pytest.approx(2 / 3, abs=1e-15)
    assert task.summarize(batch, {}, None)["accuracy_by_context_length"] == {}


def test_accuracy_by_context_length_in_the_scored_record():
    """Through bench.training.evaluate.score: the record's metrics.task curve is the per-position top-1
    curve averaged over each bin (every position scored), for the model and each reference."""
    task = make_task(seq_len=64)
    batch = task.held_out(200)
    predictions = {name: ref.predict(batch) for name, ref in task.references().items()}
    predictions["model"] = predictions["bigram"]
    result = score(task, batch, predictions, resamples=10)
    summary = result["metrics"]["task"]
    assert summary["context_lengths"] == [1, 2, 4, 8, 16, 32, 64]
    accuracy = summary["accuracy_by_context_length"]
    assert set(accuracy) == set(predictions)
    for name, curve in accuracy.items():
        per_position = result["per_position"][f"accuracy.{name}"]
        for k, value in zip(summary["context_lengths"], curve):
            expected = sum(per_position[k // 2:k]) / (k - k // 2)
            assert value == pytest.approx(expected, rel=1e-12), (name, k)
    assert accuracy["model"] == accuracy["bigram"]
    # from k = 8 on, the filter that knows (A, C) beats both n-gram baselines by > 5 standard
    # errors (its accuracy is ~0.08 with H = 50, V = 100: the topic moves at every step)
    stderr = summary["accuracy_by_context_length_stderr"]
    for base in ("unigram", "bigram"):
        for i in range(3, 7):
            gap = accuracy["clairvoyant"][i] - accuracy[base][i]
            assert gap > 5 * math.hypot(stderr["clairvoyant"][i], stderr[base][i]), (base, i)
