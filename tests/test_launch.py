"""Suites and sweeps over several processes (bench/cli/launch.py, bench/records/locks.py):
workers that match the sequential run record for record, a worker killed mid-entry, SIGTERM to
the launcher, a launcher and a sequential runner on one out_dir, an interrupted entry resumed
from its checkpoint, and the SLURM path through submitit (a stand-in sbatch, and submitit's local
executor running an array task for real, preempted and requeued)."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from bench.cli.launch import ArrayTask, Plan, take_launcher
from bench.cli.main import main
from bench.config import ConfigError
from bench.records import locks, store
from warm_processes import WarmProcess

REPO = Path(__file__).resolve().parents[1]
TINY = ["task.seq_len=24", "trainer.warmup_steps=2", "trainer.eval_sequences=32",
        "trainer.bootstrap=100", "trainer.progress=false", "trainer.threads=1",
        "trainer.save_weights=false"]


def bench(*args: str, env: dict | None = None) -> WarmProcess:
    """`python -m bench args`, started warm (tests/warm_processes.py: the launcher's own
    imports are not what these tests test; its workers are fresh processes, as always), its
    stderr in its stdout."""
    return WarmProcess(list(args), REPO, {**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                       merge_stderr=True)


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


def test_two_workers_make_the_sequential_runs_records(tmp_path, capsys):
    """The same gaps to the last digit, one ok record per seed. The sequential sweep runs in
    this process while the launcher's workers run (a process costs seconds of imports)."""
    sweep = ["sweep", "seed=0-3", "trainer.max_steps=6", *TINY]
    two = bench(*sweep, f"out_dir={tmp_path / 'two'}", "launcher=local", "workers=2")
    assert main([*sweep, f"out_dir={tmp_path / 'one'}"]) == 0, capsys.readouterr().err[-3000:]
    out_two = two.communicate(timeout=600)[0]
    assert two.returncode == 0, out_two[-3000:]
    assert "4 entries on 2 workers (cores " in out_two
    assert "[4/4 settled: 4 ok or done already, 0 failed" in out_two
    sequential, parallel = gaps(tmp_path / "one"), gaps(tmp_path / "two")
    assert sorted(parallel) == [0, 1, 2, 3] and all(len(v) == 1 for v in parallel.values())
    assert parallel == sequential
    assert {json.loads(p.read_text())["train"]["threads"]  # the record says what ran
            for p in (tmp_path / "two").glob("*.json")} == {1}
    # and how the threads waited: the tests' PASSIVE (tests/conftest.py), which workers keep
    assert [json.loads(p.read_text())["train"]["thread_wait"]
            for p in (tmp_path / "two").glob("*.json")] == [{"OMP_WAIT_POLICY": "PASSIVE"}] * 4
    assert not list((tmp_path / "two" / locks.LOCKS).glob("*.lock"))
    # each settled run says how long it ran: the launcher's estimate scales its family by it
    [folder] = (tmp_path / "two" / ".launch").iterdir()
    settled = [json.loads(line) for path in folder.glob("results-*.jsonl")
               for line in path.read_text().splitlines()]
    assert sorted(e["number"] for e in settled) == [1, 2, 3, 4]
    assert all(e["status"] == "ok" and 0 < e["seconds"] < 600 for e in settled)


# Steps enough that a run is still training when the test has found it started (a poll of
# 0.2 s; 150 steps take 3 s here): the runs interrupted by these tests are of this length.
LONG = "trainer.max_steps=150"


def test_a_worker_killed_mid_entry_is_replaced_and_its_entry_runs_again(tmp_path):
    out = tmp_path / "out"
    parent = bench("sweep", "seed=0-2", LONG, *TINY, f"out_dir={out}",
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


def test_sigterm_to_the_launcher_stops_every_worker_and_a_rerun_completes(tmp_path, capsys):
    """The rerun is the sequential runner, in this process (a launcher and its workers cost
    seconds of imports each; a launcher passing finished entries is the tests above)."""
    out = tmp_path / "out"
    shown = [a for a in TINY if a != "trainer.progress=false"] + ["trainer.progress=true"]
    sweep = ["sweep", "seed=0-1", LONG, *shown, f"out_dir={out}", "launcher=local",
             "workers=2"]
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
    sequential = [a for a in sweep if not a.startswith(("launcher=", "workers="))]
    assert main(sequential) == 0, capsys.readouterr().err[-3000:]
    assert sorted(gaps(out)) == [0, 1]


@pytest.mark.skipif(not clean_checkout(), reason="done runs are skipped only for committed code")
def test_a_launcher_and_a_sequential_runner_on_one_out_dir_run_no_entry_twice(tmp_path, capsys):
    """A launcher's two workers and a sequential runner (this process, started once a worker
    holds an entry) on one out_dir: every entry runs once. The runner passes an entry a worker
    holds and comes back to it when it is free, finding it done."""
    out = tmp_path / "out"
    sweep = ["sweep", "seed=0-3", "trainer.max_steps=100", *TINY, f"out_dir={out}"]
    launcher = bench(*sweep, "launcher=local", "workers=2")
    wait_for_lock(out)
    assert main(sweep) == 0, capsys.readouterr().err[-3000:]
    printed = capsys.readouterr().out
    output = launcher.communicate(timeout=600)[0]
    assert launcher.returncode == 0, output[-3000:]
    found = gaps(out)
    assert sorted(found) == [0, 1, 2, 3] and all(len(v) == 1 for v in found.values()), found
    # the runner met the entry a worker held when it began: running, or done by then
    assert "another process runs it" in printed or "done already" in printed, printed


def test_a_sequential_runner_passes_an_entry_another_process_holds(tmp_path, monkeypatch,
                                                                  capsys):
    """The sequential runner takes each entry's lock: an entry held elsewhere (here by this
    test, which lets go once the runner has found it held) is passed, the next one runs, and
    the runner comes back to it when it is free (and runs it: nobody finished it)."""
    from bench.config import compose
    out = tmp_path / "out"
    args = ["trainer.max_steps=4", *TINY, f"out_dir={out}"]
    key = locks.run_lock_key(compose(["seed=0", *args]))
    held = locks.try_lock(str(out), key)
    assert held is not None
    take = locks.try_lock

    def taking(out_dir, wanted):
        lock = take(out_dir, wanted)
        if lock is None and wanted == key:
            held.release()  # found held: free from now on
        return lock
    monkeypatch.setattr(locks, "try_lock", taking)
    assert main(["sweep", "seed=0,1", *args]) == 0, capsys.readouterr().err[-3000:]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert lines[0].startswith("[1/2] seed=0") and lines[0].endswith(
        ": another process runs it; back to it when it is done"), lines
    assert lines[1].startswith("[2/2] seed=1") and lines[2].startswith("[1/2] seed=0"), lines
    assert sorted(gaps(out)) == [0, 1] and all(len(v) == 1 for v in gaps(out).values())
    assert not list((out / locks.LOCKS).glob("*.lock"))


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


def records(out_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))]


def test_a_killed_runs_entry_goes_on_from_its_newest_checkpoint(tmp_path, capsys):
    """A run killed after its step-10 checkpoint (no record: its ok record never came) is
    resumed by the sweep from that checkpoint, not from step 0; the record it makes is the
    uninterrupted run's. A diverged run's checkpoints are not resumed (it would diverge again),
    nor are any with rerun=true. Both commands run in this process: nothing here is a signal."""
    out = tmp_path / "out"
    config = ["trainer.max_steps=20", "trainer.checkpoint_every=10", *TINY, f"out_dir={out}"]
    assert main(["run", *config]) == 0, capsys.readouterr().err[-3000:]
    (first,) = records(out)
    (out / f"{first['run_id']}.json").unlink()  # as if killed before its record was written
    for path in (out / "checkpoints" / first["run_id"]).glob("*.ckpt"):
        if "step=10" not in path.name:
            path.unlink()
    capsys.readouterr()
    code = main(["sweep", "seed=0,1", *config])  # seed 1: nothing to resume
    output = "".join(capsys.readouterr())
    assert code == 0, output[-3000:]
    assert output.count("resuming the interrupted run from") == 1 and "step=10" in output
    (resumed,) = [r for r in records(out) if r["seed"] == 0]
    assert resumed["resumed_from"].endswith("step=10.ckpt")
    assert resumed["resumed_run_id"] == first["run_id"]
    assert resumed["train"]["steps"] == 20
    assert resumed["metrics"]["bayes_gap"] == first["metrics"]["bayes_gap"]
    assert resumed["train"]["loss_curve"] == first["train"]["loss_curve"]


def test_a_run_that_finished_or_diverged_is_not_resumed(tmp_path):
    from bench.cli.suites import interrupted_checkpoint
    from bench.config import compose
    out = tmp_path / "out"
    config = ["trainer.max_steps=20", "trainer.checkpoint_every=10", *TINY, f"out_dir={out}"]
    assert main(["run", *config]) == 0
    composed = compose(config)
    assert interrupted_checkpoint(composed) == ""  # its ok record: finished
    (path,) = out.glob("*.json")
    record = json.loads(path.read_text())
    path.unlink()
    assert interrupted_checkpoint(composed).endswith(".ckpt")  # killed: no record
    record.update(status="failed", reason="diverged at step 12: loss nan")
    path.write_text(json.dumps(record))
    assert interrupted_checkpoint(composed) == ""
    record.update(reason="interrupted (SIGTERM) at step 12")
    path.write_text(json.dumps(record))
    assert interrupted_checkpoint(composed).endswith(".ckpt")
    assert interrupted_checkpoint(compose([*config, "seed=1"])) == ""  # another seed's
    assert interrupted_checkpoint(compose([*config, "trainer.lr=0.01"])) == ""  # other settings
    unwritten = [a for a in config if not a.startswith("trainer.checkpoint_every")]
    assert interrupted_checkpoint(compose([*unwritten, "trainer.checkpoint_every=0"])) == ""


def test_a_preempted_array_task_is_requeued_and_resumes_from_its_checkpoint(tmp_path):
    """What a SLURM array task runs, in a real subprocess of submitit's local executor: its
    entries, one after another. The preemption signal (SIGUSR2) to the task mid-run stops the
    first entry's run at its next step (a failed record that says so), submitit requeues the
    task, and the requeued task resumes that entry from its newest checkpoint, then runs the
    second; the ok record has the uninterrupted run's numbers."""
    submitit = pytest.importorskip("submitit")
    out, alone = tmp_path / "out", tmp_path / "alone"
    config = ["seed=0", "trainer.max_steps=120", "trainer.checkpoint_every=20", *TINY]
    second = ["seed=1", "trainer.max_steps=4", *TINY]
    plan = Plan("the sweep", 2, [1, 2], [[*config, f"out_dir={out}"], [*second, f"out_dir={out}"]],
                "sweep", False)
    folder = tmp_path / "launch"
    folder.mkdir()
    executor = submitit.LocalExecutor(folder=tmp_path / "submitit")
    executor.update_parameters(timeout_min=20)
    job = executor.submit(ArrayTask(plan, str(folder), 1), 0)
    deadline = time.monotonic() + 300
    while not list(out.glob("checkpoints/*/*step=20*.ckpt")):
        assert time.monotonic() < deadline and not job.done(), job.stderr()
        time.sleep(0.05)
    owner = json.loads(locks.lock_path(str(out), next(iter(
        p.stem for p in (out / locks.LOCKS).glob("*.lock")))).read_text())
    os.kill(owner["pid"], signal.SIGUSR2)
    assert job.result() == 0, job.stderr()
    assert sorted(gaps(out)) == [0, 1]  # both entries ran, each once
    settled = [json.loads(line) for line in (folder / "results-0.jsonl").read_text().splitlines()]
    assert sorted(entry["number"] for entry in settled if entry["status"] == "ok") == [1, 2]
    by_status = {r["status"]: r for r in records(out) if r["seed"] == 0}
    assert sorted(by_status) == ["failed", "ok"], [r["status"] for r in records(out)]
    assert by_status["failed"]["reason"].startswith("interrupted (SIGUSR2) at step ")
    ok = by_status["ok"]
    assert ok["resumed_run_id"] == by_status["failed"]["run_id"]
    assert ok["resumed_from"].endswith(".ckpt") and ok["train"]["steps"] == 120
    assert "Requeued" in job.stderr() or "Requeued" in (job.stdout() or "")
    assert main(["run", *config, f"out_dir={alone}"]) == 0  # here: nothing to interrupt
    (uninterrupted,) = records(alone)
    assert ok["metrics"]["bayes_gap"] == uninterrupted["metrics"]["bayes_gap"]


def test_a_foreign_sys_exit_mid_run_exits_the_process_after_its_failed_record(tmp_path):
    """Another library's signal handler calling sys.exit mid-step (submitit's requeue does): the
    run records itself failed and the exit goes on out of main, instead of being swallowed as
    one run's failure while a suite carries on. The alarm repeats: an exit swallowed would stop
    seed 1 too, 4 s later, with a second record."""
    previous = signal.signal(signal.SIGALRM, lambda *a: sys.exit(7))
    signal.setitimer(signal.ITIMER_REAL, 4.0, 4.0)
    try:
        with pytest.raises(SystemExit) as exited:
            main(["sweep", "seed=0,1", "trainer.max_steps=100000", *TINY, f"out_dir={tmp_path}"])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert exited.value.code == 7
    (record,) = records(tmp_path)  # seed 1 never started
    assert record["status"] == "failed" and record["reason"].startswith("SystemExit: 7")


def test_the_progress_line_estimates_the_time_left():
    from bench.cli.launch import Progress
    plan = Plan("the sweep", 4, [1, 2, 3, 4], [[]] * 4, "sweep", False)
    progress = Progress(plan, terminal=False)
    progress.began -= 120  # two minutes in
    settled = {1: {"status": "done already"}, 2: {"status": "ok"}}
    assert progress.line(settled, 2) == ("[2/4 settled: 2 ok or done already, 0 failed; "
                                         "2 worker(s) running; 2.0 min; about 4.0 min left]")
    assert "left" not in progress.line({1: {"status": "done already"}}, 2)  # nothing ran yet


def test_the_time_left_corrects_each_familys_prices_by_its_runs_here():
    """Entries priced 100 s each, two families: a's run here took a fifth of its price, b's the
    whole of it. The two b runs left are 200 s of run time, 1.7 min on two workers, where one
    ratio for all (120 s for 200 s of price) would say 60 s; never less than the longest run
    left."""
    from bench.cli.launch import Progress
    plan = Plan("the suite", 4, [1, 2, 3, 4], [[]] * 4, "suite", False)
    progress = Progress(plan, terminal=False, prices=[100.0] * 4, families=["a", "b", "b", "b"])
    settled = {1: {"status": "ok", "seconds": 20.0}, 2: {"status": "ok", "seconds": 100.0}}
    assert progress.line(settled, 2).endswith("; about 1.7 min left]")
    # a family none of whose runs settled takes the ratio of all (120 s for 200 s of price)
    progress = Progress(plan, terminal=False, prices=[100.0] * 4, families=["a", "a", "b", "b"])
    assert progress.line(settled, 2).endswith("; about 60 s left]")
    # one run left, priced 600 s, of a family that ran at its price: 10 min, however many
    # workers are running
    progress = Progress(plan, terminal=False, prices=[100.0, 100.0, 100.0, 600.0],
                        families=["a", "b", "a", "b"])
    settled = {1: {"status": "ok", "seconds": 100.0}, 2: {"status": "ok", "seconds": 100.0},
               3: {"status": "ok", "seconds": 100.0}}
    assert progress.line(settled, 2).endswith("; about 10 min left]")
    # a failed run says nothing of what the others take: the ok ones alone set the ratio
    # (b's only other run failed after a second: b takes the ratio of all the ok runs, 1)
    failed = {**settled, 2: {"status": "failed", "seconds": 1.0}}
    assert progress.line(failed, 2).endswith("; about 10 min left]")
    # lines of workers that do not time their runs: the wall time so far, by price, as before
    progress.began -= 60
    untimed = {n: {"status": "ok"} for n in settled}
    assert progress.line(untimed, 1).endswith("; about 2.0 min left]")


def test_the_time_left_weighs_each_entry_by_its_price():
    """Entries priced 60, 60 and 480 s: when the first two took 2 minutes, the third is 8 more
    (a count would say 1); an entry without a price weighs the median price."""
    from bench.cli.launch import Progress
    plan = Plan("the suite", 3, [1, 2, 3], [[]] * 3, "suite", False)
    progress = Progress(plan, terminal=False, prices=[60.0, 60.0, 480.0])
    progress.began -= 120
    settled = {1: {"status": "ok"}, 2: {"status": "ok"}}
    assert progress.line(settled, 1).endswith("; about 8.0 min left]")
    progress = Progress(plan, terminal=False, prices=[60.0, None, 480.0])  # the median: 270
    progress.began -= 120
    # 2 minutes for 60 s of price, 270 + 480 s of price left: 25 minutes
    assert progress.line({1: {"status": "ok"}}, 2).endswith("; about 25 min left]")
