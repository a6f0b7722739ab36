"""Live validation (trainer.val_every) and what reaches the logger: every N optimizer steps and at
the last, the Bayes gap of a fixed validation set goes to the log (val/...) and to the record's
train.val_curve, scored by the final evaluation's code; it changes nothing of the run's result;
a resumed run keeps the curve up to its checkpoint's step; the log also gets the composed config
(hparams.yaml) and the final headline (test/...)."""
import importlib.util

import pytest
import yaml

import bench.training.validation
from bench.cli.main import main
from tasks.base import TEST_STREAM
from test_distributed import finish, launch_ranks
from test_logging import read_log, records, with_overrides

# 14 steps, validation every 4 (and at the last), a checkpoint at step 8
RUN = ["task.seq_len=24", "trainer.max_steps=14", "trainer.warmup_steps=2",
       "trainer.eval_sequences=32", "trainer.bootstrap=200", "trainer.progress=false",
       "trainer.log_every=3", "trainer.threads=1"]
VALIDATED = ["trainer.val_every=4", "trainer.val_sequences=16", "trainer.checkpoint_every=8"]
VAL_STEPS = [4, 8, 12, 14]


def tiny(*overrides: str) -> list[str]:
    """RUN with `overrides` in place of its keys."""
    return with_overrides(RUN, overrides)


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    """One validated 14-step run: (out_dir, record)."""
    out = tmp_path_factory.mktemp("val")
    assert main(["run", f"out_dir={out}", *RUN, *VALIDATED]) == 0
    (record,) = records(out)
    return out, record


def test_the_val_curve_is_at_every_n_steps_and_the_last(validated):
    _, record = validated
    curve = record["train"]["val_curve"]
    assert [step for step, _ in curve] == VAL_STEPS
    assert all(0 < gap < 1 for _, gap in curve)  # a markov gap in nats/token, finite


def test_the_csv_log_has_the_val_columns_beside_the_training_loss(validated):
    out, record = validated
    rows = read_log(out / record["log_dir"] / "metrics.csv")
    assert {"loss", "val/bayes_gap", "val/bayes_gap_ci_low", "val/bayes_gap_ci_high",
            "val/relative_gap", "val/loss", "test/bayes_gap"} <= set(rows[0])
    val = [(r["step"], r["val/bayes_gap"]) for r in rows if r["val/bayes_gap"] is not None]
    assert val == [tuple(point) for point in record["train"]["val_curve"]]
    for row in rows:
        if row["val/bayes_gap"] is not None:
            assert row["val/bayes_gap_ci_low"] <= row["val/bayes_gap"] <= row["val/bayes_gap_ci_high"]
    assert [r["step"] for r in rows if r["loss"] is not None] == [0, 3, 6, 9, 12]


def test_hparams_yaml_holds_the_composed_config(validated):
    out, record = validated
    hparams = yaml.safe_load((out / record["log_dir"] / "hparams.yaml").read_text())
    assert hparams["run_id"] == record["run_id"] and hparams["seed"] == 0
    assert hparams["task.name"] == "markov" and hparams["task.seq_len"] == 24
    assert hparams["model.name"] == "mamba"
    assert hparams["model.d_model"] == record["model"]["config"]["d_model"]
    assert hparams["trainer.val_every"] == 4 and hparams["trainer.max_steps"] == 14


def test_the_final_headline_reaches_the_log(validated):
    out, record = validated
    final = read_log(out / record["log_dir"] / "metrics.csv")[-1]
    metrics = record["metrics"]
    assert final["step"] == 14
    assert final["test/bayes_gap"] == metrics["bayes_gap"]
    assert [final["test/bayes_gap_ci_low"], final["test/bayes_gap_ci_high"]] == \
        metrics["bayes_gap_ci"]
    assert final["test/relative_gap"] == metrics["relative_gap"]
    assert final["test/loss"] == metrics["loss"]["model"]


def test_validation_changes_nothing_of_the_result(validated, tmp_path):
    _, with_validation = validated
    assert main(["run", f"out_dir={tmp_path}", *RUN, "trainer.logger=none"]) == 0
    (without,) = records(tmp_path)
    assert without["train"]["val_curve"] == []
    assert with_validation["metrics"] == without["metrics"]  # every float, bit for bit
    assert with_validation["per_position"] == without["per_position"]
    assert with_validation["train"]["loss_curve"] == without["train"]["loss_curve"]


def test_validation_scores_as_the_final_evaluation_does(tmp_path, monkeypatch):
    """Validating on the final evaluation's own sequences (the test stream, as many) at the last
    step gives the record's Bayes gap exactly: the same code scores both."""
    monkeypatch.setattr(bench.training.validation, "VAL_STREAM", TEST_STREAM)
    assert main(["run", f"out_dir={tmp_path}", *tiny("trainer.max_steps=6"),
                 "trainer.val_every=6", "trainer.val_sequences=32", "trainer.logger=none"]) == 0
    (record,) = records(tmp_path)
    assert record["train"]["val_curve"] == [[6, record["metrics"]["bayes_gap"]]]


def test_a_resumed_run_keeps_the_curve_up_to_its_checkpoint(validated, capsys):
    out, first = validated
    checkpoint = next(out.glob(f"checkpoints/{first['run_id']}/*step=8.ckpt"))
    assert main(["run", f"out_dir={out}", f"resume={checkpoint}", *RUN, *VALIDATED]) == 0
    capsys.readouterr()
    resumed = next(r for r in records(out) if r["run_id"] != first["run_id"])
    curve, before = resumed["train"]["val_curve"], first["train"]["val_curve"]
    assert [step for step, _ in curve] == VAL_STEPS
    assert curve[0] == before[0]  # step 4, from the checkpoint
    assert curve[1] == before[1]  # step 8 scored again, on the checkpoint's weights
    # 12 and 14 after the same batches
    assert [v for _, v in curve[2:]] == pytest.approx([v for _, v in before[2:]], rel=1e-5)
    rows = read_log(out / first["log_dir"] / "metrics.csv")
    val = [(r["step"], r["val/bayes_gap"]) for r in rows if r["val/bayes_gap"] is not None]
    assert val == [tuple(point) for point in curve]  # the log continued, each step once


def test_val_every_may_change_on_resume(validated, tmp_path, capsys):
    """val_every and val_sequences change how the run is watched, not what it trains."""
    out, first = validated
    checkpoint = next(out.glob(f"checkpoints/{first['run_id']}/*step=8.ckpt"))
    assert main(["run", f"out_dir={tmp_path}", f"resume={checkpoint}", *RUN, "trainer.val_every=3",
                 "trainer.val_sequences=8", "trainer.logger=none"]) == 0
    capsys.readouterr()
    (resumed,) = records(tmp_path)
    assert [step for step, _ in resumed["train"]["val_curve"]] == [4, 9, 12, 14]


@pytest.mark.parametrize("override,message", [
    ("trainer.val_every=-1", "trainer.val_every must be >= 0, got -1"),
    ("trainer.val_every=1.5", "trainer.val_every: invalid value 1.5"),
    ("trainer.val_every=often", "trainer.val_every: invalid value often"),
    ("trainer.val_sequences=0", "trainer.val_sequences must be >= 1, got 0")])
def test_a_bad_validation_setting_is_one_line_and_exit_2(override, message, tmp_path, capsys):
    assert main(["run", f"out_dir={tmp_path}", override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not any(tmp_path.iterdir())


def test_the_plot_draws_the_val_curve_with_what_it_holds(validated):
    from bench.reports.plot import runs_figure, validation_label
    _, record = validated
    figure = runs_figure([record])
    axes = figure.axes
    assert len(axes) == 3
    assert axes[1].get_ylabel().replace("\n", " ") == "validation gap to bayes (nats/token)"
    assert list(axes[1].lines[0].get_xdata()) == VAL_STEPS
    text = {"metrics": {"scoring": "perplexity", "gap_reference": None}}
    assert validation_label(text) == "validation loss (nats/token)"


def test_tensorboard_gets_the_val_and_final_tags_and_the_hparams(tmp_path):
    if importlib.util.find_spec("tensorboard") is None:
        pytest.skip("tensorboard is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    assert main(["run", f"out_dir={tmp_path}", *tiny("trainer.max_steps=8"), "trainer.val_every=4",
                 "trainer.val_sequences=16", "trainer.logger=tensorboard"]) == 0
    (record,) = records(tmp_path)
    events = EventAccumulator(str(tmp_path / record["log_dir"]))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss", "val/bayes_gap", "val/loss", "test/bayes_gap", "test/loss"} <= tags
    curve = record["train"]["val_curve"]
    logged = events.Scalars("val/bayes_gap")
    assert [e.step for e in logged] == [step for step, _ in curve] == [4, 8]
    assert [e.value for e in logged] == pytest.approx([v for _, v in curve], rel=1e-6)  # float32
    hparams = yaml.safe_load((tmp_path / record["log_dir"] / "hparams.yaml").read_text())
    assert hparams["task.name"] == "markov" and hparams["model.name"] == "mamba"
    # the HParams dashboard: the config and the final metrics declared together
    from tensorboard.plugins.hparams import plugin_data_pb2
    content = events.PluginTagToContent("hparams")
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(content)
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/experiment"]).experiment
    assert "test/bayes_gap" in {m.name.tag for m in experiment.metric_infos}
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["model.name"].string_value == "mamba"


def test_a_ddp_run_validates_on_rank_0_without_stalling_the_other(tmp_path):
    out = tmp_path / "runs"
    results = finish(launch_ranks(["run", "trainer.accelerator=cpu", "trainer.devices=2",
                                   "trainer.strategy=ddp", "trainer.max_steps=4",
                                   "trainer.val_every=2", "trainer.val_sequences=8",
                                   *RUN[:1], *RUN[2:6]], out), timeout=240)
    assert [code for code, _ in results] == [0, 0], [err[-2000:] for _, err in results]
    (record,) = records(out)
    assert record["train"]["world_size"] == 2
    assert [step for step, _ in record["train"]["val_curve"]] == [2, 4]
    rows = read_log(out / record["log_dir"] / "metrics.csv")
    assert [r["step"] for r in rows if r["val/bayes_gap"] is not None] == [2, 4]


def test_a_resumed_tensorboard_log_holds_each_step_once(tmp_path, capsys):
    """make_logger's purge_step: TensorBoard drops the first part's events from the
    checkpoint's step on, which the resumed run writes again."""
    if importlib.util.find_spec("tensorboard") is None:
        pytest.skip("tensorboard is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = [*tiny("trainer.max_steps=8"), "trainer.val_every=2", "trainer.val_sequences=8",
           "trainer.checkpoint_every=4", "trainer.logger=tensorboard"]
    assert main(["run", f"out_dir={tmp_path}", *run]) == 0
    (first,) = records(tmp_path)
    checkpoint = next(tmp_path.glob(f"checkpoints/{first['run_id']}/*step=4.ckpt"))
    assert main(["run", f"out_dir={tmp_path}", f"resume={checkpoint}", *run]) == 0
    capsys.readouterr()
    events = EventAccumulator(str(tmp_path / first["log_dir"]))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [0, 3, 6]
    assert [e.step for e in events.Scalars("val/bayes_gap")] == [2, 4, 6, 8]
    assert [e.step for e in events.Scalars("test/bayes_gap")] == [8]
