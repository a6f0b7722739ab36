"""trainer.accumulate_grad_batches=k splits each optimizer step's batch (trainer.batch_size, the
global batch) into k micro-batches whose gradients are summed: the same sequences as one batch
(tasks/base.py TrainingBatches), so the run matches the run without accumulation up to float
rounding, with less memory. Its loss curve, log rows, validation and resume count optimizer steps,
never micro-batches."""
import csv
import json

import pytest
import torch

from bench.cli.main import main
from bench.training.checks import compose_checked
from bench.training.train import build
from tasks.base import TrainingBatches

TINY = ["task=markov", "task.seq_len=24", "model=mamba", "trainer.batch_size=8",
        "trainer.max_steps=6", "trainer.warmup_steps=2", "trainer.log_every=1",
        "trainer.eval_sequences=32", "trainer.bootstrap=100", "trainer.progress=false",
        "trainer.threads=1", "trainer.save_weights=false", "trainer.reference_cache=false"]


def run(out, *overrides: str) -> dict:
    assert main(["run", f"out_dir={out}", *TINY, *overrides]) == 0
    (path,) = out.glob("*.json")
    return json.loads(path.read_text())


def test_micro_batches_are_the_parts_of_the_steps_batch():
    config = compose_checked([*TINY, "trainer.accumulate_grad_batches=4"])
    task, _ = build(config)
    whole = task.training_batch(3, 0)
    parts = [TrainingBatches(task, 0)[3 * 4 + j] for j in range(4)]
    assert all(p.inputs.shape[0] == 2 and p.inputs.untyped_storage().nbytes()
               == p.inputs.nbytes for p in parts)  # copies, not views of the whole batch
    for name in ("inputs", "targets", "loss_mask"):
        assert torch.equal(torch.cat([getattr(p, name) for p in parts]), getattr(whole, name))


def test_accumulating_trains_the_run_without_it(tmp_path):
    plain = run(tmp_path / "plain")
    split = run(tmp_path / "split", "trainer.accumulate_grad_batches=2")
    assert split["trainer"]["config"]["accumulate_grad_batches"] == 2
    curve, reference = split["train"]["loss_curve"], plain["train"]["loss_curve"]
    assert [s for s, _ in curve] == [s for s, _ in reference] == list(range(6))
    assert [v for _, v in curve] == pytest.approx([v for _, v in reference], rel=1e-4)
    assert split["train"]["steps"] == 6
    assert split["metrics"]["bayes_gap"] == pytest.approx(plain["metrics"]["bayes_gap"], rel=1e-3)
    rows = list(csv.DictReader(open(next((tmp_path / "split").rglob("metrics.csv")))))
    steps = [int(r["step"]) for r in rows if r.get("loss")]
    assert steps == list(range(6))  # one row per optimizer step, not per micro-batch


def test_a_batch_that_does_not_split_is_one_line(capsys):
    assert main(["run", *TINY, "trainer.accumulate_grad_batches=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "accumulate_grad_batches=3" in err, err


def test_a_resumed_accumulating_run_continues_the_same_micro_batches(tmp_path):
    first = run(tmp_path / "first", "trainer.accumulate_grad_batches=2",
                "trainer.checkpoint_every=3", "trainer.val_every=2", "trainer.val_sequences=8")
    assert [s for s, _ in first["train"]["val_curve"]] == [2, 4, 6]  # once a step, not a part
    checkpoint = next((tmp_path / "first").glob("checkpoints/*/*step=3.ckpt"))
    resumed = run(tmp_path / "resumed", "trainer.accumulate_grad_batches=2",
                  f"resume={checkpoint}", "trainer.val_every=2", "trainer.val_sequences=8")
    curve, reference = resumed["train"]["loss_curve"], first["train"]["loss_curve"]
    assert [s for s, _ in curve] == list(range(6))
    assert [v for _, v in curve] == pytest.approx([v for _, v in reference], rel=1e-5)
