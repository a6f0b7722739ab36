"""A researcher's daily loop (issue 20): sweeps expand comma lists and ranges to a grid run as a
suite is; suite files given by path; ad-hoc runs and sweeps write to runs/, suites to results/,
and what one kind of run writes never makes another skip a seed; progress goes to stderr;
`run print_config=true` shows the config and memory estimate without training."""
import json

import pytest
import yaml

import bench.records.store
import bench.training.train
from bench.cli.main import main
from bench.config import ConfigError, load_suite, suite_label
from bench.config.sweep import grid, split_top_level

TINY = ["task.seq_len=16", "trainer.max_steps=2", "trainer.warmup_steps=1",
        "trainer.eval_sequences=16", "trainer.bootstrap=50", "trainer.progress=false",
        "trainer.threads=1", "trainer.logger=none", "model.d_model=8", "model.headdim=16"]


def test_a_grid_is_the_product_of_its_lists_first_key_slowest():
    entries, shared = grid(["model=lstm,transformer", "task.seq_len=16,32,64", "seed=0-1",
                            "trainer.max_steps=2"])
    assert shared == ["trainer.max_steps=2"]
    assert len(entries) == 12 and len({tuple(e) for e in entries}) == 12
    assert entries[:3] == [["model=lstm", "task.seq_len=16", "seed=0"],
                           ["model=lstm", "task.seq_len=16", "seed=1"],
                           ["model=lstm", "task.seq_len=32", "seed=0"]]
    assert entries[-1] == ["model=transformer", "task.seq_len=64", "seed=1"]
    assert grid(["seed=0-2,7"])[0] == [["seed=0"], ["seed=1"], ["seed=2"], ["seed=7"]]
    assert grid(["task.order=1-3"])[0] == [["task.order=1"], ["task.order=2"], ["task.order=3"]]


@pytest.mark.parametrize("args,shared", [
    (["task=linreg", "task.gd_steps=[1,2]"], ["task=linreg", "task.gd_steps=[1,2]"]),
    (["task.eval_rho=-1"], ["task.eval_rho=-1"]),  # negative: a value, not a range
    (["trainer.lr=1e-3"], ["trainer.lr=1e-3"]),
    (["trainer.lr=1-3"], ["trainer.lr=1-3"]),  # a float field: composing refuses it, as written
    (["name=2024-05"], ["name=2024-05"]),
    (["out_dir=/tmp/a,b", "name=x,y"], ["out_dir=/tmp/a,b", "name=x,y"]),
    (["task.data_dir='/data/a,b'"], ["task.data_dir='/data/a,b'"]),
])
def test_values_that_are_not_lists_or_ranges_stay_whole(args, shared):
    assert grid([*args, "seed=0-1"]) == ([["seed=0"], ["seed=1"]], shared)
    with pytest.raises(ConfigError, match="nothing to sweep"):
        grid(args)


def test_commas_split_only_outside_brackets_and_quotes():
    assert split_top_level("[1,2],[1,5]") == ["[1,2]", "[1,5]"]
    assert split_top_level("a,'b,c'") == ["a", "'b,c'"]
    assert split_top_level("[1,2") is None and split_top_level("a]") is None
    assert grid(["task=linreg", "task.gd_steps=[1,2],[5]"])[0] == [
        ["task.gd_steps=[1,2]"], ["task.gd_steps=[5]"]]


@pytest.mark.parametrize("args,needle", [
    (["seed=3-1"], "a range lo-hi needs lo <= hi"),
    (["seed=0-100000"], "seed: more than 1000 values; a sweep has at most 1000 runs"),
    (["seed=" + ",".join(f"{i}-{i + 999}" for i in range(0, 10**6, 1000))], "more than 1000"),
    (["seed=0-99", "task.order=1-20"], "the sweep has 2000 runs (100 x 20); at most 1000"),
    (["seed=0,,1"], "an empty value in the list"),
    (["model=lstm,"], "an empty value in the list"),
    (["seed=0-2,1"], "the value 1 is listed twice"),
    (["seed=1", "seed=2"], "'seed' is given twice"),
    (["model=lstm,nope"], "entry 2 of the sweep (model=nope): unknown model 'nope'"),
    (["task=markov,hmm", "task.order=1,2"], "entry 3 of the sweep (task=hmm task.order=1): "
                                            "unknown key 'task.order'"),
    (["trainer.lr=1-3", "seed=0-1"],
     "entry 1 of the sweep (seed=0): trainer.lr: invalid value 1-3"),
    (["seed=0-1", "shard=2/2"], "shard must be i/n"),
    (["seed=0-1", "entries=3"], "not within 1-2"),
    (["seed=0-1", "rerun=maybe"], "rerun must be true or false"),
    (["orphan"], "expected key=value"),
    ([], "nothing to sweep"),
    (["seed=3", "task.gd_steps=[1,2]"], "nothing to sweep"),
])
def test_a_bad_sweep_is_one_line_exit_2_and_writes_nothing(args, needle, tmp_path, monkeypatch,
                                                           capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_sweep_has_help(capsys):
    assert main(["sweep", "--help"]) == 0
    assert capsys.readouterr().out.startswith("python -m bench sweep")


def test_shards_of_a_sweep_split_its_entries(tmp_path, monkeypatch, capsys):
    """shard=0/2 and shard=1/2 run disjoint halves that together are the grid (no training:
    the runner's call of a run is recorded instead)."""
    ran = []

    def fake_run(config, task=None, stop_signals=()):
        ran.append((config.model_name, config.task.seq_len, config.seed, config.origin))
        return {"metrics": {"bayes_gap": 0.0, "bayes_gap_ci": [0.0, 0.0]}, "wall_time_s": 0.0}, "x"

    monkeypatch.setattr(bench.training.train, "run", fake_run)
    monkeypatch.chdir(tmp_path)  # no records of an earlier sweep in runs/
    args = ["sweep", "model=lstm,transformer", "task.seq_len=16,32,64", "seed=0-1",
            "trainer.max_steps=2", "trainer.progress=false"]
    halves = []
    for shard in ("0/2", "1/2"):
        ran.clear()
        assert main([*args, f"shard={shard}"]) == 0
        halves.append(list(ran))
    out = capsys.readouterr().out
    assert "[1/12] model=lstm task.seq_len=16 seed=0 trainer.max_steps=2" in out
    assert len(halves[0]) == len(halves[1]) == 6 and not set(halves[0]) & set(halves[1])
    assert len(set(halves[0]) | set(halves[1])) == 12
    assert {origin for *_, origin in halves[0] + halves[1]} == {"sweep"}


def test_a_suite_file_given_by_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("runs:\n  - [seed=0, task.order=2]\n  - []\n")
    assert load_suite(str(path)) == [["seed=0", "task.order=2"], []]
    assert suite_label(str(path)) == str(path)
    from bench.config import CONF_DIR
    shipped = CONF_DIR / "papers" / "000" / "suites" / "paper000.yaml"
    assert suite_label(str(shipped)) == "paper000"  # what its records carry, by name or path
    assert load_suite(str(shipped)) == load_suite("paper000")
    assert suite_label(str(CONF_DIR / "suite" / "leaderboard.yaml")) == "leaderboard"


@pytest.mark.parametrize("text,needle", [
    (None, "does not exist"),
    ("runs: [[seed=0]\n", "is not valid YAML (line"),
    (b"runs:\n  - [name=\xff]\n", "is not UTF-8 text"),
    ("runs: []\n", "holds no runs"),
    ("- [seed=0]\n", "must hold `runs:`"),
    ("runs:\n  - seed=0\n", "entry 1 is 'seed=0'"),
    ("runs:\n  - [task.order: 2]\n", "entry 1: {'task.order': 2} is not key=value"),
    ("runs:\n  - [seed=0]\nseeds: 3\n", "unknown key 'seeds'"),
])
def test_a_bad_suite_file_is_one_line(text, needle, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_suite(str(path))
    assert needle in str(caught.value) and "\n" not in str(caught.value)
    assert main(["suite", f"name={path}"]) == 2
    assert needle in capsys.readouterr().err


def test_every_package_suite_passes_the_file_checks():
    from bench.config import choices
    assert {"leaderboard", "paper000", "paper002", "paper004"} <= set(choices("suite"))
    for name in choices("suite"):
        assert load_suite(name)


def test_two_suites_of_one_name_are_refused(tmp_path, monkeypatch):
    """A suite's name is what its records carry (origin suite:<name>): a paper's suite may not
    take the name of another suite."""
    import bench.config
    (tmp_path / "suite").mkdir()
    (tmp_path / "papers" / "000" / "suites").mkdir(parents=True)
    for path in (tmp_path / "suite" / "a.yaml", tmp_path / "papers/000/suites/a.yaml"):
        path.write_text("runs: [[seed=0]]\n")
    monkeypatch.setattr(bench.config.conf, "CONF_DIR", tmp_path)
    with pytest.raises(ConfigError, match="two suites named 'a': conf/suite/a.yaml and "
                                          "conf/papers/000/suites/a.yaml"):
        load_suite("a")


def test_what_a_run_of_one_kind_writes_never_makes_another_kind_skip(tmp_path, monkeypatch,
                                                                     capsys):
    """An ad-hoc run of seed 0 in the suite's out_dir does not finish the suite's seed 0 (boards
    count suite records only); the suite's own record does. A sweep's entry is finished by any
    record of its run: a suite's, an ad-hoc run's, its own. run, sweep and suite write to runs/
    by default (a suite publishes with out_dir=results); the progress bar goes to stderr."""
    version = {"commit": "a" * 40, "code": "c0de", "dirty": False, "version": None, "torch": "t"}
    monkeypatch.setattr(bench.records.store, "provenance", lambda: dict(version))  # a clean checkout
    monkeypatch.setattr(bench.training.train, "code_of_this_process", lambda: dict(version))
    monkeypatch.chdir(tmp_path)
    suite_file = tmp_path / "tiny.yaml"
    suite_file.write_text(yaml.safe_dump({"runs": [["seed=0", *TINY]]}))

    def records(folder: str) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted((tmp_path / folder).glob("*.json"))]

    # an ad-hoc run of the suite's config, seed 0, where the suite writes; progress on stderr
    progress = [a for a in TINY if a != "trainer.progress=false"] + ["trainer.progress=true"]
    assert main(["run", "seed=0", "out_dir=results", *progress]) == 0
    captured = capsys.readouterr()
    assert "Bayes gap" in captured.out and "\r" not in captured.out
    assert "Epoch 0" in captured.err
    assert [r["origin"] for r in records("results")] == ["adhoc"]

    assert main(["suite", f"name={suite_file}", "out_dir=results"]) == 0  # published
    out = capsys.readouterr().out
    assert out.startswith("[1/1] seed=0") and "done already" not in out
    assert sorted(r["origin"] for r in records("results")) == ["adhoc", f"suite:{suite_file}"]
    assert main(["suite", f"name={suite_file}", "out_dir=results"]) == 0
    assert "done already" in capsys.readouterr().out  # the skip works: the test can fail
    assert len(records("results")) == 2
    assert main(["suite", f"name={suite_file}"]) == 0  # by default into runs/, the tree clean
    assert "done already" not in capsys.readouterr().out
    assert [r["origin"] for r in records("runs")] == [f"suite:{suite_file}"]

    # a sweep of the same config: the suite's seed 0 finishes its seed 0, an ad-hoc run its
    # seed 2, and its own records all three when it is started again
    assert main(["run", "seed=2", *TINY]) == 0
    assert main(["sweep", "seed=0,1,2", *TINY]) == 0
    assert capsys.readouterr().out.count("done already") == 2
    assert sorted(r["origin"] for r in records("runs")) == sorted(
        ["adhoc", "sweep", f"suite:{suite_file}"])
    assert main(["sweep", "seed=0-2", *TINY]) == 0
    assert capsys.readouterr().out.count("done already") == 3 and len(records("runs")) == 3
    assert len(records("results")) == 2


def test_print_config_shows_the_run_and_its_memory_and_trains_nothing(tmp_path, monkeypatch,
                                                                     capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "print_config=true", "model=transformer", "task.order=2"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["model"]["name"] == "transformer" and shown["task"]["config"]["order"] == 2
    assert shown["out_dir"] == "runs" and shown["trainer"]["config"]["max_steps"] == 800
    host = shown["memory_estimate"]["host"]
    assert shown["memory_estimate"]["parameters"] > 0
    assert 0 < host["training_gib"] and 0 < host["evaluation_gib"] < host["free_gib"]
    assert list(tmp_path.iterdir()) == []
    assert main(["run", "print_config=yes"]) == 2
    assert "print_config must be true or false" in capsys.readouterr().err
    assert main(["run", "print_config=true", "task.order=30"]) == 2  # the checks still apply
    assert "GiB" in capsys.readouterr().err
