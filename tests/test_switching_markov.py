"""Switching Markov task: the Bayes predictor against a brute-force marginal-likelihood
computation, the clairvoyant and no-reset predictors against naive loops, and the sampler
against its definition (switch rate, uniform restarts, Dir(β) kernel rows, transitions drawn
from the recorded kernel of each segment).

Statistical checks use z-scores with a two-sided false-alarm rate of 1e-3 per test, split
(Bonferroni) over the number of simultaneous z-scores; the seeds are fixed, so the outcome is
deterministic. Identities hold to float64 rounding of sums of a few hundred terms (~1e-13),
hence the 1e-10 tolerance.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from scipy.stats import norm

from bench.training.checks import compose_checked
from bench.training.evaluate import probe_summary
from bench.training.train import run
from models import IOSpec, build_model, model_families
from tasks import task_families
from tasks.base import make_generator
from tasks.markov import context_ids
from tasks.switching_markov import SwitchingMarkovConfig, SwitchingMarkovTask, segment_layout

CONF = Path(__file__).resolve().parents[1] / "conf" / "task" / "switching_markov.yaml"


def critical_z(simultaneous: int = 1, false_alarm: float = 1e-3) -> float:
    return float(norm.isf(false_alarm / (2 * simultaneous)))


def make_task(**overrides) -> SwitchingMarkovTask:
    return SwitchingMarkovTask(SwitchingMarkovConfig(**overrides))


def full_tokens(batch) -> torch.Tensor:
    """x_0..x_T of each sequence."""
    return torch.cat([batch.inputs, batch.targets[:, -1:]], 1)


def log_marginal_likelihood(tokens: list[int], S: int, k: int, beta: float, p: float) -> float:
    """log P(x_0..x_n) under the generative model, walking the sequence once: a switch costs p,
    a symbol 1 - p; the first k symbols after a start or a switch cost 1/S each; the other
    symbols of a segment contribute, per context, the Dirichlet-multinomial evidence
    Γ(Sβ)/Γ(n + Sβ) · Π_j Γ(n_j + β)/Γ(β) of their counts (the kernel integrated out)."""
    def evidence(counts: dict[tuple, list[int]]) -> float:
        total = 0.0
        for row in counts.values():
            total += math.lgamma(S * beta) - math.lgamma(sum(row) + S * beta)
            total += sum(math.lgamma(c + beta) - math.lgamma(beta) for c in row)
        return total

    total, counts, since_switch = 0.0, {}, []
    for x in tokens:
        if x == S:
            total += math.log(p) + evidence(counts)
            counts, since_switch = {}, []
            continue
        total += math.log1p(-p)
        if len(since_switch) < k:
            total -= math.log(S)
        else:
            counts.setdefault(tuple(since_switch[-k:]), [0] * S)[x] += 1
        since_switch.append(x)
    return total + evidence(counts)


@pytest.mark.parametrize("order,symbols,beta", [(1, 3, 0.7), (2, 2, 1.5)])
def test_bayes_equals_brute_force_marginal_likelihood_ratio(order, symbols, beta):
    p = 0.15  # many switches in a short sequence
    task = make_task(order=order, vocab_size=symbols, beta=beta, p_switch=p, seq_len=40)
    batch = task.sample(6, make_generator(11))
    tokens = full_tokens(batch)
    assert (tokens == symbols).sum() >= 10  # the sequences do switch
    predicted = task.bayes(batch).exp()
    expected = torch.empty_like(predicted)
    for b in range(len(batch)):
        sequence = tokens[b].tolist()
        for t in range(task.seq_len):
            past = log_marginal_likelihood(sequence[:t + 1], symbols, order, beta, p)
            for v in range(symbols + 1):
                joint = log_marginal_likelihood(sequence[:t + 1] + [v], symbols, order, beta, p)
                expected[b, t, v] = math.exp(joint - past)
    torch.testing.assert_close(predicted, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(predicted.sum(-1), torch.ones(6, 40, dtype=torch.float64))


def test_clairvoyant_and_no_reset_equal_naive_loops():
    S, k, p, beta = 3, 2, 0.1, 0.8
    task = make_task(order=k, vocab_size=S, beta=beta, p_switch=p, seq_len=60)
    batch = task.sample(5, make_generator(12))
    tokens = full_tokens(batch)
    kernels = batch.latent["kernels"].double()
    kernels = kernels / kernels.sum(-1, keepdim=True)
    clairvoyant, no_reset = task.clairvoyant(batch).exp(), task.no_reset(batch).exp()
    for b in range(len(batch)):
        segment, since_switch, counts = 0, [], {}
        for t in range(task.seq_len):
            x = tokens[b, t].item()
            if x == S:
                segment, since_switch = segment + 1, []
            else:
                since_switch.append(x)
            symbol_true = torch.full((S,), 1.0 / S, dtype=torch.float64)
            symbol_counted = symbol_true.clone()
            if len(since_switch) >= k:
                context = since_switch[-k:]
                row = sum(c * S**lag for lag, c in enumerate(reversed(context)))
                symbol_true = kernels[b, segment, row]
                n = torch.tensor(counts.get(tuple(context), [0] * S), dtype=torch.float64)
                symbol_counted = (n + beta) / (n.sum() + S * beta)
                nxt = tokens[b, t + 1].item()
                if nxt != S:  # counted whatever the segment: no reset
                    counts.setdefault(tuple(context), [0] * S)[nxt] += 1
            for got, symbol in ((clairvoyant, symbol_true), (no_reset, symbol_counted)):
                want = torch.cat([(1 - p) * symbol, torch.tensor([p], dtype=torch.float64)])
                torch.testing.assert_close(got[b, t], want, rtol=1e-10, atol=1e-10)


def test_switch_rate_matches_p_switch():
    p = 0.01
    task = make_task(p_switch=p)
    tokens = full_tokens(task.sample(400, make_generator(13)))
    trials = tokens.numel()
    switches = int((tokens == task.switch_token).sum())
    z = (switches - trials * p) / math.sqrt(trials * p * (1 - p))
    assert abs(z) < critical_z(), (switches, trials * p)


def test_symbols_after_a_switch_are_uniform_for_k_steps():
    S, k = 3, 2
    task = make_task(order=k, vocab_size=S, beta=0.3, p_switch=0.2, seq_len=150)
    tokens = full_tokens(task.sample(100, make_generator(14)))
    _, run = segment_layout(tokens, S)
    run_before = torch.nn.functional.pad(run[:, :-1], (1, 0))  # symbols since the last switch
    restart = (run_before < k) & (tokens != S)
    symbols = tokens[restart]
    assert len(symbols) > 3000, len(symbols)
    counts = torch.bincount(symbols, minlength=S).double()
    z = (counts - len(symbols) / S) / math.sqrt(len(symbols) * (1 / S) * (1 - 1 / S))
    assert z.abs().max() < critical_z(S), z


def test_kernel_rows_have_dirichlet_moments():
    S, beta = 3, 0.5
    task = make_task(vocab_size=S, beta=beta, p_switch=0.3, seq_len=20)
    kernels = task.sample(300, make_generator(15)).latent["kernels"]
    rows = kernels.reshape(-1, S).double()
    assert torch.allclose(rows.sum(-1), torch.ones(len(rows), dtype=torch.float64))
    mean, variance = 1 / S, (1 / S) * (1 - 1 / S) / (S * beta + 1)
    z_mean = (rows[:, 0].mean() - mean) / math.sqrt(variance / len(rows))
    # Rows are i.i.d.; Σ_j (P_j - 1/S)^2 has expectation S · Var(P_j).
    spread = (rows - mean).pow(2).sum(-1)
    z_spread = (spread.mean() - S * variance) / (spread.std() / math.sqrt(len(rows)))
    assert abs(z_mean) < critical_z(2) and abs(z_spread) < critical_z(2), (z_mean, z_spread)


def transition_events(batch, S: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For every target drawn from a kernel (a symbol with k symbols of its segment before it):
    the row of the kernel the latent records for it, and the symbol."""
    _, run = segment_layout(batch.inputs, S)
    drawn = (run >= k) & (batch.targets != S)
    context = context_ids(batch.inputs, k, S).clamp_max(S**k - 1)
    flat = batch.latent["kernels"].double().flatten(1, 2)  # (B, M·S^k, S)
    rows = flat.gather(1, (batch.latent["segment"] * S**k + context).unsqueeze(-1)
                       .expand(-1, -1, S))
    return rows[drawn], batch.targets[drawn]


def log_likelihood_z(rows: torch.Tensor, symbols: torch.Tensor) -> float:
    """z-score of Σ log P[x] against its mean Σ_j P_j log P_j and variance if x ~ P."""
    log_rows = rows.log()
    observed = log_rows.gather(1, symbols.unsqueeze(1)).sum()
    mean = (rows * log_rows).sum(-1)
    variance = (rows * log_rows.pow(2)).sum(-1) - mean.pow(2)
    return float((observed - mean.sum()) / variance.sum().sqrt())


def test_transitions_follow_the_recorded_kernel_of_each_segment():
    S = 3
    task = make_task(order=1, vocab_size=S, beta=1.0, p_switch=0.05, seq_len=100)
    batch = task.sample(200, make_generator(16))
    rows, symbols = transition_events(batch, S, 1)
    assert len(symbols) > 15000
    # Frequencies: Σ (onehot(x) - P) over events, per symbol.
    excess = torch.nn.functional.one_hot(symbols, S).double().sum(0) - rows.sum(0)
    z_freq = excess / (rows * (1 - rows)).sum(0).sqrt()
    assert z_freq.abs().max() < critical_z(S + 1), z_freq
    assert abs(log_likelihood_z(rows, symbols)) < critical_z(S + 1)
    # The likelihood statistic has power: the kernels of other sequences do not fit.
    shuffled = dataclasses.replace(batch, latent={**batch.latent,
                                                  "kernels": batch.latent["kernels"].roll(1, 0)})
    wrong_rows, _ = transition_events(shuffled, S, 1)
    assert log_likelihood_z(wrong_rows, symbols) < -10 * critical_z()


def test_predictions_normalised_and_ordered_as_expected():
    task = make_task()
    batch = task.held_out(300)
    assert task.input_dim == task.output_dim == 3 and batch.inputs.max() <= task.switch_token
    losses = {}
    for name, reference in task.references().items():
        prediction = reference.predict(batch)
        assert prediction.shape == (300, task.seq_len, 3) and prediction.dtype == torch.float64
        torch.testing.assert_close(prediction.logsumexp(-1), torch.zeros(300, task.seq_len,
                                                                         dtype=torch.float64))
        losses[name] = task.position_loss(prediction, batch.targets).mean(1)
    # Paired per-sequence differences: clairvoyant < bayes < no_reset, each far beyond noise.
    for better, worse in (("clairvoyant", "bayes"), ("bayes", "no_reset")):
        diff = losses[worse] - losses[better]
        assert diff.mean() / (diff.std() / math.sqrt(len(diff))) > critical_z(2), (better, worse)


def test_sampling_is_reproducible_and_switch_is_last_token():
    task = make_task(p_switch=0.2, seq_len=50)
    first, second = task.sample(8, make_generator(17)), task.sample(8, make_generator(17))
    assert torch.equal(first.inputs, second.inputs) and torch.equal(first.targets, second.targets)
    assert torch.equal(first.latent["kernels"], second.latent["kernels"])
    segment, _ = segment_layout(first.inputs, task.switch_token)
    assert torch.equal(segment, first.latent["segment"])
    assert first.latent["kernels"].shape[1] == int(segment.max()) + 1
    assert set(full_tokens(first).unique().tolist()) == {0, 1, 2}


def equal_batches(a, b) -> bool:
    return torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets) and all(
        torch.equal(a.latent[key], b.latent[key]) for key in ("kernels", "segment"))


@pytest.mark.parametrize("order,symbols,p,T,n", [
    (1, 2, 0.01, 256, 32), (2, 3, 0.1, 37, 9), (3, 2, 0.3, 40, 7), (1, 2, 0.0, 20, 3),
    (2, 2, 0.9, 30, 5), (1, 4, 0.2, 1, 4), (3, 3, 0.05, 64, 1)])
def test_sampler_is_its_sequential_loop_bit_for_bit(order, symbols, p, T, n):
    """No switch, frequent switches (segments shorter than the order), T = 1, one sequence: on
    the CPU the kernel uniforms drawn up front are the loop's (test_distributions.py)."""
    task = make_task(order=order, vocab_size=symbols, p_switch=p, seq_len=T, beta=0.3)
    assert equal_batches(task.sample(n, make_generator(T, n)),
                         task._sample_sequential(n, make_generator(T, n)))


def test_chunked_batches_are_the_loops(monkeypatch):
    task = make_task(order=2, vocab_size=3, p_switch=0.1, seq_len=40)
    monkeypatch.setattr("tasks.distributions.SCAN_CHUNK_ELEMENTS", 3 * 40 * 9 * 3)
    assert equal_batches(task.sample(16, make_generator(5)),
                         task._sample_sequential(16, make_generator(5)))


def test_config_file_and_registry():
    assert task_families()["switching_markov"] is SwitchingMarkovTask
    lines = CONF.read_text().splitlines()
    assert lines[0].startswith("# ") and lines[1] == "family: switching_markov"
    values = OmegaConf.to_container(OmegaConf.load(CONF))
    assert values.pop("family") == "switching_markov"
    assert values == dataclasses.asdict(SwitchingMarkovConfig())
    with pytest.raises(ValueError):
        SwitchingMarkovConfig(p_switch=1.0)


def constructed_mamba(switch: int):
    """A one-layer Mamba whose decays are known in closed form: token j embeds as e_j, so the
    mixer sees e_j / sqrt(1/4 + eps) (RMSNorm of a one-hot in 4 dimensions); head 0's dt reads
    coordinate `switch` with weight 10 and has bias -5, A = 1; head 1's dt is 0 with bias 0,
    A = 1/2. Then a_t = exp(-softplus(10 s - 5)) ≈ e^-15 = 3.1e-7 on the switch token and
    exp(-softplus(-5)) = 0.99331 elsewhere for head 0, and 2^-1/2 everywhere for head 1."""
    torch.manual_seed(0)
    config = model_families()["mamba"].Config(d_model=4, expand=2, headdim=4, n_layers=1,
                                              d_state=2, d_conv=2)
    model = build_model("mamba", config, IOSpec("tokens", switch + 1, switch + 1, 64))
    mixer = model.core.layers[0].mixer
    assert mixer.nheads == 2
    with torch.no_grad():
        model.encoder.weight.copy_(torch.eye(switch + 1, 4))
        mixer.in_proj.weight[-2:] = 0.0
        mixer.in_proj.weight[-2, switch] = 10.0
        mixer.dt_bias.copy_(torch.tensor([-5.0, 0.0]))
        mixer.A_log.copy_(torch.log(torch.tensor([1.0, 0.5])))
    scale = 1 / math.sqrt(1 / 4 + model.core.layers[0].norm.eps)
    at_switch = [math.exp(-F.softplus(torch.tensor(10 * scale - 5, dtype=torch.float64)).item()),
                 2 ** -0.5]
    elsewhere = [math.exp(-math.log1p(math.exp(-5.0))), 2 ** -0.5]
    return model, at_switch, elsewhere


def test_decay_probe_at_switch_tokens_on_a_constructed_mamba():
    """metrics.probe (bench.training.evaluate.probe_summary → SwitchingMarkovTask.summarize_probes) on a
    Mamba whose a_t is known: mean a_t over switch positions and elsewhere, per head."""
    task = make_task(vocab_size=2, order=1, p_switch=0.05, seq_len=64)
    batch = task.held_out(24)
    model, at_switch, elsewhere = constructed_mamba(task.switch_token)
    summary = probe_summary(task, model, batch, batch_size=5)  # 5 batches, the last partial
    switches = int((batch.inputs == task.switch_token).sum())
    assert switches > 30  # ~0.05 · 24 · 64 = 77 expected
    assert summary["switch_positions"] == switches
    assert summary["other_positions"] == 24 * 64 - switches
    assert summary["decay_at_switch"] == [pytest.approx(at_switch, rel=1e-5)]
    assert summary["decay_elsewhere"] == [pytest.approx(elsewhere, rel=1e-6)]
    assert summary["decay_at_switch_mean"] == pytest.approx(float(torch.tensor(at_switch).mean()),
                                                            rel=1e-5)
    assert at_switch[0] < 4e-7 and elsewhere[0] == pytest.approx(0.993307, abs=1e-6)
    # no probe for a model that has none
    lstm = build_model("lstm", model_families()["lstm"].Config(), IOSpec("tokens", 3, 3, 64))
    assert probe_summary(task, lstm, batch, 8) is None


def test_decay_probe_reaches_the_run_record(tmp_path):
    """A switching_markov run with a Mamba writes metrics.probe (one layer, one head here)."""
    record, _ = run(compose_checked(["task=switching_markov", "task.seq_len=32",
                                     "task.p_switch=0.05", "model=mamba", "trainer.max_steps=2",
                                     "trainer.eval_sequences=16", "trainer.bootstrap=20",
                                     "trainer.progress=false", "trainer.logger=none",
                                     f"out_dir={tmp_path}"]))
    probe = record["metrics"]["probe"]
    assert probe["switch_positions"] + probe["other_positions"] == 16 * 32
    assert probe["switch_positions"] > 0
    assert len(probe["decay_at_switch"]) == 1 and len(probe["decay_at_switch"][0]) == 1
    assert 0 < probe["decay_elsewhere"][0][0] < 1


def test_markov_decay_probe_per_position_on_a_constructed_mamba():
    """MarkovTask.summarize_probes (paper 000 Fig. 4) on the constructed Mamba over a 3-state
    chain: a_t depends only on whether input t is token 2, so the mean per position is the
    mean over sequences of the two known head-averaged values; min, mean, 5th percentile and
    per-head means from their definitions."""
    from tasks.markov import MarkovConfig, MarkovTask
    task = MarkovTask(MarkovConfig(vocab_size=3, seq_len=40))
    batch = task.held_out(12)
    model, at_two, elsewhere = constructed_mamba(switch=2)
    summary = probe_summary(task, model, batch, batch_size=5)
    is_two = (batch.inputs == 2).double()  # (B, T)
    heads = torch.tensor([at_two, elsewhere], dtype=torch.float64)  # [kind][head]
    values = is_two[..., None] * heads[0] + (1 - is_two[..., None]) * heads[1]  # (B, T, heads)
    expected = values.mean((0, 2))
    assert summary["decay_by_position"] == pytest.approx(expected.tolist(), rel=1e-5)
    assert summary["decay_min"] == pytest.approx(float(expected.min()), rel=1e-5)
    assert summary["decay_mean"] == pytest.approx(float(values.mean()), rel=1e-5)
    assert summary["decay_per_head"] == [pytest.approx(values.mean((0, 1)).tolist(), rel=1e-5)]
    ordered = values.flatten().sort().values  # the 5th percentile as the ceil(5%)-th smallest
    assert summary["decay_p05"] == pytest.approx(float(ordered[math.ceil(0.05 * len(ordered)) - 1]),
                                                 rel=1e-5)
    assert 0 < summary["decay_min"] < summary["decay_mean"] < 1

