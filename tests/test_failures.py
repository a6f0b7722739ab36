"""Nothing lost, nothing half-written: a run that started and failed (a diverged loss, a signal,
any exception) leaves exactly one `failed` record that says why, a one-line error and a non-zero
exit status; a bad resume checkpoint is refused before anything is written; a resumed run's
record covers the whole run."""
import functools
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import pytest
import torch

import bench.records.store
import bench.training.train
from bench.cli.main import main
from bench.training.checks import compose_checked
from bench.config import compose
from bench.records.store import SCHEMA, RunFailed, write_record
from conftest import nan_loss_from
from warm_processes import WarmProcess

REPO = Path(__file__).resolve().parents[1]
TINY = ["task.seq_len=24", "trainer.max_steps=4", "trainer.warmup_steps=2",
        "trainer.eval_sequences=32", "trainer.bootstrap=200", "trainer.progress=false"]


def tiny(*overrides: str) -> list[str]:
    """TINY with `overrides` replacing the keys they name."""
    keys = {o.split("=", 1)[0] for o in overrides}
    return [*(a for a in TINY if a.split("=", 1)[0] not in keys), *overrides]


def strict_json(path: Path) -> dict:
    """Parse as strict JSON: a bare NaN or Infinity token is an error."""
    def reject(token):
        raise AssertionError(f"{path} holds the non-JSON token {token}")
    return json.loads(path.read_text(), parse_constant=reject)


def only_record(out_dir: Path) -> dict:
    """The single run record in out_dir; also asserts that no temporary file survived."""
    assert not list(out_dir.rglob(".tmp-*")), list(out_dir.rglob(".tmp-*"))
    records = list(out_dir.glob("*.json"))
    assert len(records) == 1, records
    return strict_json(records[0])


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


# --- records -----------------------------------------------------------------------------

def test_a_record_with_non_finite_floats_is_strict_json(tmp_path):
    record = {"schema": SCHEMA, "run_id": "r1", "loss": math.nan,
              "curve": [[0, 1.5], [1, math.inf]], "ci": (-math.inf, 2.0), "nested": {"x": math.nan}}
    path = write_record(tmp_path, record)
    data = strict_json(path)
    assert data["loss"] == "NaN" and data["curve"] == [[0, 1.5], [1, "Infinity"]]
    assert data["ci"] == ["-Infinity", 2.0] and data["nested"] == {"x": "NaN"}
    assert [p.name for p in tmp_path.iterdir()] == ["r1.json"]


def test_a_failed_write_leaves_no_file_at_all(tmp_path, monkeypatch):
    # Encoding fails halfway through the file (as a full disk would): neither the record nor
    # the temporary file may remain.
    def half_then_fail(obj, f, **kwargs):
        f.write('{"schema": "')
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(json, "dump", half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        write_record(tmp_path, {"run_id": "r2"})
    monkeypatch.undo()
    with pytest.raises(TypeError):  # not JSON-serialisable
        write_record(tmp_path, {"run_id": "r3", "value": object()})
    assert list(tmp_path.iterdir()) == []
    # An existing record is never overwritten, and the attempt leaves no temporary file.
    write_record(tmp_path, {"run_id": "r4", "n": 1})
    with pytest.raises(FileExistsError):
        write_record(tmp_path, {"run_id": "r4", "n": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["r4.json"]
    assert strict_json(tmp_path / "r4.json")["n"] == 1


# --- divergence and other exceptions -------------------------------------------------------

def test_a_nan_loss_stops_training_at_that_step(tmp_path, monkeypatch, capsys):
    nan_loss_from(3, monkeypatch)
    code = main(["run", f"out_dir={tmp_path}", *tiny("trainer.max_steps=50",
                                                     "trainer.log_every=1")])
    assert code == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: run failed: diverged at step 3: loss nan (record: ")
    record = only_record(tmp_path)
    assert record["status"] == "failed" and record["reason"] == "diverged at step 3: loss nan"
    assert line.endswith(f"{record['run_id']}.json)")
    # Stopped at once: three optimizer steps, not fifty, and the curve ends with the NaN.
    assert record["train"]["steps"] == 3
    assert [s for s, _ in record["train"]["loss_curve"]] == [0, 1, 2, 3]
    assert record["train"]["loss_curve"][-1] == [3, "NaN"]
    assert "metrics" not in record and record["wall_time_s"] > 0


def test_a_huge_learning_rate_diverges_within_a_few_steps(tmp_path, capsys):
    code = main(["run", f"out_dir={tmp_path}", *tiny("trainer.max_steps=200", "trainer.lr=1e30")])
    assert code == 1
    assert "diverged at step" in one_error_line(capsys.readouterr().err)
    record = only_record(tmp_path)
    step = record["train"]["steps"]
    assert record["reason"] in (f"diverged at step {step}: loss nan",
                                f"diverged at step {step}: loss inf")
    # It diverges at step 1 (AdamW's first update is ~lr in size); the loss is read back only
    # on logging steps (no host synchronisation between them), so it stops at the next one.
    assert step == 10


def test_a_diverged_run_stops_within_log_every_steps(tmp_path, monkeypatch):
    nan_loss_from(3, monkeypatch)
    assert main(["run", f"out_dir={tmp_path}", *tiny("trainer.max_steps=50",
                                                     "trainer.log_every=4")]) == 1
    record = only_record(tmp_path)
    assert record["reason"] == "diverged at step 4: loss nan" and record["train"]["steps"] == 4
    # the logged steps, then the step that stopped it
    assert record["train"]["loss_curve"][-1] == [4, "NaN"]
    assert [s for s, _ in record["train"]["loss_curve"]] == [0, 4]


def test_any_exception_after_the_start_writes_one_failed_record(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("held-out set exploded\nsecond line of the message")
    monkeypatch.setattr(bench.training.train, "score_predictions", broken)
    assert main(["run", f"out_dir={tmp_path}", *TINY]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "run failed: RuntimeError: held-out set exploded (record: " in line
    record = only_record(tmp_path)
    assert record["status"] == "failed"
    assert record["reason"] == "RuntimeError: held-out set exploded"
    assert record["train"]["steps"] == 4  # training finished; evaluation failed


def test_other_ranks_write_no_record(tmp_path, monkeypatch):
    """Rank 0 alone writes records: a failure on another rank raises RunFailed without one."""
    monkeypatch.setattr(L.Trainer, "is_global_zero", property(lambda self: False))
    nan_loss_from(1, monkeypatch)
    config = compose_checked([f"out_dir={tmp_path}",
                              *tiny("trainer.max_steps=20", "trainer.log_every=1")])
    with pytest.raises(RunFailed) as failure:
        bench.training.train.run(config)
    assert failure.value.path is None and failure.value.exit_code == 1
    assert failure.value.reason == "diverged at step 1: loss nan"
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


# --- signals -------------------------------------------------------------------------------

def test_a_signal_during_training_ends_the_process_with_a_failed_record(tmp_path):
    """A process of its own: started for 100000 steps, signalled once it has written a
    checkpoint (so it is surely training), it must end promptly with 128 + signal number.
    SIGTERM here; every stop signal takes the same path, in this process below. The process
    starts warm (tests/warm_processes.py: a fresh one costs seconds of imports); a fresh
    `python -m bench` stopped by SIGTERM is tests/test_distributed.py's
    test_sigterm_to_a_run_that_lightning_launched."""
    process = WarmProcess(["run", f"out_dir={tmp_path}",
                           *tiny("trainer.max_steps=100000", "trainer.checkpoint_every=2")],
                          REPO, {**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 240  # a loaded 2-core machine starts Python slowly
        while not list(tmp_path.glob("checkpoints/*/*.ckpt")):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the run never started training"
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 128 + signal.SIGTERM, err[-3000:]
    line = one_error_line(err)
    assert line.startswith("error: run failed: interrupted (SIGTERM) at step ")
    record = only_record(tmp_path)
    assert record["status"] == "failed"
    step = record["train"]["steps"]
    assert record["reason"] == f"interrupted (SIGTERM) at step {step}"
    assert 2 <= step < 100000


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_during_training_writes_a_failed_record(tmp_path, monkeypatch, capsys, signum):
    """The signal comes in training step 3 of 100000: the run stops at the next step with one
    failed record and one line, and main returns 128 + signal number."""
    import bench.training.module
    real = bench.training.module.ICLModule.training_step

    def training_step(self, batch, batch_idx):
        if int(self.global_step) == 3:
            signal.raise_signal(signum)
        return real(self, batch, batch_idx)

    monkeypatch.setattr(bench.training.module.ICLModule, "training_step", training_step)
    code = main(["run", f"out_dir={tmp_path}", *tiny("trainer.max_steps=100000")])
    name = signal.Signals(signum).name
    line = one_error_line(capsys.readouterr().err)
    assert code == 128 + signum, line
    assert line.startswith(f"error: run failed: interrupted ({name}) at step ")
    record = only_record(tmp_path)
    assert record["status"] == "failed"
    step = record["train"]["steps"]
    assert record["reason"] == f"interrupted ({name}) at step {step}"
    assert 3 <= step <= 5


def test_the_signal_handlers_are_restored_after_a_run(tmp_path):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    assert main(["run", f"out_dir={tmp_path}", *TINY]) == 0
    assert {s: signal.getsignal(s) for s in before} == before


# --- resume --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """An uninterrupted 8-step run with a checkpoint at step 4: (record, checkpoint path)."""
    out = tmp_path_factory.mktemp("first")
    assert main(["run", f"out_dir={out}", *tiny("trainer.max_steps=8", "trainer.log_every=1",
                                                "trainer.checkpoint_every=4")]) == 0
    record = only_record(out)
    return record, next(out.glob("checkpoints/*/*step=4.ckpt"))


def test_a_checkpoint_carries_the_run_metadata(first_run):
    record, checkpoint = first_run
    meta = torch.load(checkpoint, map_location="cpu", weights_only=False)["icl_bench"]
    assert meta["run_id"] == record["run_id"]
    assert meta["task"] == record["task"] and meta["model"] == record["model"]
    assert [s for s, _ in meta["loss_curve"]] == [0, 1, 2, 3]
    assert 0 < meta["train_wall_time_s"] < record["train"]["wall_time_s"]


def signed(path: Path) -> Path:
    """`path` with a digest of its bytes beside it, as `sha256sum path > path.sha256` writes it:
    a file the user vouches for, so that the checks after the digest's are reached."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    Path(f"{path}.sha256").write_text(f"{digest}  {path.name}\n")
    return path


def bad_checkpoints(tmp_path: Path, good: Path) -> list[tuple[list[str], str]]:
    """(overrides, expected message) for every way a resume can be refused after its digest
    (tests/test_integrity_checkpoints_text.py: the digest's own refusals)."""
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint at all")
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}, "global_step": 4}, foreign)
    for planted in (garbage, truncated, foreign):
        signed(planted)
    return [
        ([f"resume={tmp_path / 'missing.ckpt'}"], "resume: no checkpoint file"),
        ([f"resume={tmp_path}"], "resume: no checkpoint file"),  # a directory
        ([f"resume={garbage}"], "resume: cannot read checkpoint"),
        ([f"resume={truncated}"], "resume: cannot read checkpoint"),
        ([f"resume={foreign}"], "is not a checkpoint written by this runner"),
        ([f"resume={good}", "task.beta=0.5"],
         "different task: task.config.beta=1.0 in the checkpoint, 0.5 now"),
        ([f"resume={good}", "task=switching_markov"],
         "different task: task.name='markov' in the checkpoint, 'switching_markov' now"),
        ([f"resume={good}", "model.d_state=8"],
         "different model: model.config.d_state=16 in the checkpoint, 8 now"),
        ([f"resume={good}", "model=transformer"], "different model: model.name='mamba'"),
        # what the record would misreport: the seed, a trainer setting, the schedule's length
        ([f"resume={good}", "seed=7"], "different seed: seed=0 in the checkpoint, 7 now"),
        ([f"resume={good}", "trainer.lr=0.1"], "different trainer: trainer.lr="),
        ([f"resume={good}", "trainer.max_steps=20"],
         "different trainer: trainer.max_steps=8 in the checkpoint, 20 now"),
        ([f"resume={good}", "trainer.precision=64-true"], "different trainer: trainer.precision="),
        ([f"resume={good}", "trainer.precision=bf16-mixed"],
         "different trainer: trainer.precision='32-true' in the checkpoint, 'bf16-mixed' now"),
        ([f"resume={good}", "trainer.batch_size=8"],
         "different trainer: trainer.batch_size=32 in the checkpoint, 8 now"),
        ([f"resume={edited(good, tmp_path, 'environment', 'device', 'cuda: NVIDIA H100')}"],
         "different environment: environment.device='cuda: NVIDIA H100' in the checkpoint, "
         "'cpu' now"),
        ([f"resume={edited(good, tmp_path, 'code', None, 'f' * 12)}"],
         "different code: code='ffffffffffff' in the checkpoint"),
    ]


def edited(checkpoint: Path, tmp_path: Path, key: str, inner: str | None, value) -> Path:
    """A copy of `checkpoint` whose run metadata says `key` (or key.inner) was `value`."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    if inner is None:
        state["icl_bench"][key] = value
    else:
        state["icl_bench"][key][inner] = value
    path = tmp_path / f"edited-{key}.ckpt"
    torch.save(state, path)
    return signed(path)


def test_resume_is_refused_before_anything_is_written(first_run, tmp_path, capsys):
    _, checkpoint = first_run
    out = tmp_path / "results"
    for overrides, needle in bad_checkpoints(tmp_path, checkpoint):
        given = {o.split("=", 1)[0]: o for o in ["trainer.max_steps=8", *overrides]}
        code = main(["run", f"out_dir={out}", *tiny(*given.values())])
        line = one_error_line(capsys.readouterr().err)
        assert code == 2 and needle in line, (overrides, line)
        assert not out.exists(), overrides  # no record, no checkpoint directory


def test_a_resumed_record_covers_the_whole_run(first_run, tmp_path, capsys):
    first, checkpoint = first_run
    # Pretend the first part took 1000 s: the resumed record must count it.
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    state["icl_bench"]["train_wall_time_s"] = 1000.0
    edited = tmp_path / "step4.ckpt"
    torch.save(state, edited)
    signed(edited)
    out = tmp_path / "results"
    assert main(["run", f"out_dir={out}", f"resume={edited}",
                 *tiny("trainer.max_steps=8", "trainer.log_every=1")]) == 0
    capsys.readouterr()
    record = only_record(out)
    assert record["status"] == "ok" and record["train"]["steps"] == 8
    assert record["resumed_from"] == str(edited) and record["resumed_run_id"] == first["run_id"]
    assert record["run_id"] != first["run_id"]
    # The whole loss curve, each step once, equal to the uninterrupted run's (same batches).
    curve, reference = record["train"]["loss_curve"], first["train"]["loss_curve"]
    assert [s for s, _ in curve] == list(range(8)) == [s for s, _ in reference]
    assert [v for _, v in curve] == pytest.approx([v for _, v in reference], rel=1e-5)
    # Wall times include the first part: 1000 s plus this process's few seconds.
    assert 1000 < record["train"]["wall_time_s"] <= record["wall_time_s"] < 1000 + 300


def test_a_failed_suite_entry_does_not_stop_the_suite(tmp_path, monkeypatch, capsys):
    """The first entry diverges (lr 1e30), the second runs: both records are written, the suite
    ends with exit 1 and one error line naming the failed entry."""
    import bench.cli.run_commands
    tiny = ["task.seq_len=24", "trainer.warmup_steps=2", "trainer.eval_sequences=32",
            "trainer.bootstrap=200", "trainer.progress=false", "trainer.max_steps=4"]
    monkeypatch.setattr(bench.cli.run_commands, "load_suite",
                        lambda name: [["trainer.lr=1e30", *tiny], ["seed=1", *tiny]])
    assert main(["suite", "name=leaderboard", f"out_dir={tmp_path}"]) == 1
    captured = capsys.readouterr()
    assert "failed: diverged at step" in captured.out
    errors = captured.err.strip().splitlines()
    assert errors == ["error: 1 of 2 runs of suite leaderboard failed (entries 1); their failed "
                      "records say why"]
    statuses = sorted(json.loads(p.read_text())["status"] for p in tmp_path.glob("*.json"))
    assert statuses == ["failed", "ok"]
    origins = {json.loads(p.read_text())["origin"] for p in tmp_path.glob("*.json")}
    assert origins == {"suite:leaderboard"}


def test_a_suite_run_again_skips_the_runs_it_finished(tmp_path, monkeypatch, capsys):
    """An interrupted suite goes on where it stopped: an entry with an `ok` record of the same
    config and seed made by the current, clean code is skipped; other code, a dirty checkout or
    rerun=true run it again."""
    import bench.cli.run_commands
    import bench.records.store
    import bench.training.train
    tiny = ["task.seq_len=24", "trainer.warmup_steps=2", "trainer.eval_sequences=32",
            "trainer.bootstrap=200", "trainer.progress=false", "trainer.max_steps=3"]
    monkeypatch.setattr(bench.cli.run_commands, "load_suite", lambda name: [["seed=0", *tiny],
                                                                  ["seed=1", *tiny]])
    version = {"commit": "a" * 40, "code": "c0de", "dirty": False, "version": None, "torch": "t"}
    # each main() call stands for a process of its own: the code it reports is `version` now
    monkeypatch.setattr(bench.records.store, "provenance", lambda: dict(version))
    monkeypatch.setattr(bench.training.train, "code_of_this_process", lambda: dict(version))
    suite = ["suite", "name=leaderboard", f"out_dir={tmp_path}"]
    # an ad-hoc run of entry 1's config does not finish it: boards and claims count suite runs
    assert main(["run", f"out_dir={tmp_path / 'adhoc'}", "seed=0", *tiny]) == 0
    for path in (tmp_path / "adhoc").glob("*.json"):
        path.rename(tmp_path / path.name)
    capsys.readouterr()
    assert main([*suite, "entries=1"]) == 0  # "interrupted" after seed 0
    out = capsys.readouterr().out
    assert out.startswith("[1/2] seed=0") and "done already" not in out
    for path in tmp_path.glob("*.json"):  # the ad-hoc record aside, as before
        if json.loads(path.read_text())["origin"] == "adhoc":
            path.unlink()
    assert len(list(tmp_path.glob("*.json"))) == 1
    assert main(suite) == 0
    out = capsys.readouterr().out
    assert out.count("done already") == 1 and len(list(tmp_path.glob("*.json"))) == 2
    assert "[2/2] seed=1" in out
    assert main(suite) == 0
    assert capsys.readouterr().out.count("done already") == 2
    assert len(list(tmp_path.glob("*.json"))) == 2
    assert main([*suite, "rerun=true"]) == 0
    assert len(list(tmp_path.glob("*.json"))) == 4
    for change in ({"code": "0the"}, {"dirty": True}):
        version.update({"code": "c0de", "dirty": False, **change})
        assert main(suite) == 0
        assert "done already" not in capsys.readouterr().out
    assert main([*suite, "rerun=maybe"]) == 2
    assert "rerun must be true or false" in capsys.readouterr().err


def test_a_suite_counts_a_run_done_only_in_the_environment_it_would_run_in(tmp_path,
                                                                           monkeypatch):
    """A CPU record does not finish a run that would train on a GPU here (`auto` would pick
    another device and SSD kernel), nor the reverse; a record of the same environment does, an
    old one without device_name, tf32, kernel, precision or compile included."""
    import bench.training.checks
    import bench.records.store
    import models.ssd
    from bench.cli.suites import finished_runs
    version = {"commit": "a" * 40, "code": "c0de", "dirty": False, "version": None, "torch": "t"}
    monkeypatch.setattr(bench.records.store, "provenance", lambda: dict(version))
    config = compose_checked(["model=mamba", f"out_dir={tmp_path}", *TINY])
    config.origin = "suite:leaderboard"  # as `suite` sets it: records of its kind finish it

    from test_leaderboard import record as scored  # what an ok record holds (bench.records.schema)
    shown = {k: v for k, v in scored().items()
             if k in ("metrics", "per_position", "params", "state_size")}

    def put(name: str, train: dict) -> None:
        write_record(tmp_path, {"schema": SCHEMA, "run_id": name, "status": "ok",
                                **config.describe(), "origin": "suite:leaderboard",
                                "provenance": version, **shown,
                                "train": {"steps": 4, "wall_time_s": 1.0, **train}})

    put("cpu", {"device": "cpu"})  # as records before device_name, tf32 and kernel were
    assert finished_runs([config]) == {0: str(tmp_path / "cpu.json")}
    monkeypatch.setattr(bench.training.checks, "check_hardware", lambda config: "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    # the kernel imports and a call of it runs (kernel=auto resolves once per process)
    monkeypatch.setattr(models.ssd, "mamba_ssm_kernel_error", lambda: None)
    monkeypatch.setattr(models.ssd, "_smoke_test_kernel", lambda device, shape=None: None)
    monkeypatch.setattr(models.ssd, "_auto_cache", {})
    assert finished_runs([config]) == {}
    put("a100", {"device": "cuda:0", "device_name": "NVIDIA A100-SXM4-80GB",
                 "kernel": "mamba_ssm", "precision": "32-true", "compile": False, "tf32": False})
    assert finished_runs([config]) == {}  # another GPU
    put("h100", {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3",
                 "kernel": "mamba_ssm", "precision": "32-true", "compile": False, "tf32": False})
    assert finished_runs([config]) == {0: str(tmp_path / "h100.json")}


@pytest.mark.parametrize("precision, patience", [("32-true", 1), ("16-mixed", 3)])
def test_a_non_finite_loss_stops_a_run_at_once_except_an_overflow_under_16_mixed(precision,
                                                                                  patience):
    """Under 16-mixed GradScaler skips a step whose gradients overflowed (and lowers its scale),
    so one non-finite loss is not the end: only NONFINITE_PATIENCE checks in a row are."""
    from bench.training.module import NONFINITE_PATIENCE, ICLModule
    from bench.training.signals import Diverged
    from bench.training.train import build
    assert NONFINITE_PATIENCE == 3
    # unchecked: 16-mixed needs CUDA to train; the decision needs none
    config = compose([f"trainer.precision={precision}", *tiny("trainer.max_steps=10",
                                                              "trainer.log_every=100")])
    task, model = build(config)
    module = ICLModule(model, task, config.trainer)
    module.trainer = L.Trainer(accelerator="cpu", devices=1, logger=False,
                               enable_progress_bar=False, enable_checkpointing=False)
    nan, finite = torch.tensor(math.nan), torch.tensor(0.5)
    last = config.trainer.max_steps - 1  # a checked step that is not a logging step
    if patience > 1:
        module._check_step(nan, last)  # an overflow: the run goes on
        module._check_step(finite, last)  # ... and recovers: the count starts again
        for _ in range(patience - 1):
            module._check_step(nan, last)
    with pytest.raises(Diverged, match=f"diverged at step {last}: loss nan"):
        module._check_step(nan, last)


def test_every_record_of_a_process_names_the_code_it_loaded(tmp_path, monkeypatch, capsys):
    """A suite's later runs execute the code loaded at its first run: a commit or an edit made
    while it runs must not change the code their records name."""
    import bench.records.store
    import bench.training.train
    monkeypatch.setattr(bench.training.train, "code_of_this_process",
                        functools.cache(bench.training.train.code_of_this_process.__wrapped__))
    versions = iter([{"commit": c * 40, "code": c * 12, "dirty": False, "version": None,
                      "torch": "t"} for c in "ab"])
    monkeypatch.setattr(bench.records.store, "provenance", lambda: next(versions))
    for seed in (0, 1):
        assert main(["run", f"out_dir={tmp_path}", f"seed={seed}", *tiny("trainer.max_steps=2")]) == 0
    capsys.readouterr()
    records = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert [r["provenance"]["commit"] for r in records] == ["a" * 40] * 2


def test_a_reference_that_is_not_finite_is_named_and_the_gap_reference_fails_the_run(capsys):
    from bench.training.train import ReferenceNotFinite, check_references
    fine = {"gap_reference": "bayes", "roles": {"bayes": "bayes", "gd5": "baseline"},
            "loss": {"bayes": 1.0, "gd5": 2.0, "model": 1.5}}
    check_references(fine)
    assert "nonfinite_references" not in fine and capsys.readouterr().err == ""
    baseline = {**fine, "loss": {"bayes": 1.0, "gd5": math.nan, "model": 1.5}}
    check_references(baseline)
    assert baseline["nonfinite_references"] == ["gd5"]
    assert "warning: the held-out loss of gd5 is not finite" in capsys.readouterr().err
    with pytest.raises(ReferenceNotFinite, match="gap reference bayes"):
        check_references({**fine, "loss": {"bayes": math.inf, "gd5": 2.0, "model": 1.5}})


def test_inputs_scaled_beyond_float_range_flag_the_references_they_break(tmp_path, capsys):
    """The issue's `task=linreg task.eval_x_scale=1e30` end to end: an `ok` record whose
    non-finite reference losses are named (it had a NaN reference loss, unflagged), every number
    in it strict JSON, and the warning on stderr; the gap reference (bayes) stays finite."""
    code = main(["run", f"out_dir={tmp_path}", "task=linreg", "task.eval_x_scale=1e30",
                 "model=lstm", *tiny("trainer.max_steps=2")])
    record = only_record(tmp_path)  # strict JSON, one record, no temporary file
    assert code == 0 and record["status"] == "ok"
    assert record["metrics"]["nonfinite_references"], record["metrics"]  # gd5: overflow to NaN
    assert "is not finite" in capsys.readouterr().err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_while_the_record_is_written_says_the_record_is_complete(
        tmp_path, monkeypatch, capsys, signum):
    """The record is written whole and stays `ok`; the process then stops as the signal asked,
    with one line that says the record is complete (it said only 'interrupted')."""
    import bench.training.train
    real = bench.training.train.write_record

    def signalled_while_writing(out_dir, record):
        signal.raise_signal(signum)
        return real(out_dir, record)

    monkeypatch.setattr(bench.training.train, "write_record", signalled_while_writing)
    code = main(["run", f"out_dir={tmp_path}", *tiny("trainer.max_steps=2")])
    line = one_error_line(capsys.readouterr().err)
    record = only_record(tmp_path)
    assert code == 128 + signum and record["status"] == "ok"
    name = signal.Signals(signum).name
    assert line == (f"error: interrupted ({name}) after the run finished; its record is "
                    f"complete: {tmp_path / (record['run_id'] + '.json')}")


def test_a_disk_that_refuses_the_ok_record_gets_a_smaller_failed_one(tmp_path, monkeypatch,
                                                                    capsys):
    """A full disk: the ok record cannot be written, and the failed record (with the trained
    metrics, without the per-position curves) is smaller than it, so it has room where the ok
    record had almost."""
    import bench.training.train
    real, sizes = bench.training.train.write_record, []

    def full_for_ok_records(out_dir, record):
        sizes.append(len(json.dumps(record, default=str)))
        if record["status"] == "ok":
            raise OSError(28, "No space left on device")
        return real(out_dir, record)

    monkeypatch.setattr(bench.training.train, "write_record", full_for_ok_records)
    assert main(["run", f"out_dir={tmp_path}", *tiny("trainer.max_steps=2")]) == 1
    assert "No space left on device" in one_error_line(capsys.readouterr().err)
    record = only_record(tmp_path)
    assert record["status"] == "failed" and "bayes_gap" in record["metrics"]
    assert sizes[1] < sizes[0]


def test_a_run_that_never_leaves_its_warm_up_says_so(tmp_path, capsys):
    assert main(["run", f"out_dir={tmp_path}",
                 *tiny("trainer.max_steps=2", "trainer.warmup_steps=5")]) == 0
    assert ("warning: trainer.warmup_steps=5 > trainer.max_steps=2: the learning rate stays in "
            "its warm-up") in capsys.readouterr().err


# --- issue 19: resume, signals in every phase, caches that cannot be trusted or written ---

def test_resume_accepts_a_change_of_what_cannot_change_the_numbers(first_run, tmp_path):
    """Where records go and how a run is logged, shown, threaded, checkpointed and evaluated may
    change on resume; compose_checked's checks (check_resume among them) accept it."""
    _, checkpoint = first_run
    compose_checked([f"resume={checkpoint}", f"out_dir={tmp_path / 'elsewhere'}",
                     *tiny("trainer.max_steps=8", "trainer.logger=none", "trainer.progress=true",
                           "trainer.threads=1", "trainer.checkpoint_every=3", "trainer.log_every=5",
                           "trainer.eval_batch_size=16", "trainer.eval_sequences=64",
                           "trainer.bootstrap=100", "trainer.reference_cache=false")])


def _signalled_in(target, name: str, signum: int, monkeypatch) -> None:
    real = getattr(target, name)

    def signalled(*args, **kwargs):
        signal.raise_signal(signum)
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, signalled)


@pytest.mark.parametrize("phase", ["building", "evaluation", "probe"])
def test_sighup_in_every_phase_writes_one_failed_record(phase, tmp_path, monkeypatch, capsys):
    """The terminal closed or SSH dropped: SIGHUP ends the run like SIGTERM wherever it comes
    (training: test_a_signal_during_training_writes_a_failed_record; the record being written:
    test_a_signal_while_the_record_is_written...), one failed record, exit 129, and the metrics
    kept where they had been computed (it killed the run with no record)."""
    import bench.training.train
    target, name = {"building": (bench.training.train, "build"), "evaluation": (L.Trainer, "test"),
                    "probe": (bench.training.train, "probe_summary")}[phase]
    _signalled_in(target, name, signal.SIGHUP, monkeypatch)
    assert main(["run", f"out_dir={tmp_path}", *tiny("trainer.max_steps=2")]) == 129
    line = one_error_line(capsys.readouterr().err)
    record = only_record(tmp_path)
    step = 0 if phase == "building" else 2
    assert record["status"] == "failed" and record["reason"] == f"interrupted (SIGHUP) at step {step}"
    assert line.startswith(f"error: run failed: interrupted (SIGHUP) at step {step} (record: ")
    assert ("metrics" in record) == (phase == "probe")  # scored before the probe: kept
    if phase == "probe":
        assert "bayes_gap" in record["metrics"] and "per_position" not in record


@pytest.mark.parametrize("where", ["omegaconf", "lightning"])
def test_ctrl_c_while_modules_import_is_one_line_and_exit_130(where, tmp_path):
    """SIGINT while the command's modules import (the config's at start-up, torch and
    Lightning's when a run begins): 'error: interrupted', exit 130, not a 21-line traceback."""
    hook = "\n".join([
        "import builtins, runpy, signal, sys",
        "real = builtins.__import__",
        "def once(name, *args, **kwargs):",
        f"    if name == {where!r}:",
        "        builtins.__import__ = real",
        "        signal.raise_signal(signal.SIGINT)",
        "    return real(name, *args, **kwargs)",
        "builtins.__import__ = once",
        f"sys.argv = ['bench', 'run', 'out_dir={tmp_path / 'out'}', 'trainer.max_steps=2']",
        "runpy.run_module('bench', run_name='__main__', alter_sys=True)"])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", hook], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 130, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == ["error: interrupted"], done.stderr[-3000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("failure", [
    "cache is a file", "read-only folder", "immutable folder", "disk full (torch.save)",
    "disk full (folder)"])
def test_a_reference_cache_that_cannot_be_written_warns_and_keeps_the_result(
        failure, tmp_path, monkeypatch, capsys):
    """The references computed, the cache write fails: a warning, the scores returned as if
    written, no temporary file (exit 1 and a failed record threw the trained result away; a
    full disk said only 'RuntimeError: [enforce fail at inline_container.cc:672]')."""
    import bench.training.reference_cache as cache
    from bench.training.train import build
    config = compose([f"out_dir={tmp_path}", *tiny("trainer.eval_sequences=16")])
    task, _ = build(config)
    batch, cached = cache.held_out_set(config, task)
    assert cached is None
    if failure == "cache is a file":
        (tmp_path / "cache").write_text("a file where the cache folder would go")
    elif failure in ("read-only folder", "immutable folder"):  # as root, chmod would not stop it
        code = {"read-only folder": (13, "Permission denied"),
                "immutable folder": (1, "Operation not permitted")}[failure]

        def refused(*args, **kwargs):
            raise PermissionError(*code)
        monkeypatch.setattr(tempfile, "mkstemp", refused)  # every atomic writer's temporary
    elif failure == "disk full (torch.save)":
        def full(*args, **kwargs):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter "
                               "failed writing file data/0: file write failed")
        monkeypatch.setattr(cache.torch, "save", full)
    else:
        def full(*args, **kwargs):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(Path, "mkdir", full)
    scores = cache.complete(config, task, batch, None)
    monkeypatch.undo()
    fresh = cache.reference_scores(task, batch)
    assert cache.content_digest(scores.scores) == cache.content_digest(fresh.scores)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: the reference cache was not written ("), err
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob(".tmp-*"))
    assert cache.load(str(tmp_path), task, 16) is None


def test_a_damaged_cache_is_named_and_recomputed(tmp_path, capsys):
    """A cache whose bytes do not match their digest is said to be recomputed, not used."""
    import bench.training.reference_cache as cache
    from bench.training.train import build
    config = compose([f"out_dir={tmp_path}", *tiny("trainer.eval_sequences=16")])
    task, _ = build(config)
    batch, _ = cache.held_out_set(config, task)
    cache.complete(config, task, batch, None)
    path = cache.cache_path(str(tmp_path), task, 16)
    data = torch.load(path, weights_only=True)
    data["content"]["inputs"] = data["content"]["inputs"].clone()
    data["content"]["inputs"].view(-1)[3] += 1  # a token changed, the digest kept
    torch.save(data, path)
    assert cache.held_out_set(config, task)[1] is None
    path.write_bytes(b"not a torch file")
    assert cache.held_out_set(config, task)[1] is None
    assert capsys.readouterr().err.splitlines() == [
        f"warning: the reference cache {path} does not match the digest it was written with; "
        "recomputing it",
        f"warning: the reference cache {path} cannot be read (UnpicklingError); recomputing it"]


def test_a_damaged_token_cache_or_cached_tokenizer_is_named_and_rebuilt(tmp_path, monkeypatch,
                                                                        capsys):
    """A flipped byte in cached tokens (same size, same sidecar) and a cached BPE tokenizer cut
    short are rebuilt, and the run says so."""
    pytest.importorskip("datasets")
    pytest.importorskip("tokenizers")
    import datasets.config
    import numpy as np

    from tasks import corpora as C
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")
    data = tmp_path / "data"
    data.mkdir()
    for split in C.SPLITS:
        (data / f"{split}.txt").write_text("the cat sat on the mat while a dog ran\n" * 40)
    corpus = C.load_splits("mine", data_dir=data, hub=False, sample_by="line")
    tokens, meta = C.cached_tokens(corpus, "test", C.ByteTokenizer(), tmp_path, progress=False)
    expected = np.array(tokens)
    del tokens
    bin_path, _ = C.cache_paths(corpus, "test", C.ByteTokenizer(), tmp_path)
    with open(bin_path, "r+b") as f:
        f.seek(7)
        f.write(b"X")
    tokens, _ = C.cached_tokens(corpus, "test", C.ByteTokenizer(), tmp_path, progress=False)
    assert np.array_equal(np.array(tokens), expected)
    tok = C.make_tokenizer("bpe", vocab_size=300, corpus=corpus, cache_dir=tmp_path,
                           progress=False)
    cached = Path(tok.path)
    cached.write_text(cached.read_text()[:100])
    C.make_tokenizer("bpe", vocab_size=300, corpus=corpus, cache_dir=tmp_path, progress=False)
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("warning: ")]  # datasets' progress bars aside
    assert warnings == [
        f"warning: the token cache {bin_path} does not match the digest it was written with; "
        "tokenizing the test split again",
        f"warning: the cached tokenizer {cached} cannot be read; training it again"]


def vector_tasks() -> list[str]:
    """Every vector task family (the registry's), each run through the conf file of its name."""
    from tasks import task_families
    return sorted(family for family, cls in task_families().items() if cls.kind == "vectors")


VECTOR_TASKS = vector_tasks()


def test_the_vector_tasks_are_all_here():
    from bench.config import choices
    assert len(VECTOR_TASKS) >= 4 and set(VECTOR_TASKS) <= set(choices("task"))


@pytest.mark.parametrize("task", VECTOR_TASKS)
def test_64_true_trains_and_scores_every_vector_task(task, tmp_path, capsys):
    """trainer.precision=64-true crashed on the four vector tasks after the start (float32
    inputs into a float64 model)."""
    small_bayes = hasattr(compose([f"task={task}"]).task, "bayes_particles")
    extra = ["task.bayes_particles=64"] if small_bayes else []  # lgssm's SMC
    assert main(["run", f"task={task}", "trainer.precision=64-true", f"out_dir={tmp_path}",
                 "trainer.logger=none", "trainer.reference_cache=false",
                 *tiny("task.seq_len=12", "trainer.max_steps=2", "trainer.warmup_steps=1",
                       "trainer.eval_sequences=16", "trainer.bootstrap=20"), *extra]) == 0
    record = only_record(tmp_path)
    assert record["status"] == "ok" and record["train"]["precision"] == "64-true"
    assert math.isfinite(record["metrics"]["bayes_gap"])


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_records_and_reports_get_the_mode_the_umask_gives(umask, tmp_path):
    """Records were written 0600 (mkstemp's mode) while caches and boards were 0644: every
    file now gets what an ordinary file gets under the umask."""
    from bench.records.store import write_json
    previous = os.umask(umask)
    try:
        record = write_record(tmp_path, {"run_id": "r", "value": 1.0})
        report = write_json(tmp_path / "speed.json", {"value": 1.0})
    finally:
        os.umask(previous)
    for path in (record, report):
        assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask, path


@pytest.fixture
def offline_hf(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    pytest.importorskip("tokenizers")
    import datasets.config
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")


def test_an_edited_corpus_is_tokenized_and_its_references_keyed_again(offline_hf, tmp_path,
                                                                      monkeypatch):
    """An edit that keeps the file's size and modification time (cp -p, rsync -t, touch -r):
    the next run's tokens are the edited text's, and its reference cache key is new (stale
    tokens and baselines were used)."""
    import numpy as np

    import bench.training.reference_cache as cache
    import tasks.text
    from bench.training.train import build
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "validation", "test"):
        (data / f"{split}.txt").write_text("the cat sat on the mat while a dog ran\n" * 40)
    args = ["task=text", f"task.data_dir={data}", "task.tokenizer=byte", "task.seq_len=16",
            "model.d_model=16", f"out_dir={tmp_path / 'out'}"]

    def tokens_and_key():
        monkeypatch.setattr(tasks.text, "_FOUND", {})  # a new process finds the corpus anew
        task, _ = build(compose(args))
        tokens = np.asarray(task.split_tokens("train").tokens).astype(np.uint8)  # bytes
        return tokens.tobytes(), cache.cache_key(task, 16)

    before, key_before = tokens_and_key()
    train = data / "train.txt"
    times = os.stat(train)
    text = train.read_text()
    train.write_text(text.replace("cat", "bat", 1))
    os.utime(train, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert os.stat(train).st_size == times.st_size and os.stat(train).st_mtime_ns == times.st_mtime_ns
    after, key_after = tokens_and_key()
    assert after == train.read_bytes() != before and key_after != key_before


def test_a_single_line_longer_than_a_bpe_piece_is_trained_in_pieces(offline_hf, tmp_path,
                                                                     monkeypatch):
    """BPE training held ~140 bytes a character of one text: a 50 MB line peaked at 7 GB. A
    line is given to the trainer in pieces of at most TRAIN_PIECE characters."""
    from tasks import corpora as C
    from tasks.corpora import tokenizers
    data = tmp_path / "data"
    data.mkdir()
    words = "the cat sat on the mat while a dog ran after the ball".split()
    line = " ".join(words[i % len(words)] for i in range(C.TRAIN_PIECE // 3))
    assert len(line) > C.TRAIN_PIECE
    (data / "train.txt").write_text(line)
    for split in ("validation", "test"):
        (data / f"{split}.txt").write_text("the cat sat\n" * 10)
    corpus = C.load_splits("mine", data_dir=data, hub=False, sample_by="document")
    real, pieces = C.training_pieces, []

    def counted(text, *args, **kwargs):
        for piece in real(text, *args, **kwargs):
            pieces.append(len(piece))
            yield piece

    monkeypatch.setattr(tokenizers, "training_pieces", counted)  # looked up there
    C.make_tokenizer("bpe", vocab_size=300, corpus=corpus, cache_dir=tmp_path / "cache",
                     progress=False)
    assert sum(pieces) == len(line) and len(pieces) == 2 and max(pieces) <= C.TRAIN_PIECE
