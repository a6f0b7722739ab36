"""Data-parallel semantics on two CPU (gloo) processes: the held-out set is sharded over the
ranks and gathered back exactly, the batch size is global, and a failed run writes one record."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bench.__main__ import main
from bench.config import compose
from bench.train import build, masked_loss
from tasks.base import TRAIN_STREAM, make_generator

REPO = Path(__file__).resolve().parents[1]
TINY = ["task.seq_len=24", "trainer.warmup_steps=2", "trainer.eval_sequences=37",
        "trainer.bootstrap=200", "trainer.progress=false"]

# Evaluates a freshly initialised model (no training, so both runs hold the same weights) with
# Trainer.test on `devices` CPU processes; rank 0 saves the gathered predictions. Lightning's
# DDP launcher starts the other rank by running this file again.
EVAL_SCRIPT = textwrap.dedent("""
    import sys, torch, lightning as L
    from bench.config import compose
    from bench.train import ICLModule, build, quiet_lightning
    devices, out = int(sys.argv[1]), sys.argv[2]
    quiet_lightning()
    config = compose(["trainer.accelerator=cpu", f"trainer.devices={devices}",
                      "trainer.strategy=ddp" if devices > 1 else "trainer.strategy=auto",
                      "task.seq_len=24", "trainer.batch_size=4", "trainer.eval_batch_size=5"],
                     check=False)
    task, model = build(config)
    module = ICLModule(model, task, config.trainer)
    task.set_held_out(37, 5)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=config.trainer.strategy,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=False)
    trainer.test(module, datamodule=task, verbose=False)
    if trainer.is_global_zero:
        torch.save({"predictions": module.test_predictions, "world": trainer.world_size}, out)
""")


def test_sharded_evaluation_gathers_exactly_the_single_process_predictions(tmp_path):
    """37 held-out sequences over 2 ranks (19 + 18, batches of 5): every sequence comes back
    once, in order, with the predictions one process makes (to float32 rounding)."""
    script = tmp_path / "evaluate.py"
    script.write_text(EVAL_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for devices in (1, 2):
        done = subprocess.run([sys.executable, str(script), str(devices),
                               str(tmp_path / f"{devices}.pt")], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    one, two = (torch.load(tmp_path / f"{d}.pt") for d in (1, 2))
    assert one["world"] == 1 and two["world"] == 2
    assert one["predictions"].shape == (37, 24, 2)
    torch.testing.assert_close(two["predictions"], one["predictions"], rtol=0, atol=1e-6)

    # ... and they are the model's own predictions on the held-out set, made without Lightning
    config = compose(["task.seq_len=24", "trainer.batch_size=4"], check=False)
    task, model = build(config)
    direct = model.predict(task.held_out(37).inputs).double()
    torch.testing.assert_close(one["predictions"], direct, rtol=0, atol=1e-6)


def test_batch_size_is_the_global_batch():
    config = compose(["trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp",
                      "trainer.batch_size=32"])
    task, _ = build(config)
    assert task.batch_size == 16
    single, _ = build(compose(["trainer.batch_size=32"]))
    assert single.batch_size == 32


def test_a_batch_that_does_not_split_over_the_ranks_is_refused(capsys):
    assert main(["run", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp",
                 "trainer.batch_size=33"]) == 2
    assert "must split evenly over the 2 training processes" in capsys.readouterr().err


def test_a_failed_ddp_run_writes_one_failed_record(tmp_path):
    """Both ranks diverge at once (lr 1e30); rank 0 alone writes the record."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "bench", "run", "trainer.accelerator=cpu",
                           "trainer.devices=2", "trainer.strategy=ddp", "trainer.lr=1e30",
                           "trainer.max_steps=50", f"out_dir={tmp_path}", *TINY],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    records = list(tmp_path.glob("*.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert record["status"] == "failed" and record["reason"].startswith("diverged at step")


def test_a_ddp_run_evaluates_on_both_ranks(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "bench", "run", "trainer.accelerator=cpu",
                           "trainer.devices=2", "trainer.strategy=ddp", "trainer.max_steps=4",
                           f"out_dir={tmp_path}", *TINY],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = list(tmp_path.glob("*.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert record["status"] == "ok" and record["metrics"]["sequences"] == 37
    assert record["train"]["world_size"] == 2 and record["eval"]["world_size"] == 2
    assert record["eval"]["device"] == "cpu"
    # the loss curve is the mean over ranks: at step 0 (weights as initialised) the mean of the
    # losses of rank 0's and rank 1's batches
    config = compose(["trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp",
                      *TINY])
    task, model = build(config)
    with torch.no_grad():
        losses = [float(masked_loss(task, model(batch.inputs), batch)) for batch in (
            task.sample(task.batch_size, make_generator(TRAIN_STREAM, 0, rank, 0))
            for rank in (0, 1))]
    assert record["train"]["loss_curve"][0][0] == 0
    assert losses[0] != pytest.approx(losses[1], abs=1e-4)  # the ranks' batches differ
    assert record["train"]["loss_curve"][0][1] == pytest.approx(sum(losses) / 2, abs=1e-5)
    assert pytest.approx(record["metrics"]["bayes_gap"], abs=1e-12) == (
        record["metrics"]["loss"]["model"] - record["metrics"]["loss"]["bayes"])


def test_sharded_text_evaluation_equals_one_process(tmp_path):
    """A text task gathers per-token losses, not predictions: two gloo ranks score the whole
    split once and report what one process reports (lr 1e-12: the weights stay as initialised)."""
    pytest.importorskip("datasets")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    common = ["task=pydoc", "task.seq_len=32", "model.d_model=16",
              "trainer.max_steps=1", "trainer.lr=1e-12", "trainer.warmup_steps=0",
              "trainer.batch_size=4", "trainer.bootstrap=100", "trainer.progress=false",
              "trainer.logger=none", "trainer.accelerator=cpu"]
    metrics = {}
    for devices in (1, 2):
        out = tmp_path / str(devices)
        ranks = ["trainer.devices=2", "trainer.strategy=ddp"] if devices == 2 else []
        done = subprocess.run([sys.executable, "-m", "bench", "run", *common, *ranks,
                               f"out_dir={out}"], capture_output=True, text=True, cwd=tmp_path,
                              env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        record = json.loads(next(out.glob("*.json")).read_text())
        assert record["eval"]["world_size"] == devices
        metrics[devices] = record["metrics"]
    one, two = metrics[1], metrics[2]
    assert one["sequences"] == two["sequences"] and one["scored_positions"] == two["scored_positions"]
    assert two["loss"]["model"] == pytest.approx(one["loss"]["model"], abs=1e-6)
    assert two["accuracy"]["model"] == pytest.approx(one["accuracy"]["model"], abs=1e-9)
    assert two["loss"]["bigram"] == one["loss"]["bigram"]
