"""The training log (trainer.logger): a CSV under out_dir/logs/<run_id>/ holding the loss curve
of the record, the learning-rate schedule and the throughput, then a row of the final
evaluation's headline (test/...); a resumed run continues it, each step once; a failed run leaves the steps it did; logger=none writes nothing; a logger whose
package is missing is refused at compose time with one line."""
import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from bench.cli.main import main
from bench.training.module import cosine_with_warmup
from conftest import nan_loss_from

# 20 steps, a row every 3 (0, 3, ..., 18), a checkpoint at step 10: the resume cuts an interval
RUN = ["task.seq_len=24", "trainer.max_steps=20", "trainer.warmup_steps=2",
       "trainer.eval_sequences=32", "trainer.bootstrap=200", "trainer.progress=false",
       "trainer.log_every=3", "trainer.checkpoint_every=10"]
LOGGED = list(range(0, 20, 3))
FINAL = {"test/bayes_gap", "test/bayes_gap_ci_low", "test/bayes_gap_ci_high", "test/relative_gap",
         "test/loss"}


def with_overrides(base: list[str], overrides) -> list[str]:
    """base with `overrides` in place of its keys."""
    keys = {o.split("=", 1)[0] for o in overrides}
    return [*(a for a in base if a.split("=", 1)[0] not in keys), *overrides]


def tiny(*overrides: str) -> list[str]:
    return with_overrides(RUN, overrides)


def records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def read_log(path: Path) -> list[dict]:
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    return [{key: float(value) if value else None for key, value in row.items()} for row in rows]


def training_rows(rows: list[dict]) -> list[dict]:
    """The rows RunLog writes every log_every steps (not the final evaluation's)."""
    return [row for row in rows if row.get("lr") is not None]


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """One 20-step run: (out_dir, record, its log's rows as written before any resume)."""
    out = tmp_path_factory.mktemp("log")
    assert main(["run", f"out_dir={out}", *RUN]) == 0
    (record,) = records(out)
    return out, record, read_log(out / record["log_dir"] / "metrics.csv")


def test_the_csv_log_is_where_the_record_says_and_holds_its_loss_curve(first):
    out, record, rows = first
    assert record["log_dir"] == f"logs/{record['run_id']}"  # relative to out_dir
    assert [p.name for p in (out / "logs").iterdir()] == [record["run_id"]]
    assert set(rows[0]) == {"step", "loss", "lr", "steps_per_s", "tokens_per_s", *FINAL}
    *rows, final = rows  # the final evaluation's headline, at the last step
    assert final["step"] == 20 and final["test/bayes_gap"] == record["metrics"]["bayes_gap"]
    assert [final["test/bayes_gap_ci_low"], final["test/bayes_gap_ci_high"]] == \
        record["metrics"]["bayes_gap_ci"]
    assert final["test/loss"] == record["metrics"]["loss"]["model"]
    assert rows == training_rows(rows)
    curve = record["train"]["loss_curve"]
    assert [r["step"] for r in rows] == [s for s, _ in curve] == LOGGED
    assert [r["loss"] for r in rows] == pytest.approx([v for _, v in curve], rel=1e-12)


def test_the_learning_rate_warms_up_then_follows_the_cosine(first):
    _, record, rows = first
    rows = training_rows(rows)
    t = record["trainer"]["config"]
    expected = [t["lr"] * cosine_with_warmup(int(r["step"]), t["warmup_steps"], t["max_steps"],
                                             t["min_lr_ratio"]) for r in rows]
    assert [r["lr"] for r in rows] == pytest.approx(expected, rel=1e-9)
    assert rows[0]["lr"] == pytest.approx(t["lr"] / 2)  # step 0 of a 2-step warm-up
    lrs = [r["lr"] for r in rows[1:]]  # then only down, to lr * min_lr_ratio at the end
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] > t["lr"] * t["min_lr_ratio"]


def test_the_throughput_is_positive_and_counts_batch_times_length(first):
    _, record, rows = first
    per_step = record["trainer"]["config"]["batch_size"] * record["task"]["config"]["seq_len"]
    for row in training_rows(rows):
        assert 0 < row["steps_per_s"] < 1e6
        assert row["tokens_per_s"] == pytest.approx(row["steps_per_s"] * per_step, rel=1e-9)


def test_a_resumed_run_continues_the_same_log_each_step_once(first, capsys):
    out, record, before = first
    checkpoint = next(out.glob(f"checkpoints/{record['run_id']}/*step=10.ckpt"))
    assert main(["run", f"out_dir={out}", f"resume={checkpoint}", *RUN]) == 0
    capsys.readouterr()
    resumed = next(r for r in records(out) if r["run_id"] != record["run_id"])
    assert resumed["log_dir"] == record["log_dir"]
    assert [p.name for p in (out / "logs").iterdir()] == [record["run_id"]]  # no second log
    rows = read_log(out / record["log_dir"] / "metrics.csv")
    # the first part's final row (step 20) went with the later steps; the resumed run's came
    assert [r["step"] for r in rows if r["lr"] is None] == [20]
    assert rows[-1]["test/bayes_gap"] == resumed["metrics"]["bayes_gap"]
    rows, before = training_rows(rows), training_rows(before)
    assert [r["step"] for r in rows] == LOGGED  # 0..9 kept, 12..18 written again, once each
    assert rows[:4] == before[:4]  # the rows before the checkpoint's step are untouched
    # the resumed part trained on the same batches: the same losses and learning rates
    assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in before], rel=1e-5)
    assert [r["lr"] for r in rows] == pytest.approx([r["lr"] for r in before], rel=1e-12)
    assert [r["loss"] for r in rows] == pytest.approx(
        [v for _, v in resumed["train"]["loss_curve"]], rel=1e-12)
    assert all(r["steps_per_s"] > 0 for r in rows)
    # a checkpoint of the resumed run points at the same log, so resuming again continues it
    later = next(out.glob(f"checkpoints/{resumed['run_id']}/*step=20.ckpt"))
    meta = torch.load(later, map_location="cpu", weights_only=False)["icl_bench"]
    assert meta["log_dir"] == record["log_dir"]


def test_logger_none_writes_no_log(tmp_path):
    assert main(["run", f"out_dir={tmp_path}", *tiny("trainer.max_steps=4",
                                                      "trainer.logger=none")]) == 0
    (record,) = records(tmp_path)
    assert record["log_dir"] is None and not (tmp_path / "logs").exists()


def test_a_failed_run_leaves_a_valid_log_of_the_steps_it_did(tmp_path, monkeypatch, capsys):
    nan_loss_from(3, monkeypatch)
    assert main(["run", f"out_dir={tmp_path}", *tiny("trainer.max_steps=50",
                                                      "trainer.log_every=1")]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    (record,) = records(tmp_path)
    assert record["status"] == "failed"
    rows = read_log(tmp_path / record["log_dir"] / "metrics.csv")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r["loss"] for r in rows[:3]] == pytest.approx(
        [v for _, v in record["train"]["loss_curve"][:3]], rel=1e-12)
    assert math.isnan(rows[3]["loss"]) and rows[3]["steps_per_s"] is None  # the diverged step


@pytest.mark.parametrize("logger,modules", [("tensorboard", ("tensorboard", "tensorboardX")),
                                            ("wandb", ("wandb",))])
def test_a_logger_without_its_package_is_one_line_and_exit_2(logger, modules, tmp_path, capsys):
    if any(importlib.util.find_spec(module) for module in modules):
        pytest.skip(f"a package for trainer.logger={logger} is installed")
    module = modules[0]
    assert main(["run", f"out_dir={tmp_path}", f"trainer.logger={logger}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"trainer.logger={logger} needs the {module} package" in err
    assert f"pip install {module}" in err
    assert not any(tmp_path.iterdir())


def test_an_unknown_logger_is_one_line_and_exit_2(capsys):
    assert main(["run", "trainer.logger=mlflow"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "trainer.logger must be one of csv, tensorboard, wandb, none, got 'mlflow'" in err
