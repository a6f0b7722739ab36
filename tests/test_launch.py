"""Suites and sweeps over several processes (bench/cli/launch.py, bench/records/locks.py):
workers that match the sequential run record for record, a worker killed mid-entry, SIGTERM to
the launcher, two launchers on one out_dir, and the SLURM path through submitit (a stand-in
sbatch, and submitit's local executor running an array task for real)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.cli.launch import ArrayTask, Plan, take_launcher
from bench.config import ConfigError
from bench.records import locks, store

REPO = Path(__file__).resolve().parents[1]
TINY = ["task.seq_len=24", "trainer.warmup_steps=2", "trainer.eval_sequences=32",
        "trainer.bootstrap=100", "trainer.progress=false", "trainer.threads=1",
        "trainer.save_weights=false"]


def bench(*args: str, env: dict | None = None, **popen) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=REPO, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


def gaps(out_dir: Path) -> dict[int, list[float]]:
    found: dict[int, list[float]] = {}
    for path in out_dir.glob("*.json"):
        record = json.loads(path.read_text())
        if record["status"] == "ok":
            found.setdefault(record["seed"], []).append(record["metrics"]["bayes_gap"])
    return found


def wait_for_lock(out_dir: Path, timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = list((out_dir / locks.LOCKS).glob("*.lock"))
        if held:
            return held[0]
        time.sleep(0.2)
    raise AssertionError("no worker took an entry")


def wait_for_training(out_dir: Path, timeout: float = 120) -> None:
    """Until a worker's run has started training (its signal handling in place)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any("training started" in log.read_text()
               for log in out_dir.glob(".launch/*/worker-*.log")):
            return
        time.sleep(0.2)
    raise AssertionError("no run started training")


def clean_checkout() -> bool:
    return store.provenance()["dirty"] is False


def test_two_workers_make_the_sequential_runs_records(tmp_path):
    """The same gaps to the last digit, one ok record per seed."""
    sweep = ["sweep", "seed=0-3", "trainer.max_steps=6", *TINY]
    alone = bench(*sweep, f"out_dir={tmp_path / 'one'}")
    two = bench(*sweep, f"out_dir={tmp_path / 'two'}", "launcher=local", "workers=2")
    out_alone, out_two = alone.communicate(timeout=600)[0], two.communicate(timeout=600)[0]
    assert alone.returncode == 0, out_alone[-3000:]
    assert two.returncode == 0, out_two[-3000:]
    assert "4 entries on 2 workers (cores " in out_two
    assert "[4/4 settled: 4 ok or done already, 0 failed" in out_two
    sequential, parallel = gaps(tmp_path / "one"), gaps(tmp_path / "two")
    assert sorted(parallel) == [0, 1, 2, 3] and all(len(v) == 1 for v in parallel.values())
    assert parallel == sequential
    assert {json.loads(p.read_text())["train"]["threads"]  # the record says what ran
            for p in (tmp_path / "two").glob("*.json")} == {1}
    assert not list((tmp_path / "two" / locks.LOCKS).glob("*.lock"))


def test_a_worker_killed_mid_entry_is_replaced_and_its_entry_runs_again(tmp_path):
    out = tmp_path / "out"
    parent = bench("sweep", "seed=0-2", "trainer.max_steps=400", *TINY, f"out_dir={out}",
                   "launcher=local", "workers=2")
    owner = json.loads(wait_for_lock(out).read_text())
    time.sleep(1.0)
    os.kill(owner["pid"], signal.SIGKILL)  # no record, no clean-up: as the OOM killer does
    output = parent.communicate(timeout=600)[0]
    assert parent.returncode == 0, output[-3000:]
    assert f"(pid {owner['pid']}) ended with status -9; replaced" in output
    found = gaps(out)
    assert sorted(found) == [0, 1, 2] and all(len(v) == 1 for v in found.values())
    assert not list((out / locks.LOCKS).glob("*.lock"))


def test_sigterm_to_the_launcher_stops_every_worker_and_a_rerun_completes(tmp_path):
    out = tmp_path / "out"
    shown = [a for a in TINY if a != "trainer.progress=false"] + ["trainer.progress=true"]
    sweep = ["sweep", "seed=0-2", "trainer.max_steps=400", *shown, f"out_dir={out}",
             "launcher=local", "workers=2"]
    parent = bench(*sweep)
    wait_for_training(out)
    parent.send_signal(signal.SIGTERM)
    output = parent.communicate(timeout=120)[0]
    assert parent.returncode == 143, output[-3000:]
    assert "stopping: SIGTERM" in output and "the same command goes on from there" in output
    assert not list((out / locks.LOCKS).glob("*.lock"))
    interrupted = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert all(r["status"] in ("ok", "failed") for r in interrupted)
    assert any(r["status"] == "failed" and r["reason"].startswith("interrupted (SIGTERM)")
               for r in interrupted)
    rerun = bench(*sweep)
    output = rerun.communicate(timeout=600)[0]
    assert rerun.returncode == 0, output[-3000:]
    assert sorted(gaps(out)) == [0, 1, 2]


@pytest.mark.skipif(not clean_checkout(), reason="done runs are skipped only for committed code")
def test_two_launchers_on_one_out_dir_run_no_entry_twice(tmp_path):
    out = tmp_path / "out"
    sweep = ["sweep", "seed=0-3", "trainer.max_steps=100", *TINY, f"out_dir={out}",
             "launcher=local", "workers=2"]
    first, second = bench(*sweep), bench(*sweep)
    for launcher in (first, second):
        output = launcher.communicate(timeout=600)[0]
        assert launcher.returncode == 0, output[-3000:]
    found = gaps(out)
    assert sorted(found) == [0, 1, 2, 3] and all(len(v) == 1 for v in found.values()), found


def test_a_stale_lock_is_taken_over_and_a_living_one_is_not(tmp_path):
    key = "k"
    held = locks.try_lock(str(tmp_path), key)
    assert held is not None and locks.try_lock(str(tmp_path), key) is None
    held._stop.set()  # its owner is gone: its pid is this (living) process, so age it instead
    old = time.time() - locks.STALE_S - 1
    os.utime(held.path, (old, old))
    taken = locks.try_lock(str(tmp_path), key)
    assert taken is not None
    taken.release()
    path = locks.lock_path(str(tmp_path), key)
    path.write_text(json.dumps({"host": os.uname().nodename, "pid": 2**22 + 12345}))  # no such pid
    assert locks.stale(path)
    assert locks.try_lock(str(tmp_path), key) is not None


@pytest.mark.parametrize("args,message", [
    (["launcher=cloud"], "launcher must be local or slurm, got 'cloud'"),
    (["workers=0"], "workers: invalid value '0'; expected an integer >= 1"),
    (["launcher=slurm", "workers=2"], "workers= is for launcher=local"),
    (["slurm.partition=gpu"], "slurm.partition is an option of launcher=slurm"),
    (["launcher=slurm", "slurm.queue=a"], "unknown key 'slurm.queue'"),
    (["launcher=slurm", "slurm.time_min=x"], "slurm.time_min: invalid value 'x'"),
])
def test_launcher_options_are_checked(args, message):
    with pytest.raises(ConfigError, match=message):
        take_launcher(args)


def fake_slurm(folder: Path) -> dict:
    """sbatch and srun stand-ins on PATH: sbatch keeps the script it was given."""
    folder.mkdir()
    (folder / "sbatch").write_text('#!/bin/sh\ncp "$1" "$(dirname "$0")/submitted.sh"\n'
                                   'echo "Submitted batch job 4242"\n')
    (folder / "srun").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("sbatch", "srun"):
        (folder / tool).chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def test_launcher_slurm_submits_one_job_array(tmp_path):
    pytest.importorskip("submitit")
    env = fake_slurm(tmp_path / "bin")
    done = bench("sweep", "seed=0-3", *TINY, f"out_dir={tmp_path / 'out'}", "launcher=slurm",
                 "slurm.partition=gpu", "slurm.time_min=30", "slurm.array_parallelism=2",
                 "slurm.gpus_per_task=1", "slurm.sbatch=account=icl;qos=high", env=env)
    output = done.communicate(timeout=300)[0]
    assert done.returncode == 0, output[-3000:]
    assert "4 entries submitted as SLURM job array 4242 (4 tasks)" in output
    script = (tmp_path / "bin" / "submitted.sh").read_text()
    for line in ("#SBATCH --array=0-3%2", "#SBATCH --partition=gpu", "#SBATCH --time=30",
                 "#SBATCH --gpus-per-node=1", "#SBATCH --account=icl", "#SBATCH --qos=high",
                 "#SBATCH --signal=USR2@90"):
        assert line in script, script


def test_launcher_slurm_without_slurm_is_one_line(tmp_path):
    pytest.importorskip("submitit")
    done = bench("sweep", "seed=0-1", *TINY, f"out_dir={tmp_path}", "launcher=slurm",
                 env={"PATH": "/usr/bin:/bin"})
    output = done.communicate(timeout=300)[0]
    assert done.returncode == 2 and output.strip().splitlines()[-1] == (
        "error: launcher=slurm needs SLURM's sbatch and srun on PATH: run it on a login node "
        "of the cluster")


def test_an_array_task_runs_its_entries_under_submitits_local_executor(tmp_path):
    """What a SLURM array task runs, in a real subprocess of submitit's local executor."""
    submitit = pytest.importorskip("submitit")
    out = tmp_path / "out"
    overrides = [[f"seed={s}", "trainer.max_steps=4", *TINY, f"out_dir={out}"] for s in (0, 1)]
    plan = Plan("the sweep", 2, [1, 2], overrides, "sweep", False)
    folder = tmp_path / "launch"
    folder.mkdir()
    executor = submitit.LocalExecutor(folder=tmp_path / "submitit")
    executor.update_parameters(timeout_min=10)
    job = executor.submit(ArrayTask(plan, str(folder), 1), 0)
    assert job.result() == 0
    assert sorted(gaps(out)) == [0, 1]
    settled = [json.loads(line) for line in (folder / "results-0.jsonl").read_text().splitlines()]
    assert sorted(entry["number"] for entry in settled) == [1, 2]
