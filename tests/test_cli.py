"""The command line end to end: a run writes a record, the leaderboard is rebuilt from records,
and bad inputs end with one line and exit code 2."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.cli.main import main
from bench.records.store import SCHEMA, THREAD_WAIT_KEYS

REPO = Path(__file__).resolve().parents[1]
TINY = ["task.seq_len=24", "trainer.max_steps=4", "trainer.warmup_steps=2",
        "trainer.eval_sequences=32", "trainer.bootstrap=200", "trainer.progress=false"]


def bench(*args, cwd=REPO):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def test_run_writes_a_record_and_the_leaderboard_is_regenerated(tmp_path, capsys):
    """The first run in a process of its own (its start-up is measured), the second in this
    one."""
    out = tmp_path / "results"
    done = bench("run", "task=markov", "model=mamba", f"out_dir={out}", "seed=3", *TINY,
                 "model.d_model=8", "model.headdim=16")
    assert done.returncode == 0, done.stderr[-2000:]
    assert main(["run", "task=markov", "model=transformer", f"out_dir={out}", "seed=3", *TINY,
                 "model.n_layers=1"]) == 0
    for printed in (done.stdout, capsys.readouterr().out):
        assert "Bayes gap" in printed and "record:" in printed
    records = sorted(out.glob("*.json"))
    assert len(records) == 2
    record = json.loads(records[0].read_text())
    assert record["schema"] == SCHEMA and record["status"] == "ok" and record["seed"] == 3
    umask = os.umask(0)
    os.umask(umask)
    assert all(p.stat().st_mode & 0o777 == 0o666 & ~umask for p in records)  # not mkstemp's 0600
    for key in ("task", "model", "params", "state_size", "train", "metrics", "per_position"):
        assert key in record
    assert record["task"]["name"] == "markov" and record["task"]["config"]["seq_len"] == 24
    assert record["train"]["steps"] == 4 and record["train"]["wall_time_s"] > 0
    # where the time before training went: the process's start to the run (imports, checks),
    # then inside the run's own clock, the first batch included
    startup = record["startup_s"]
    assert set(startup) == {"before_run", "to_fit", "to_train", "first_batch"}
    assert startup["before_run"] > 0.5  # torch and Lightning alone take longer to import
    assert all(startup[k] >= 0 for k in ("to_fit", "to_train", "first_batch"))
    assert sum(startup[k] for k in ("to_fit", "to_train", "first_batch")) \
        <= record["train"]["wall_time_s"]
    m = record["metrics"]
    assert set(m["loss"]) == {"model", "bayes", "clairvoyant", "unigram"}
    lo, hi = m["bayes_gap_ci"]
    assert lo <= m["bayes_gap"] <= hi
    assert m["bayes_gap"] == pytest.approx(m["loss"]["model"] - m["loss"]["bayes"], abs=1e-12)
    assert len(record["per_position"]["gap.model"]) == 24

    board = tmp_path / "leaderboard.md"
    assert main(["leaderboard", f"out_dir={out}", f"out={board}", "include=all"]) == 0  # ad hoc
    text = board.read_text()
    assert "## markov" in text and "| mamba" in text and "| transformer" in text
    figure = next((out / "figures").glob("markov-*.png"))
    assert f"({os.path.relpath(figure, tmp_path)})" in text


def test_list_names_every_task_and_model(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert "markov" in text and "mamba" in text and "transformer" in text


def test_list_shows_no_preset_cut_mid_sentence(capsys):
    """`list` shows a file's first comment line: a line that goes on in the next (the ddp
    preset's ended "the other settings are the") reads as a cut."""
    from bench.config import choices, describe_choice
    dangling = ("the", "a", "an", "of", "to", "and", "or", "in", "on", "for", "with", "are", "is")
    for group in ("task", "model", "trainer"):
        for name in choices(group):
            words = describe_choice(group, name).rstrip(",;:").split()
            assert not words or words[-1].lower() not in dangling, (group, name, words[-3:])


def test_list_describes_a_file_without_a_comment_by_its_family(tmp_path, monkeypatch):
    """The first comment line of a conf file, else its family's `description` (a user's own
    preset, or an empty file, which made `bench list` fail with an IndexError)."""
    import bench.config
    from models import model_families
    from tasks import task_families
    for group in ("task", "model", "trainer"):
        (tmp_path / group).mkdir()
    (tmp_path / "task" / "mine.yaml").write_text("family: markov\norder: 2\n")
    (tmp_path / "task" / "markov.yaml").write_text("")
    (tmp_path / "model" / "mine.yaml").write_text("# my own\nfamily: lstm\n")
    (tmp_path / "trainer" / "mine.yaml").write_text("max_steps: 5\n")
    monkeypatch.setattr(bench.config.conf, "CONF_DIR", tmp_path)
    described = bench.config.describe_choice
    assert described("task", "mine") == task_families()["markov"].description
    assert described("task", "markov") == task_families()["markov"].description
    assert described("model", "mine") == "my own"
    assert described("trainer", "mine") == ""
    assert model_families()["lstm"].description  # what a model file without a comment shows



def test_a_composed_config_is_the_callers_own_and_an_edited_file_is_read_again(tmp_path,
                                                                                monkeypatch):
    """compose reuses what the same file text and overrides gave before (claims and suites
    compose hundreds of runs): the caller still gets its own dataclasses, and an edited conf file
    composes to its new values."""
    import shutil
    import bench.config
    from bench.config import compose
    first = compose(["model=mamba", "model.n_layers=2"])
    first.model.d_model, first.trainer.max_steps = 999, 1
    again = compose(["model=mamba", "model.n_layers=2"])
    assert (again.model.d_model, again.model.n_layers) == (16, 2)
    assert again.trainer.max_steps != 1
    shutil.copytree(bench.config.conf.CONF_DIR, tmp_path / "conf")
    monkeypatch.setattr(bench.config.conf, "CONF_DIR", tmp_path / "conf")
    path = tmp_path / "conf" / "model" / "mamba.yaml"
    path.write_text(path.read_text().replace("d_model: 16", "d_model: 32"))
    assert compose(["model=mamba", "model.n_layers=2"]).model.d_model == 32

@pytest.mark.parametrize("args,needle", [
    (["run", "task=nope"], "unknown task 'nope'; choose one of:"),
    (["run", "model=nope"], "unknown model 'nope'; choose one of:"),
    (["run", "task.nope=1"], "unknown key 'task.nope'"),
    (["run", "task.order=abc"], "task.order: invalid value abc"),
    (["run", "trainer.lr=fast"], "trainer.lr: invalid value fast"),
    (["run", "task.beta=-1"], "beta > 0"),
    (["run", "bogus=1"], "unknown key 'bogus'"),
    (["run", "seed=x"], "seed: invalid value"),
    (["run", "orphan"], "expected key=value"),
    (["frobnicate"], "unknown command 'frobnicate'"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_bad_input_exit_code_from_the_shell():
    done = bench("run", "task=nope")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_suite_entries_are_valid_and_a_bad_shard_exits_2(capsys):
    from bench.training.checks import compose_checked
    from bench.config import load_suite
    for entry in load_suite("leaderboard"):
        compose_checked(entry)
    assert main(["suite", "name=leaderboard", "shard=2/2"]) == 2
    assert "shard must be i/n" in capsys.readouterr().err
    size = len(load_suite("leaderboard"))
    for bad, needle in ((f"1-{size + 1}", f"not within 1-{size}"), ("0", "not within"),
                        ("3,x", "entries must be numbers and ranges")):
        assert main(["suite", "name=leaderboard", f"entries={bad}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert main(["suite", "name=leaderboard", "entries=2", "shard=1/2"]) == 2  # one entry only
    assert "holds no run" in capsys.readouterr().err


def test_entry_numbers_are_sorted_and_unique():
    from bench.config import entry_numbers
    assert entry_numbers("5,1-3,2", 6) == [1, 2, 3, 5]


def test_resuming_from_a_checkpoint_reproduces_the_uninterrupted_run(tmp_path, capsys):
    """Training batches depend only on (seed, rank, step), so a run resumed at step 10 sees the
    same batches as one that never stopped and ends with the same held-out loss. (In this
    process: a run started afresh is tested above, and each process costs seconds of imports.)"""
    common = [f"out_dir={tmp_path}", "trainer.checkpoint_every=10", "trainer.max_steps=20",
              *[a for a in TINY if not a.startswith("trainer.max_steps")]]
    assert main(["run", *common]) == 0
    first = next(tmp_path.glob("*.json"))
    checkpoint = next(tmp_path.glob("checkpoints/*/*step=10.ckpt"))
    assert main(["run", *common, f"resume={checkpoint}"]) == 0, capsys.readouterr().err[-2000:]
    resumed = next(p for p in tmp_path.glob("*.json") if p != first)
    a, b = (json.loads(p.read_text()) for p in (first, resumed))
    assert b["train"]["steps"] == 20
    assert b["metrics"]["loss"]["model"] == pytest.approx(a["metrics"]["loss"]["model"], rel=1e-6)


@pytest.mark.parametrize("given,expected", [
    ({}, {"GOMP_SPINCOUNT": "1000", "KMP_BLOCKTIME": "0"}),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "PASSIVE"}),
    ({"GOMP_SPINCOUNT": "50"}, {"GOMP_SPINCOUNT": "50"})])
def test_threads_spin_briefly_unless_the_user_says_otherwise(given, expected):
    """The CLI sets a short spin for torch's OpenMP threads before torch loads (alone nearly as
    fast as spinning, beside another run a quarter slower rather than 5x: bench/cli/openmp.py);
    a wait the user set is kept as it is. Importing bench (and bench.cli.main, as `python -m
    bench` does before main) changes no environment and loads no torch: the runtime reads the
    setting when torch loads, which a run's main does after setting it. The probe stops main
    there: loading torch would cost seconds and show nothing more."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_WAIT_KEYS}
    env.update(given)
    env["PYTHONPATH"] = str(REPO)
    probe = textwrap.dedent(f"""
        import json, os, sys
        before = dict(os.environ)
        import bench, bench.cli.main
        assert dict(os.environ) == before, "importing bench changed the environment"
        assert "torch" not in sys.modules, "importing bench loaded torch"
        seen = []

        class TorchLoads(BaseException):
            pass

        class Spy:  # the wait as the first import of torch finds it
            def find_spec(self, name, path=None, target=None):
                if name == "torch":
                    seen.append({{k: os.environ[k] for k in {THREAD_WAIT_KEYS!r} if k in os.environ}})
                    raise TorchLoads

        sys.meta_path.insert(0, Spy())
        try:
            bench.cli.main.main(["run", "print_config=true", "trainer.max_steps=1"])
        except TorchLoads:
            print("wait:", json.dumps(seen[0]))""")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("wait: "), done.stdout[-2000:]
    assert json.loads(last[len("wait: "):]) == expected


def test_references_prints_each_reference_with_what_it_computes(tmp_path, monkeypatch, capsys):
    from tasks.markov import MarkovTask
    monkeypatch.chdir(tmp_path)  # its reference cache goes to runs/ here
    assert main(["references", "task=markov", "n=16", "trainer.progress=false"]) == 0
    out = capsys.readouterr().out
    for name, reference in MarkovTask().references().items():
        assert f"  {name:<20} {reference.description}\n" in out


@pytest.mark.parametrize("argv", [
    ["run", "model.nokey=3"], ["run", "task=nope"], ["run", "task=markov", "task.order=x"],
    ["references", "trainer.nope=1"], ["sweep", "model=mamba,nope"],
    ["suite", "name=paper002", "task.nope=1"], ["list"], ["--help"]])
def test_a_mistyped_command_line_is_answered_without_torch(argv):
    """A typo is answered before torch, Lightning or a family's module loads (tasks/configs.py,
    models/configs.py): a fraction of a second instead of seconds."""
    probe = textwrap.dedent(f"""
        import sys
        import bench.cli.main
        code = bench.cli.main.main({argv!r})
        heavy = sorted(m for m in ("torch", "lightning", "tasks.base", "models.backbone")
                       if m in sys.modules)
        print("loaded:", code, heavy)""")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, timeout=120)
    last = done.stdout.strip().splitlines()[-1]
    assert last in ("loaded: 2 []", "loaded: 0 []"), (last, done.stderr[-1000:])


def test_print_config_estimates_memory_without_lightning_or_dynamo():
    """`run print_config=true` composes, checks and measures the model's passes with torch
    alone: Lightning's import (4 s) and Dynamo's (1.1 s, which entering a dispatch mode whose own
    __torch_dispatch__ TorchDispatchMode wrapped would cost) are for runs that train."""
    probe = textwrap.dedent("""
        import sys
        import bench.cli.main
        code = bench.cli.main.main(["run", "print_config=true"])
        print("loaded:", code, sorted(m for m in ("lightning", "torch._dynamo", "torch")
                                      if m in sys.modules))""")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, timeout=120)
    assert "memory_estimate:" in done.stdout, done.stderr[-1000:]
    assert done.stdout.strip().splitlines()[-1] == "loaded: 0 ['torch']", done.stderr[-1000:]


def test_the_reports_read_records_without_lightning(tmp_path):
    """plot and compare load torch only for what needs it (compare's bootstrap), never
    Lightning or the task families: their imports are the CLI's, matplotlib's and torch's."""
    records = sorted((REPO / "results").glob("markov--mamba--s0--*.json"))[:1]
    probe = textwrap.dedent(f"""
        import sys
        import bench.cli.main
        code = bench.cli.main.main(["plot", {str(records[0])!r}, "out={tmp_path / 'p.png'}"])
        print("loaded:", code, sorted(m for m in ("lightning", "tasks.base", "torch")
                                      if m in sys.modules))""")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "loaded: 0 []", done.stderr[-1000:]


def test_the_console_script_is_the_command_line():
    """`icl-bench` (pyproject's [project.scripts], installed with the package) answers as
    `python -m bench` does."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    # the script of the interpreter running the tests before one elsewhere on PATH (another
    # Python's install of another checkout)
    beside = Path(sys.executable).parent / "icl-bench"
    script = str(beside) if beside.exists() else shutil.which("icl-bench")
    if script is None:
        pytest.skip("the package is not installed with its scripts here")
    done = subprocess.run([script, "list"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "tasks" in done.stdout.lower()
    wrong = subprocess.run([script, "nonsense"], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1
