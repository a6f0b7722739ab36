"""The researcher's loop (issue 33): what a user running a sweep, a board or a comparison
expects of the suite beyond the numbers."""
from __future__ import annotations

import pytest

from bench.cli.main import main
from test_claims import MAMBA, put, record


@pytest.mark.parametrize("key, value", [("val_every", 100), ("val_sequences", 16)])
def test_a_key_that_changes_nothing_of_the_result_does_not_split_a_row(tmp_path, key, value):
    """Live validation is bit for bit neutral (tests/test_validation.py): a run watched every
    100 steps and one not watched are one row of two seeds."""
    watched = record([*MAMBA, f"trainer.{key}={value}"], seed=1, gap=0.0012)
    put(tmp_path / "results", record(MAMBA, seed=0), watched)
    board = tmp_path / "lb.md"
    assert main(["leaderboard", f"out_dir={tmp_path / 'results'}", f"out={board}"]) == 0
    rows = [line for line in board.read_text().splitlines() if line.startswith("| mamba")]
    assert len(rows) == 1 and "| 2 |" in rows[0] and key not in rows[0]


def plotted(tmp_path, *records) -> "object":
    from bench.reports.plot import runs_figure
    return runs_figure(list(records))


def test_the_plot_gives_each_task_its_section_with_units_and_groups_seeds(tmp_path):
    """Markov (nats/token) and LG-SSM (squared error) never share axes; seeds of one config are
    one curve with a band; labels say what differs (steps), not what all runs share."""
    import matplotlib.pyplot as plt
    from test_leaderboard import record as board_record
    curve = {"steps": 800, "wall_time_s": 1.0, "loss_curve": [[0, 0.7], [10, 0.6]]}
    markov = [board_record(seed=s, gap=0.1 + 0.01 * s, train=dict(curve)) for s in (0, 1, 2)]
    short = board_record(seed=0, gap=0.2, train={**curve, "steps": 100})
    lgssm = board_record(task="lgssm", model="transformer", train=dict(curve))
    lgssm["metrics"].pop("accuracy")  # a regression-type task: squared error
    lgssm["per_position"]["gap.erm"] = [500.0] * 8  # far off the models' scale
    fig = plotted(tmp_path, *markov, short, lgssm)
    try:
        rows = [[ax for ax in fig.axes if ax.get_visible() and ax.get_position().y0 == y]
                for y in sorted({ax.get_position().y0 for ax in fig.axes}, reverse=True)]
        labels = {ax.get_ylabel() for ax in fig.axes if ax.get_visible()}
        assert "training loss (nats/token)" in labels and "training loss (squared error)" in labels
        titles = [ax.get_title(loc="left") for ax in fig.axes if ax.get_title(loc="left")]
        assert sorted(t.split(" ")[0] for t in titles) == ["lgssm", "markov"]
        markov_axes = next(row for row in rows if row[0].get_title(loc="left").startswith("markov"))
        legend = [t.get_text() for t in markov_axes[0].get_legend().get_texts()]
        assert legend == ["mamba 100 steps (s0)", "mamba 800 steps (3 seeds)"]
        assert len(markov_axes[0].collections) == 1  # the band of the three seeds
        lgssm_axes = next(row for row in rows if row[0].get_title(loc="left").startswith("lgssm"))
        position, references = lgssm_axes[1], lgssm_axes[2]
        assert "erm" not in [t.get_text() for t in position.get_legend().get_texts()]
        assert "erm" in [t.get_text() for t in references.get_legend().get_texts()]
        assert references.get_yscale() == "symlog"
    finally:
        plt.close(fig)


def test_a_legend_lists_only_what_its_panel_draws(tmp_path):
    import matplotlib.pyplot as plt
    from test_leaderboard import record as board_record
    train = {"steps": 10, "wall_time_s": 1.0, "loss_curve": [[0, 0.7]]}
    watched = board_record(seed=0, model="mamba", train={**train, "val_curve": [[5, 0.1]]})
    unwatched = board_record(seed=0, model="transformer", train=dict(train))
    fig = plotted(tmp_path, watched, unwatched)
    try:
        validation = next(ax for ax in fig.axes if ax.get_ylabel().startswith("validation"))
        assert [t.get_text() for t in validation.get_legend().get_texts()] == ["mamba (s0)"]
    finally:
        plt.close(fig)


def test_trainer_ddp_switches_parallelism_and_nothing_else():
    from dataclasses import asdict
    from bench.config import compose
    default, ddp = (asdict(compose(args).trainer) for args in ([], ["trainer=ddp"]))
    changed = {key for key in default if default[key] != ddp[key]}
    assert changed == {"accelerator", "devices", "strategy"}
    assert (ddp["accelerator"], ddp["devices"], ddp["strategy"]) == ("gpu", -1, "ddp")


def test_a_board_row_names_the_trainer_preset_that_made_it(tmp_path):
    from test_leaderboard import record as board_record
    paper = board_record(seed=0)
    paper["trainer"]["name"] = "paper"
    put(tmp_path / "results", paper, board_record(seed=0, model="transformer"))
    board = tmp_path / "lb.md"
    assert main(["leaderboard", f"out_dir={tmp_path / 'results'}", f"out={board}"]) == 0
    rows = [line.split("|")[1].strip() for line in board.read_text().splitlines()
            if line.startswith(("| mamba", "| transformer"))]
    assert sorted(rows) == ["mamba (trainer=paper)", "transformer"]


SMALL = ["task=markov", "task.seq_len=16", "trainer.max_steps=2",
         "trainer.eval_sequences=16", "trainer.bootstrap=50", "trainer.progress=false",
         "trainer.threads=1"]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """Seeds 0 and 1 of a tiny Mamba, seed 0 of a tiny transformer, and an evaluation of the
    Mamba's seed-0 weights (newer than everything: the glob of README picked it up)."""
    import json
    out = tmp_path_factory.mktemp("two")
    for args in (["model=mamba", "seed=0"], ["model=mamba", "seed=1"],
                 ["model=transformer", "seed=0"]):
        assert main(["run", f"out_dir={out}", *SMALL, *args]) == 0
    weights = json.loads(next(out.glob("markov--mamba--s0--*.json")).read_text())["weights"]
    assert main(["eval", f"weights={out / weights}", f"out_dir={out}",
                 "trainer.eval_sequences=16", "trainer.bootstrap=50"]) == 0
    return out


def test_an_evaluation_is_named_as_one(two_models):
    evals = sorted(p.name for p in two_models.glob("*--eval--*.json"))
    assert len(evals) == 1 and evals[0].startswith("markov--mamba--s0--eval--")


def test_compare_by_selection_pairs_the_newest_training_runs_of_a_shared_seed(two_models,
                                                                             capsys):
    assert main(["compare", "task=markov", "task.seq_len=16", "model=mamba,transformer",
                 "trainer.max_steps=2", "trainer.eval_sequences=16",
                 "trainer.bootstrap=50", "trainer.threads=1", f"out_dir={two_models}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("A: mamba, seed 0") and "--eval--" not in out[0]
    assert out[1].startswith("B: transformer, seed 0")


@pytest.mark.parametrize("args, message", [
    (["model=mamba"], "needs one setting with the values compared"),
    (["model=mamba,transformer,lstm"], "no ok run record of model=lstm"),
    (["model=mamba,transformer,mamba"], "needs one setting with the values compared"),
    (["model=mamba,transformer", "seed=1"], "seed 1 has no record on both sides"),
    (["model=mamba,lstm"], "no ok run record of model=lstm"),
])
def test_compare_by_selection_says_what_it_cannot_find(two_models, capsys, args, message):
    shared = ["task=markov", "task.seq_len=16", "trainer.max_steps=2", "trainer.threads=1",
              "trainer.eval_sequences=16", "trainer.bootstrap=50", f"out_dir={two_models}"]
    assert main(["compare", *shared, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("model_ppl, says", [(40.0, "beaten (the intervals are apart)"),
                                             (50.0, "not beaten at this budget")])
def test_a_text_run_prints_its_weights_and_whether_it_beat_its_best_baseline(capsys, model_ppl,
                                                                           says):
    import math
    from bench.reports.report import print_run
    from test_leaderboard import record as board_record
    rec = board_record(task="pydoc", weights="weights/x.pt", wall_time_s=1.0,
                       train={"steps": 10, "wall_time_s": 1.0, "device": "cpu"})
    ppl = {"model": model_ppl, "bigram": 52.0, "unigram": 368.0}
    rec["metrics"] = {"scoring": "perplexity", "sequences": 64, "scored_positions": 1000,
                      "roles": {"bigram": "baseline", "unigram": "baseline"},
                      "loss": {n: math.log(p) for n, p in ppl.items()},
                      "perplexity": ppl,
                      "perplexity_ci": {n: [p * 0.95, p * 1.05] for n, p in ppl.items()},
                      "loss_ci": {n: [math.log(p * 0.95), math.log(p * 1.05)]
                                  for n, p in ppl.items()},
                      "bits_per_byte": {n: 1.0 for n in ppl}, "accuracy": {}}
    print_run(rec, "r.json")
    out = capsys.readouterr().out.splitlines()
    assert out[-3] == f"the best baseline, bigram: {says}" or out[-3].startswith(
        f"the best baseline, bigram: {says}")
    assert out[-2:] == ["weights: weights/x.pt (in out_dir)", "record: r.json"]


def test_a_sweep_ends_with_its_table_per_config(tmp_path, capsys):
    assert main(["sweep", "task=markov", "task.seq_len=16", "model=mamba,transformer",
                 "seed=0-1", *SMALL[2:], f"out_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("markov ("))
    header, *rows = out[start + 1:start + 4]
    assert header.split()[:3] == ["config", "seeds", "gap"]
    assert [row.split()[:3] for row in rows] == [["mamba", "(2", "seeds)"],
                                                 ["transformer", "(2", "seeds)"]]
    assert all("across seeds" in row for row in rows)
