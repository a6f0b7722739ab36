"""A finite pool of training tasks (`task.num_tasks`, paper 004 §5.1, Fig. 2 left: excess risk
against the number of meta-training tasks) for linreg, lgssm and markov: training sequences take
their latent parameters from N tasks drawn once from the run seed, the held-out set still draws
a fresh task per sequence from the prior. (hmm has the option too: paper 004 B.3 trains on
50,000 HMMs, conf/task/hmm_paper.yaml.)"""
import pytest
import torch

from bench.config import compose
from bench.training.memory import memory_estimate, pool_peak_bytes
from tasks.base import POOL_STREAM, TRAIN_STREAM, make_generator
from tasks.hmm import HMMConfig, HMMTask
from tasks.lgssm import LGSSMConfig, LGSSMTask
from tasks.linreg import LinearRegression
from tasks.markov import MarkovConfig, MarkovTask

CASES = {
    "linreg": lambda **kw: LinearRegression(LinearRegression.Config(seq_len=8, n_features=3, **kw),
                                            batch_size=64, seed=7),
    "lgssm": lambda **kw: LGSSMTask(LGSSMConfig(seq_len=6, **kw), batch_size=64, seed=7),
    "hmm": lambda **kw: HMMTask(HMMConfig(num_states=3, vocab_size=4, seq_len=10, **kw),
                                batch_size=64, seed=7),
    "markov": lambda **kw: MarkovTask(MarkovConfig(order=2, vocab_size=3, seq_len=12, **kw),
                                      batch_size=64, seed=7),
}


def test_every_family_with_a_pool_has_a_case():
    """CASES holds one small config per family whose Config has num_tasks (the registry's)."""
    import dataclasses
    from tasks import task_families
    pooled = {family for family, cls in task_families().items()
              if "num_tasks" in {f.name for f in dataclasses.fields(cls.Config)}}
    assert pooled == set(CASES)


def distinct_tasks(latent: dict[str, torch.Tensor]) -> torch.Tensor:
    """The distinct rows of the latent parameters, all of them flattened side by side."""
    flat = torch.cat([v.double().flatten(1) for _, v in sorted(latent.items())], 1)
    return torch.unique(flat, dim=0)


def training_batch(task, step: int):
    return task.training_batch(step)  # what the Lightning training path samples


@pytest.mark.parametrize("family", sorted(CASES))
def test_training_latents_come_from_a_pool_of_n_tasks(family):
    fresh, pooled = CASES[family](), CASES[family](num_tasks=3)
    seen = [training_batch(pooled, step) for step in range(4)]
    latents = distinct_tasks({k: torch.cat([b.latent[k] for b in seen]) for k in seen[0].latent
                              if k != "states"})
    # 256 draws from 3 tasks miss one with probability 3 (2/3)^256 < 1e-44
    assert len(latents) == 3
    pool = pooled.task_pool("cpu")
    assert torch.equal(distinct_tasks(pool), latents)
    # the pool is draw_latent(3) from (POOL_STREAM, seed) on the training device
    assert all(torch.equal(v, fresh.draw_latent(3, make_generator(POOL_STREAM, 7))[k])
               for k, v in pool.items())
    # sequences of the same task are different sequences (fresh inputs, one latent)
    batch = seen[0]
    key = sorted(k for k in batch.latent if k != "states")[0]  # states: the HMM's hidden path
    same = (batch.latent[key].flatten(1) == batch.latent[key][0].flatten()).all(1)
    assert same.sum() > 1 and len(torch.unique(batch.inputs[same], dim=0)) > 1
    # without a pool every training sequence has its own task
    assert len(distinct_tasks(pooled.draw_latent(64, make_generator(1)))) == 64
    fresh_latent = training_batch(fresh, 0).latent
    assert len(distinct_tasks({k: fresh_latent[k] for k in pool})) == 64
    # the held-out set is the prior's, unaffected by the pool
    a, b = fresh.held_out(50), pooled.held_out(50)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert all(torch.equal(a.latent[k], b.latent[k]) for k in a.latent)
    assert len(distinct_tasks({k: b.latent[k] for k in pool})) == 50


@pytest.mark.parametrize("family", sorted(CASES))
def test_pooled_sequences_follow_their_task_like_fresh_ones(family):
    """sample_given(draw_latent(n)) is sample(n), bit for bit: a pooled sequence is an ordinary sequence of
    its task, so the references (which read the latent) apply unchanged."""
    task = CASES[family]()
    g1, g2 = make_generator(TRAIN_STREAM, 1), make_generator(TRAIN_STREAM, 1)
    direct = task.sample(5, g1)
    split = task.sample_given(task.draw_latent(5, g2), g2)
    assert torch.equal(direct.inputs, split.inputs) and torch.equal(direct.targets, split.targets)
    assert torch.equal(direct.loss_mask, split.loss_mask)


def test_pool_depends_on_the_run_seed_and_is_validated():
    a = CASES["linreg"](num_tasks=4).task_pool("cpu")["weights"]
    b = LinearRegression(LinearRegression.Config(seq_len=8, n_features=3, num_tasks=4),
                         seed=8).task_pool("cpu")["weights"]
    assert a.shape == (4, 1, 3) and not torch.equal(a, b)
    for family in CASES:
        with pytest.raises(ValueError, match="num_tasks >= 0"):
            CASES[family](num_tasks=-1)


def test_a_large_pool_is_drawn_in_chunks_of_distinct_tasks():
    task = CASES["markov"](num_tasks=10)  # 27 floats per kernel
    whole = task._draw_pool(torch.device("cpu"))["kernel"]
    assert torch.equal(whole, task.draw_latent(10, make_generator(POOL_STREAM, 7))["kernel"])
    chunked = task._draw_pool(torch.device("cpu"), chunk_floats=27 * 4)["kernel"]  # 4 + 4 + 2
    assert chunked.shape == (10, 9, 3) and len(torch.unique(chunked.flatten(1), dim=0)) == 10
    again = task._draw_pool(torch.device("cpu"), chunk_floats=27 * 4)["kernel"]
    assert torch.equal(chunked, again) and not torch.equal(chunked, whole)


def test_memory_estimate_counts_the_pool():
    """num_tasks = 10^5 LG-SSMs hold (16 + 8 + 16 + 4) float64 each, 35.2 MB; drawn in chunks
    that are then joined, with a chunk's sampling temporaries: more than twice that for
    training (bench.training.memory.pool_peak_bytes, measured against a draw in tests/test_bad_input.py)."""
    small = compose(["task=lgssm", "model=lstm"])
    large = compose(["task=lgssm", "model=lstm", "task.num_tasks=100000"])
    tasks = [LGSSMTask(c.task, batch_size=c.trainer.batch_size) for c in (small, large)]
    estimates = [memory_estimate(c, t, "cpu") for c, t in zip((small, large), tasks)]
    need = [{phase: e.need("host", phase) for phase in ("training", "evaluation")}
            for e in estimates]
    assert need[1]["training"] - need[0]["training"] == pool_peak_bytes(tasks[1])
    assert pool_peak_bytes(tasks[1]) >= 2 * 100_000 * 44 * 8 == 2 * tasks[1].pool_bytes()
    assert need[1]["evaluation"] == need[0]["evaluation"]
