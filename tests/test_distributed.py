"""Data-parallel semantics on two CPU (gloo) processes: the held-out set is sharded over the
ranks and gathered back exactly, the batch size is global, and a failed run writes one record."""
import json
import os
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bench.cli.main import main
from bench.training.checks import compose_checked
from bench.config import compose
from bench.training.evaluate import masked_loss
from bench.training.train import build
from tasks.base import TRAIN_STREAM, make_generator
from warm_processes import WarmProcess

REPO = Path(__file__).resolve().parents[1]
TINY = ["task.seq_len=24", "trainer.warmup_steps=2", "trainer.eval_sequences=37",
        "trainer.bootstrap=200", "trainer.progress=false"]

# A DDP run that trains until it is stopped, logging every 5 steps.
LONG = ["trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp",
        "trainer.max_steps=100000", "trainer.log_every=5", "trainer.logger=csv", *TINY]


# Two CPU ranks, launched as torchrun would: each process is told its rank, so a test sees every
# rank's exit status.
def launch_ranks(args: list[str], out: Path, script: Path | None = None) -> list[WarmProcess]:
    """Both ranks of a 2-process job, started the way torchrun or SLURM start them (Lightning
    then launches nothing itself), running `python -m bench <args> out_dir=<out>` (or
    `script <args>`), in out's parent. Both start at once (Lightning's own launcher starts rank 1
    only once rank 0 has imported everything) and warm: forked with the bench imported
    (tests/warm_processes.py; a fresh `python -m bench` is
    test_sigterm_to_a_run_that_lightning_launched's)."""
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = list(args) if script else [*args, f"out_dir={out}"]
    return [WarmProcess(args, out.parent, {**os.environ, "PYTHONPATH": str(REPO),
                                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                           "WORLD_SIZE": "2", "NODE_RANK": "0",
                                           "LOCAL_RANK": str(rank)}, script)
            for rank in (0, 1)]


def wait_for_training(out: Path, ranks: list[WarmProcess | subprocess.Popen],
                      timeout: float = 120) -> None:
    """Until rank 0's training log has rows after step 0 (both ranks are in the training loop)."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = list(out.glob("logs/*/metrics.csv"))
        if logs and len(logs[0].read_text().splitlines()) >= 3:
            return
        assert all(rank.poll() is None for rank in ranks), [r.communicate() for r in ranks]
        time.sleep(0.2)
    raise AssertionError("training did not start")


def finish(ranks: list[WarmProcess | subprocess.Popen], timeout: float = 60
           ) -> list[tuple[int, str]]:
    """Every rank's exit status and stderr; a rank still running after `timeout` seconds fails
    the test (a hang)."""
    results = []
    for rank in ranks:
        try:
            _, err = rank.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in ranks:
                other.kill()
            raise AssertionError(f"a rank did not exit within {timeout} s")
        results.append((rank.returncode, err))
    return results


# Evaluates a freshly initialised model (no training, so both runs hold the same weights) with
# Trainer.test on `devices` CPU processes; rank 0 saves the gathered predictions. On two, the
# test starts both ranks (launch_ranks).
EVAL_SCRIPT = textwrap.dedent("""
    import sys, torch, lightning as L
    from bench.config import compose
    from bench.training.datamodule import TaskData
    from bench.training.module import ICLModule
    from bench.training.train import build, quiet_lightning
    devices, out = int(sys.argv[1]), sys.argv[2]
    quiet_lightning()
    config = compose(["trainer.accelerator=cpu", f"trainer.devices={devices}",
                      "trainer.strategy=ddp" if devices > 1 else "trainer.strategy=auto",
                      "task.seq_len=24", "trainer.batch_size=4", "trainer.eval_batch_size=5"])
    task, model = build(config)
    module = ICLModule(model, task, config.trainer)
    task.set_held_out(37, 5)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=config.trainer.strategy,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=False)
    trainer.test(module, datamodule=TaskData(task), verbose=False)
    if trainer.is_global_zero:
        torch.save({"predictions": module.test_predictions, "world": trainer.world_size}, out)
""")


def test_sharded_evaluation_gathers_exactly_the_single_process_predictions(tmp_path,
                                                                          monkeypatch):
    """37 held-out sequences over 2 ranks (19 + 18, batches of 5): every sequence comes back
    once, in order, with the predictions one process makes (to float32 rounding). The one
    process is this one (a process costs seconds of imports)."""
    script = tmp_path / "evaluate.py"
    script.write_text(EVAL_SCRIPT)
    monkeypatch.setattr(sys, "argv", [str(script), "1", str(tmp_path / "1.pt")])
    runpy.run_path(str(script), run_name="__main__")
    results = finish(launch_ranks(["2", str(tmp_path / "2.pt")], tmp_path / "ranks", script),
                     timeout=240)
    assert [code for code, _ in results] == [0, 0], [err[-2000:] for _, err in results]
    one, two = (torch.load(tmp_path / f"{d}.pt") for d in (1, 2))
    assert one["world"] == 1 and two["world"] == 2
    assert one["predictions"].shape == (37, 24, 2)
    torch.testing.assert_close(two["predictions"], one["predictions"], rtol=0, atol=1e-6)

    # ... and they are the model's own predictions on the held-out set, made without Lightning
    config = compose(["task.seq_len=24", "trainer.batch_size=4"])
    task, model = build(config)
    direct = model.predict(task.held_out(37).inputs).double()
    torch.testing.assert_close(one["predictions"], direct, rtol=0, atol=1e-6)


def test_batch_size_is_the_global_batch():
    config = compose_checked(["trainer.accelerator=cpu", "trainer.devices=2",
                              "trainer.strategy=ddp", "trainer.batch_size=32"])
    task, _ = build(config)
    assert task.batch_size == 16
    single, _ = build(compose_checked(["trainer.batch_size=32"]))
    assert single.batch_size == 32


def test_a_batch_that_does_not_split_over_the_ranks_is_refused(capsys):
    assert main(["run", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp",
                 "trainer.batch_size=33"]) == 2
    assert "must split evenly over the 2 training processes" in capsys.readouterr().err


def test_a_failed_ddp_run_writes_one_failed_record(tmp_path):
    """Both ranks diverge at once (lr 1e30); rank 0 alone writes the record, and both exit 1.
    The ranks start together, as torchrun starts them (Lightning starting rank 1 once rank 0
    has imported everything is test_sigterm_to_a_run_that_lightning_launched's)."""
    out = tmp_path / "runs"
    ranks = launch_ranks(["run", "trainer.accelerator=cpu", "trainer.devices=2",
                          "trainer.strategy=ddp", "trainer.lr=1e30", "trainer.max_steps=50",
                          *TINY], out)
    results = finish(ranks, timeout=240)
    assert [code for code, _ in results] == [1, 1], [err[-2000:] for _, err in results]
    records = list(out.glob("*.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert record["status"] == "failed" and record["reason"].startswith("diverged at step")


def test_sharded_text_evaluation_equals_one_process(tmp_path, capsys):
    """A text task gathers per-token losses, not predictions: two gloo ranks score the whole
    split once and report what one process reports (lr 1e-12: the weights stay as initialised;
    the one process is this one)."""
    pytest.importorskip("datasets")
    common = ["task=pydoc", "task.seq_len=32", "model.d_model=16",
              "trainer.max_steps=1", "trainer.lr=1e-12", "trainer.warmup_steps=0",
              "trainer.batch_size=4", "trainer.bootstrap=100", "trainer.progress=false",
              "trainer.logger=none", "trainer.accelerator=cpu"]
    metrics = {}
    for devices in (1, 2):
        out = tmp_path / str(devices)
        if devices == 1:
            assert main(["run", *common, f"out_dir={out}"]) == 0, capsys.readouterr().err
        else:
            results = finish(launch_ranks(["run", *common, "trainer.devices=2",
                                           "trainer.strategy=ddp"], out), timeout=240)
            assert [code for code, _ in results] == [0, 0], [err[-2000:] for _, err in results]
        record = json.loads(next(out.glob("*.json")).read_text())
        assert record["eval"]["world_size"] == devices
        metrics[devices] = record["metrics"]
    one, two = metrics[1], metrics[2]
    assert one["sequences"] == two["sequences"] and one["scored_positions"] == two["scored_positions"]
    assert two["loss"]["model"] == pytest.approx(one["loss"]["model"], abs=1e-6)
    assert two["accuracy"]["model"] == pytest.approx(one["accuracy"]["model"], abs=1e-9)
    assert two["loss"]["bigram"] == one["loss"]["bigram"]


# --- leaving a run together: signals, failures, suites ---------------------------------------


@pytest.mark.parametrize("signalled", [(1,), (0,), (0, 1)], ids=["rank1", "rank0", "both"])
def test_sigterm_stops_every_rank_at_one_step_with_one_failed_record(tmp_path, signalled):
    import signal
    import time
    out = tmp_path / "runs"
    ranks = launch_ranks(["run", *LONG], out)
    wait_for_training(out, ranks)
    for rank in signalled:
        ranks[rank].send_signal(signal.SIGTERM)
    sent = time.monotonic()
    results = finish(ranks, timeout=60)
    assert time.monotonic() - sent < 60
    assert [code for code, _ in results] == [143, 143], [err[-2000:] for _, err in results]
    records = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert len(records) == 1 and records[0]["status"] == "failed"
    step = records[0]["train"]["steps"]
    assert records[0]["reason"] == f"interrupted (SIGTERM) at step {step}"
    assert step % 5 == 0  # the ranks agree at a logging step
    # each rank reports its own stop step: the same
    assert f"error: run failed: interrupted (SIGTERM) at step {step} (record: " in results[0][1]
    assert f"error: run failed: interrupted (SIGTERM) at step {step} (rank 1)" in results[1][1]


def test_a_ddp_suite_whose_first_entry_diverges_writes_both_records(tmp_path):
    """Two ranks launched as torchrun launches them: the first entry diverges on both, the
    second trains on both and evaluates on both (its record's loss curve the mean over ranks)."""
    suite = tmp_path / "two.yaml"  # entry 1 diverges (lr 1e30), entry 2 trains
    suite.write_text("runs:\n  - [trainer.lr=1e30, seed=1]\n  - [seed=2]\n")
    out = tmp_path / "runs"
    ranks = launch_ranks(["suite", f"name={suite}", "trainer.accelerator=cpu",
                          "trainer.devices=2", "trainer.strategy=ddp", "trainer.max_steps=12",
                          *TINY], out)
    results = finish(ranks, timeout=240)
    assert [code for code, _ in results] == [1, 1], [err[-2000:] for _, err in results]
    records = sorted((json.loads(p.read_text()) for p in out.glob("*.json")),
                     key=lambda r: r["seed"])
    assert [(r["seed"], r["status"]) for r in records] == [(1, "failed"), (2, "ok")]
    assert records[0]["reason"].startswith("diverged at step")
    assert f"1 of 2 runs of suite {suite} failed (entries 1)" in results[0][1]
    # the run after it trained and evaluated on both ranks
    trained = records[1]
    assert trained["metrics"]["sequences"] == 37
    assert trained["train"]["world_size"] == 2 and trained["eval"]["world_size"] == 2
    assert trained["eval"]["device"] == "cpu"
    # the loss curve is the mean over ranks: at step 0 (weights as initialised) the mean of the
    # losses of rank 0's and rank 1's batches
    config = compose_checked(["trainer.accelerator=cpu", "trainer.devices=2",
                              "trainer.strategy=ddp", "seed=2", *TINY])
    task, model = build(config)
    with torch.no_grad():
        losses = [float(masked_loss(task, model(batch.inputs), batch)) for batch in (
            task.sample(task.batch_size, make_generator(TRAIN_STREAM, 2, rank, 0))
            for rank in (0, 1))]
    assert trained["train"]["loss_curve"][0][0] == 0
    assert losses[0] != pytest.approx(losses[1], abs=1e-4)  # the ranks' batches differ
    assert trained["train"]["loss_curve"][0][1] == pytest.approx(sum(losses) / 2, abs=1e-5)
    assert pytest.approx(trained["metrics"]["bayes_gap"], abs=1e-12) == (
        trained["metrics"]["loss"]["model"] - trained["metrics"]["loss"]["bayes"])


def test_sigterm_to_a_run_that_lightning_launched(tmp_path):
    """The usual way (trainer=ddp: Lightning starts rank 1 itself): SIGTERM to rank 0 alone,
    the process the user started, stops both ranks; rank 0 exits 143 with one failed record,
    and rank 1 is gone too."""
    import signal
    import time
    out = tmp_path / "runs"
    rank0 = subprocess.Popen([sys.executable, "-m", "bench", "run", *LONG, f"out_dir={out}"],
                             cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    wait_for_training(out, [rank0])
    children = [int(p) for p in Path(f"/proc/{rank0.pid}/task/{rank0.pid}/children")
                .read_text().split()]
    assert len(children) == 1  # rank 1
    rank0.send_signal(signal.SIGTERM)
    [(code, err)] = finish([rank0], timeout=60)
    assert code == 143, err[-2000:]
    deadline = time.monotonic() + 30
    while Path(f"/proc/{children[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    stat = Path(f"/proc/{children[0]}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"  # exited (or a zombie)
    records = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert len(records) == 1 and records[0]["reason"].startswith("interrupted (SIGTERM) at step")


def test_ddp_spawn_is_refused_with_one_line(capsys):
    assert main(["run", "trainer.accelerator=cpu", "trainer.devices=2",
                 "trainer.strategy=ddp_spawn"]) == 2
    err = capsys.readouterr().err
    assert "ddp_spawn is not supported" in err and err.count("\n") == 1
