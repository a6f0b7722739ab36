"""What runs cost, read off records (bench/reports/costs.py), and `suite ... plan=true`, which
prices a suite's runs before they run and trains nothing."""
import json
import os
import re

import pytest
import yaml

import bench.records.store
import bench.training.train
from bench.cli.main import main
from bench.config import compose
from bench.reports.costs import launcher_wall, price, references_price, run_time

TINY = ["task.seq_len=16", "trainer.max_steps=2", "trainer.warmup_steps=1",
        "trainer.eval_sequences=16", "trainer.bootstrap=50", "trainer.progress=false",
        "trainer.threads=1", "trainer.logger=none", "model.d_model=8", "model.headdim=16"]


def record(overrides: list[str], wall: float, stamp: str = "20261129-120000", threads: int = 1,
           device: str = "cpu") -> dict:
    """A record of the run that overrides compose, as `run` describes it."""
    config = compose(overrides)
    return {**config.describe(), "status": "ok", "wall_time_s": wall,
            "run_id": f"{config.task_name}--{config.model_name}--s{config.seed}--{stamp}-abcdef",
            "train": {"device": device, "threads": threads, "kernel": "torch",
                      "precision": config.trainer.precision}}


def test_a_run_is_priced_from_the_closest_records_first():
    config = compose(["trainer.max_steps=100", "seed=0"])
    own_old = record(["trainer.max_steps=100", "seed=0"], 50.0, "20261120-100000")
    own_new = record(["trainer.max_steps=100", "seed=0"], 60.0, "20261128-100000")
    seeds = [record(["trainer.max_steps=100", f"seed={s}"], w) for s, w in ((1, 40.0), (2, 80.0),
                                                                             (3, 70.0))]
    longer = record(["trainer.max_steps=200"], 100.0)  # its model config: 0.5 s a step
    wider = record(["model.d_model=32", "trainer.max_steps=100"], 1000.0)  # 10 s a step
    other_model = record(["model=transformer", "trainer.max_steps=100"], 9.0)
    on_a_gpu = record(["trainer.max_steps=100", "seed=0"], 1.0, device="cuda")

    found = price(config, [own_old, own_new, *seeds, longer, other_model, on_a_gpu], "cpu")
    assert (found.seconds, found.source) == (60.0, "its own record of 2026-11-28")  # the newest
    found = price(config, [*seeds, longer, other_model, on_a_gpu], "cpu")
    assert (found.seconds, found.source) == (70.0, "its config's other seeds (3)")  # the median
    found = price(config, [longer, wider, other_model, on_a_gpu], "cpu")
    assert found.seconds == pytest.approx(50.0)
    assert found.source == "this task and model config's time a step (1 record)"
    found = price(config, [wider, other_model, on_a_gpu], "cpu")  # any config of markov mamba
    assert (found.seconds, found.source) == (1000.0, "markov mamba's time a step (1 record)")
    found = price(config, [other_model, on_a_gpu], "cpu")
    assert found.seconds is None and "no record of markov mamba on cpu" in found.source
    assert price(config, [on_a_gpu], "cuda").seconds == 1.0  # a GPU run from GPU records


def computed(rec: dict, seconds: float | None, sequences: int = 512) -> dict:
    """rec as a run that computed its references in `seconds` (None: read them from the cache)."""
    rec["eval"] = {"references_cached": seconds is None,
                   "time_s": {"references": seconds if seconds is not None else 1e-5}}
    rec["metrics"] = {"sequences": sequences}
    return rec


def test_a_price_leaves_out_the_references_a_record_computed_and_prices_them_apart():
    """A held-out set's first run computes its references for the others: its price is its wall
    time less them, and references_price gives them from the records that computed them (the
    median time a sequence, times the run's sequences), of its task config on its device only."""
    config = compose(["task=lgssm", "trainer.max_steps=100", "trainer.eval_sequences=1024"])
    first = computed(record(["task=lgssm", "trainer.max_steps=100"], 100.0), 60.0)
    after = computed(record(["task=lgssm", "trainer.max_steps=100", "seed=1"], 41.0), None)
    older = record(["task=lgssm", "trainer.max_steps=100", "seed=2"], 70.0)  # says nothing
    assert (run_time(first), run_time(after), run_time(older)) == (40.0, 41.0, 70.0)
    assert price(config, [first], "cpu").seconds == 40.0
    assert price(config, [first, after, older], "cpu").seconds == 41.0  # the seeds' median
    other_seed = computed(record(["task=lgssm", "trainer.max_steps=800", "seed=3"], 90.0), 30.0)
    other_config = computed(record(["task=lgssm", "task.seq_len=64"], 10.0), 9.0)
    on_a_gpu = computed(record(["task=lgssm"], 10.0, device="cuda"), 1.0)
    found = references_price(config, [first, after, older, other_seed, other_config, on_a_gpu],
                             "cpu")
    assert found.seconds == pytest.approx((60.0 + 30.0) / 2 / 512 * 1024)
    assert found.source == "2 records that computed them, scaled to 1024 sequences"
    found = references_price(config, [after, older, other_config], "cpu")
    assert found.seconds is None and found.source == ("no record of lgssm that computed its "
                                                      "references")


def test_records_of_the_planned_thread_count_come_first_where_there_are_any():
    config = compose(["trainer.max_steps=100"])
    one = record(["trainer.max_steps=100"], 60.0, "20261120-100000", threads=1)
    two = record(["trainer.max_steps=100"], 35.0, "20261128-100000", threads=2)
    assert price(config, [one, two], "cpu", threads_wanted=1).seconds == 60.0
    assert price(config, [one, two], "cpu", threads_wanted=2).seconds == 35.0
    assert price(config, [one, two], "cpu", threads_wanted=4).seconds == 35.0  # none: the newest
    assert price(config, [one, two], "cpu", threads_wanted=2).threads == {2}


def test_the_launchers_wall_time_follows_how_its_workers_take_entries():
    assert launcher_wall([], 2) == 0.0
    assert launcher_wall([3.0, 4.0, 5.0], 1) == 12.0
    assert launcher_wall([5.0] * 4, 2) == 10.0
    assert launcher_wall([5.0] * 3, 8) == 5.0  # idle workers add nothing
    # worker 0 starts at entry 0 (10 s); worker 1 at entry 2, then 3, then wraps round to 1
    assert launcher_wall([10.0, 1.0, 1.0, 1.0], 2) == 10.0
    # worker 1 starts at entry 2 of 4: entries 2 and 3 are its, entry 1 worker 0's after entry 0
    assert launcher_wall([1.0, 6.0, 2.0, 2.0], 2) == 7.0
    assert launcher_wall([0.0, 0.0, 3.0], 2) == 3.0  # finished entries cost nothing


def test_suite_plan_prices_the_runs_left_and_trains_nothing(tmp_path, monkeypatch, capsys):
    """Entry 1 has its record (done); entry 2 is priced from entry 1's record (its config's
    other seed), entry 3 from the task and model's time a step; nothing is written."""
    version = {"commit": "a" * 40, "code": "c0de", "dirty": False, "version": None, "torch": "t"}
    monkeypatch.setattr(bench.records.store, "provenance", lambda: dict(version))  # clean checkout
    four_steps = [a for a in TINY if not a.startswith("trainer.max_steps=")] + \
        ["trainer.max_steps=4"]
    monkeypatch.setattr(bench.training.train, "code_of_this_process", lambda: dict(version))
    monkeypatch.chdir(tmp_path)
    suite = tmp_path / "tiny.yaml"
    suite.write_text(yaml.safe_dump({"runs": [["seed=0", *TINY], ["seed=1", *TINY],
                                              ["seed=0", *four_steps]]}))
    assert main(["suite", f"name={suite}", "entries=1"]) == 0
    capsys.readouterr()
    made = sorted((tmp_path / "runs").glob("*.json"))
    wall = json.loads(made[0].read_text())["wall_time_s"]

    assert main(["suite", f"name={suite}", "plan=true", "workers=2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"plan of suite {suite}: 3 runs; records read from runs")
    day = json.loads(made[0].read_text())["run_id"].split("--")[3][:8]  # YYYYMMDD
    assert f"  done: 1, whose records (made {day[:4]}-{day[4:6]}-{day[6:]}) took" in out
    assert "  to run: 2" in out
    second, third = [line for line in out.splitlines() if line.startswith("    [")]
    assert second.startswith("    [2/3]") and second.endswith("(its config's other seeds (1))")
    assert f"{wall:.0f} s" in second
    assert third.startswith("    [3/3]") and "model config's time a step (1 record)" in third
    assert f"{wall / 2 * 4:.0f} s" in third  # its 4 steps at the record's time a step
    assert "at workers=2: about" in out
    assert sorted((tmp_path / "runs").glob("*.json")) == made  # trained nothing

    more_than_cores = f"workers={len(os.sched_getaffinity(0)) + 1}"
    for refused in ("launcher=slurm", more_than_cores):  # the launcher refuses these too
        assert main(["suite", f"name={suite}", "plan=true", refused]) == 2
        assert capsys.readouterr().err.count("\n") == 1


def test_the_plan_prices_the_references_a_run_would_compute(tmp_path, monkeypatch, capsys):
    """After entry 1 cached its held-out set's references in out_dir: a run of another held-out
    set (more sequences) computes them, priced from entry 1's record and scaled, and the next run
    of that set reads them; a run without the cache computes its own."""
    monkeypatch.chdir(tmp_path)
    more = [a for a in TINY if not a.startswith("trainer.eval_sequences=")] + \
        ["trainer.eval_sequences=32"]
    suite = tmp_path / "tiny.yaml"
    suite.write_text(yaml.safe_dump({"runs": [
        ["seed=0", *TINY], ["seed=1", *TINY], ["seed=0", *more], ["seed=1", *more],
        ["seed=2", *TINY, "trainer.reference_cache=false"]]}))
    assert main(["suite", f"name={suite}", "entries=1"]) == 0
    capsys.readouterr()
    [made] = (tmp_path / "runs").glob("*.json")
    spent = json.loads(made.read_text())["eval"]["time_s"]["references"]
    assert main(["suite", f"name={suite}", "entries=2-5", "plan=true"]) == 0
    lines = capsys.readouterr().out.splitlines()
    said = [i for i, line in enumerate(lines) if "its held-out set's references" in line]
    assert [lines[i - 1].split("]")[0].strip() for i in said] == ["[3/5", "[5/5"]
    assert lines[said[0]].endswith("(1 record that computed them, scaled to 32 sequences)")
    assert f"not cached in runs: {spent * 2:.0f} s of it" in lines[said[0]]
    assert "references, trainer.reference_cache=false: " in lines[said[1]]


def test_plan_measures_the_step_here_once_a_setup_when_asked(tmp_path, monkeypatch, capsys):
    """measure=true: each run's steps times the bare step measured now (one measurement for two
    seeds of one setup, another for another width), beside the records' prices; measure=true
    without plan=true is refused in one line."""
    import bench.perf.speed
    monkeypatch.chdir(tmp_path)
    timed = []

    def time_training(config, device, steps):
        timed.append(config.model.d_model)
        return {"step_s": 30.0 if config.model.d_model == 8 else 120.0}
    monkeypatch.setattr(bench.perf.speed, "time_training", time_training)
    wider = [a for a in TINY if a != "model.d_model=8"] + ["model.d_model=16"]
    suite = tmp_path / "tiny.yaml"
    suite.write_text(yaml.safe_dump({"runs": [["seed=0", *TINY], ["seed=1", *TINY],
                                              ["seed=0", *wider]]}))
    assert main(["suite", f"name={suite}", "plan=true", "measure=true", "workers=1"]) == 0
    out = capsys.readouterr().out
    assert timed == [8, 16]
    lines = [line for line in out.splitlines() if line.startswith("    [")]
    assert [re.search(r" now +(\d+ \w+) ", line)[1] for line in lines] == ["60 s", "60 s",
                                                                           "4 min"]
    assert "measured here now (2 setups, bare steps" in out and ": 6 min of training, about " \
        "6 min of wall time at workers=1" in out
    assert main(["suite", f"name={suite}", "measure=true"]) == 2
    assert capsys.readouterr().err.strip().endswith("give plan=true too")


def test_prices_read_only_the_runs_of_their_task_and_model(tmp_path):
    """entry_prices reads the records of its configs' task and model pairs: every level of a
    price asks for those, so the prices of the published records are the same as from all of
    them; a file named as a run of another pair is not even opened, and one named otherwise is
    read."""
    import shutil
    from pathlib import Path

    from bench.cli.suites import entry_prices
    from bench.records.store import read_records
    published = tmp_path / "published"
    published.mkdir()
    for pair in ("markov--mamba--", "lgssm--transformer--", "markov--transformer--", "linreg--"):
        for path in sorted((Path(__file__).parents[1] / "results").glob(f"{pair}*.json"))[:4]:
            shutil.copy(path, published)
    configs = [compose(["trainer.max_steps=100", "seed=77"]),
               compose(["task=lgssm", "model=transformer", "trainer.max_steps=100"])]
    every = [r for r in read_records(published)[0] if r.get("status") == "ok"]
    assert len(every) == 16
    assert entry_prices(configs, 1, [str(published)])[0] == [price(c, every, "cpu", 1)
                                                              for c in configs]
    (tmp_path / "markov--mamba--s0--20261129-120000-abcdef.json").write_text("{")
    (tmp_path / "linreg--gd_ssm--s0--20261129-120000-abcdef.json").write_text("{")
    (tmp_path / "renamed--by-hand.json").write_text("{")  # not named as a run: whose, it says
    found, bad = read_records(tmp_path, {("markov", "mamba"), ("markov", "mamba_lm14m")})
    assert found == [] and [path.split("/")[-1] for path, _ in bad] == [
        "markov--mamba--s0--20261129-120000-abcdef.json", "renamed--by-hand.json"]
