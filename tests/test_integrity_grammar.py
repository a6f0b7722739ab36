"""The override grammar is closed, and suite files, the sweep's entries=, claims rules files,
gpucheck's options and path options are checked like the rest: every malformed input ends with
one `error:` line naming what is wrong and exit code 2, before anything is composed or runs.

In-process cases patch the runners to fail the test if a run would start (nothing trains); the
cases of the issue as given also run from the shell (`python -m bench ...`)."""
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

import bench.cli.main as cli
from bench.perf.gpucheck import driver as gpucheck_driver
from bench.cli import suites
from bench.reports.claims import load_claims
from bench.config import (MAX_RUNS, ConfigError, check_path, compose, load_suite,
                          load_yaml_text)
from bench.config.sweep import grid
from bench.training.weights import WEIGHTS_FORMAT

REPO = Path(__file__).resolve().parents[1]
LONG_PATH = "/tmp/" + "/".join(["a" * 200] * 25)  # 25 names of 200 bytes: over PATH_MAX
PAPER000 = REPO / "conf" / "papers" / "000" / "claims.yaml"

# (override, a fragment of the one error line): every value form that was an internal error
# (ParserError, ScannerError, ReaderError, InterpolationKeyError, ValueError, exit 1), was taken
# as something other than what was written (exit 0), or was refused with a message naming `?`.
GRAMMAR = [
    ("task.gd_steps=[1,2", "malformed value"),
    ("task.order={a", "malformed value"),
    ("task.order='abc", "malformed value"),
    ('task.order="abc', "malformed value"),
    ("task.gd_steps=]1,2[", "malformed value"),
    ("task.gd_steps=[1,[2]", "malformed value"),
    ("task.order=[1,2]]", "malformed value"),
    ("task.order=[", "malformed value"),
    ("task.order={", "malformed value"),
    ("task.order=]", "malformed value"),
    ("task.order=}", "malformed value"),
    ("task.order='", "malformed value"),
    ('task.order="', "malformed value"),
    ("task.order=@x", "malformed value"),
    ("task.order=`x", "malformed value"),
    ("task.order=%YAML 1.1", "malformed value"),
    ("task.order=...", "malformed value"),
    ("trainer.bootstrap=[1e-3", "malformed value"),
    ("trainer.progress='true", "malformed value"),
    ("task.order=${foo}", "an interpolation"),
    ("task.order=${task.seq_len}", "an interpolation"),
    ("task.seq_len=${oc.env:HOME}", "an interpolation"),  # read the environment
    ("task.order=!!python/object:os.system", "a YAML tag"),
    ("task.order=!!binary AAAA", "a YAML tag"),
    ("task.order=*a", "a YAML alias"),
    ("task.order=&a 1", "a YAML anchor"),  # was taken as 1
    ("task.order=---", "a YAML document marker"),
    ("task.order=1 # a comment", "is a YAML comment"),  # was taken as 1
    ("task.order=\uff11", "is not a digit 0-9"),  # a fullwidth 1: int() reads it as 1
    ("task.order=" + "1" * 5000, "a number of 5000 digits"),
    ("task.order=1\x00", "control character U+0000"),
    ("task.order=1\n2", "control character U+000A"),
    ("task.order=\t1", "control character U+0009"),
    ("task.order=\udcff", "is not UTF-8 text"),  # an undecodable byte, as the shell passes it
    ("task.order[0]=1", "unknown key 'task.order[0]'"),  # was "invalid value ?"
    ("task.order.x=1", "unknown key 'task.order.x'"),
]


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    return lines[0]


@pytest.fixture
def nothing_runs(monkeypatch, tmp_path):
    """A command that would start training or a gpucheck section fails the test instead; the
    working directory is an empty folder (the default out_dir lands there)."""
    import bench.training.train

    def would_run(*args, **kwargs):
        raise AssertionError("a malformed input reached the runner")

    monkeypatch.setattr(suites, "run_suite", would_run)
    monkeypatch.setattr(bench.training.train, "run", would_run)
    monkeypatch.setattr(gpucheck_driver, "run_sections", would_run)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


@pytest.fixture
def weights(tmp_path) -> Path:
    """A weights file as a run saves it (the format load_weights accepts; no tensors needed:
    the overrides are composed before the state_dict is read)."""
    path = tmp_path / "weights.pt"
    torch.save({"format": WEIGHTS_FORMAT, "state_dict": {}, "overrides": ["task=markov"],
                "task": {"family": "markov"}}, path)
    # its sha256 beside it, as `sha256sum weights.pt > weights.pt.sha256` writes it
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")
    return path


def suite_file(folder: Path, runs, name: str = "mine.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump({"runs": runs}))
    return path


def invocation(command: str, override: str, tmp_path: Path, weights: Path) -> list[str]:
    if command == "run":
        return ["run", "print_config=true", "trainer.threads=1", override]
    if command == "sweep":
        return ["sweep", "seed=0,1", "trainer.threads=1", override]
    if command == "suite":
        return ["suite", f"name={suite_file(tmp_path, [[override, 'trainer.threads=1']])}"]
    return ["eval", f"weights={weights}", "trainer.threads=1", override]


@pytest.mark.parametrize("command", ["run", "sweep", "suite", "eval"])
@pytest.mark.parametrize("override,needle", GRAMMAR,
                         ids=[ascii(o)[1:41] for o, _ in GRAMMAR])
def test_a_malformed_override_is_one_line_exit_2(command, override, needle, nothing_runs,
                                                 weights, tmp_path, capsys):
    code = cli.main(invocation(command, override, tmp_path, weights))
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and needle in line, line
    assert override.split("=", 1)[0].split("[")[0] in line  # the override is named
    if command == "suite":
        assert "mine.yaml" in line and "entry 1" in line  # and where it is
    assert list(nothing_runs.iterdir()) == []


def test_the_grammar_cases_cover_the_issue():
    """At least 25 malformed forms, the issue's four among them."""
    given = {o for o, _ in GRAMMAR}
    assert len(GRAMMAR) >= 25
    assert {"task.gd_steps=[1,2", "task.order={a", "task.gd_steps=]1,2["} <= given


@pytest.mark.parametrize("args", [
    ["task=linreg", "task.gd_steps=[1,2]"], ["task=linreg", "task.gd_steps=[1, 2]"],
    ["model.kernel='torch'"], ['model.kernel="torch"'], ["trainer.lr=1e-3"],
    ["trainer.precision=bf16-mixed"], ["task.order= 2"], ["name=it's #1 [draft"],
    ["out_dir=runs/[a] b"],
])
def test_well_formed_values_still_compose(args):
    assert compose(args).overrides == args


def test_a_sweep_checks_each_value_of_a_list():
    entries, shared = grid(["model.kernel='torch',sequential", "seed=0"])
    assert entries == [["model.kernel='torch'"], ["model.kernel=sequential"]]
    with pytest.raises(ConfigError, match=re.escape("task.order={a,1: malformed value")):
        grid(["task.order={a,1", "seed=0"])  # unbalanced: checked whole


# -- suite files: the caps and duplicate checks of a sweep, and YAML that says one thing

def test_a_suite_over_the_cap_is_refused_before_an_entry_is_composed(nothing_runs, tmp_path,
                                                                      monkeypatch, capsys):
    import bench.cli.suites

    def composed(*args, **kwargs):
        raise AssertionError("an entry was composed")

    monkeypatch.setattr(bench.cli.suites, "compose", composed)  # what the suite runner composes with
    path = suite_file(tmp_path, [[f"seed={i}"] for i in range(MAX_RUNS + 1)])
    assert cli.main(["suite", f"name={path}"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"holds {MAX_RUNS + 1} runs; a suite has at most {MAX_RUNS}" in line


@pytest.mark.parametrize("text,needle", [
    ("runs:\n  - [seed=1, trainer.threads=1]\n  - [seed=2]\n  - [trainer.threads=1, seed=1]\n",
     "entries 1 and 3 are the same run"),
    ("runs:\n  - []\n  - [seed=1]\n  - []\n", "entries 1 and 3 are the same run ((defaults))"),
    ("runs:\n  - [seed=1]\nruns:\n  - [seed=2]\n", "the key 'runs' is given twice (lines 1 and 3)"),
    ('runs:\n  - [seed=1]\n  - ["task.order=[1"]\n', "entry 2: task.order=[1: malformed value"),
])
def test_a_suite_file_with_a_run_twice_or_a_key_twice_is_one_line(text, needle, nothing_runs,
                                                                   tmp_path, capsys):
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_suite(str(path))
    assert cli.main(["suite", f"name={path}"]) == 2
    assert needle in one_error_line(capsys.readouterr().err)


def test_entries_made_the_same_by_the_command_line_are_refused(nothing_runs, tmp_path, capsys):
    path = suite_file(tmp_path, [["seed=0"], ["seed=1"]])
    assert cli.main(["suite", f"name={path}", "seed=5"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "entries 1 and 2" in line and "same run" in line and "seed=5" in line


def test_entries_that_compose_the_same_run_are_named(tmp_path, monkeypatch, capsys):
    """model.d_conv=4 is mamba's default: written differently, the same run (a shipped suite has
    such pairs, so it is said, not refused)."""
    ran = []
    monkeypatch.setattr(suites, "run_suite", lambda *args, **kwargs: ran.append(args) or 0)
    monkeypatch.chdir(tmp_path)
    path = suite_file(tmp_path, [["seed=0"], ["seed=0", "model.d_conv=4"]])
    assert cli.main(["suite", f"name={path}", "trainer.threads=1"]) == 0 and ran
    assert "warning: entries 1 and 2 of suite" in capsys.readouterr().err


def test_a_long_list_says_it_is_being_checked(tmp_path, monkeypatch, capsys):
    """Composing and memory-checking each entry takes time: a line every 5 s, never silence."""
    clock = iter(range(0, 10_000, 6))  # each reading of the clock 6 s after the last
    monkeypatch.setattr(suites, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    monkeypatch.setattr(suites, "run_suite", lambda *args, **kwargs: 0)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sweep", "seed=0,1,2", "trainer.threads=1"]) == 0
    out = capsys.readouterr().out
    assert "checking the entries of the sweep: 1 of 3" in out
    assert "checking the entries of the sweep: 2 of 3" in out


@pytest.mark.parametrize("option,needle", [
    ("entries=", "entries is empty"),  # ran every entry
    ("entries=1-", "entries must be numbers and ranges"),  # ran entry 1
    ("entries=\uff11", "entries must be numbers and ranges"),  # int() reads it as 1
    ("entries=2-1", "is a range lo-hi with lo > hi"),
    ("shard=\uff10/\uff12", "shard must be i/n"),
    ("shard=0/1_0", "shard must be i/n"),
])
@pytest.mark.parametrize("command", [["sweep", "seed=0,1"], ["suite", "name=leaderboard"]])
def test_entries_and_shard_are_read_exactly(command, option, needle, nothing_runs, capsys):
    assert cli.main([*command, option, "trainer.threads=1"]) == 2
    assert needle in one_error_line(capsys.readouterr().err)


def test_yaml_files_refuse_a_key_twice_but_take_merges():
    assert load_yaml_text("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\n") == \
        {"base": {"x": 1, "y": 2}, "other": {"x": 1, "y": 3}}
    with pytest.raises(yaml.YAMLError, match="the key 'y' is given twice"):
        load_yaml_text("a:\n  y: 1\n  y: 2\n")


# -- claims rules files: every level's keys are known

def rules(tmp_path: Path, old: str, new: str) -> Path:
    text = PAPER000.read_text()
    assert old in text
    path = tmp_path / "rules.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


QUOTE = ('    quote: "even a single-layer Mamba sharply matches the optimal estimator on the whole '
         'sequence"')


@pytest.mark.parametrize("old,new,needle", [
    ('paper: "000"', 'paper: "000"\nbogus_key: 1',
     "unknown key 'bogus_key'; valid keys: claims, paper, title"),
    ('paper: "000"', 'paper: "000"\npaper: "002"', "the key 'paper' is given twice"),
    ("title: ", "title: [a, b]\nignored: ", "unknown key 'ignored'"),
    ('title: "From', 'title: ""\nx_title: "From', "unknown key 'x_title'"),
    ("title: ", "title: 7\n#", "title must be a non-empty string"),
    (QUOTE, "    quote: [a, list]", "quote must be a non-empty string"),
    (QUOTE, QUOTE + "\n    quote: again", "the key 'quote' is given twice"),
])
def test_a_rules_file_with_an_unknown_or_repeated_key_is_one_line(old, new, needle, tmp_path,
                                                                  nothing_runs, capsys):
    path = rules(tmp_path, old, new)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_claims(path)
    assert cli.main(["claims", f"rules={path}", f"out={tmp_path / 'claims.md'}",
                     f"out_dir={tmp_path}"]) == 2
    assert needle in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "claims.md").exists()


# -- gpucheck: every option checked before a section (or a GPU) is needed

@pytest.mark.parametrize("option,needle", [
    ("budget=1", "less than any section chosen needs (the least: env, ~10 s)"),  # exit 0, idle
    ("sections=env,env", "section env is listed twice"),  # internal error after the run
    ("sections=env,,tiny", "unknown section(s) '' (an empty name)"),
    ("steps=\u00b2", "steps must be an integer in [1, 10000], got '\u00b2'"),
    ("steps=020", "steps must be an integer in [1, 10000]"),
    ("steps=" + "9" * 5000, "steps must be an integer in [1, 10000]"),
    ("suite=nope", "unknown suite 'nope'"),
    ("suite_entries=abc", "entries must be numbers and ranges"),
    ("suite_entries=0", "is not within 1-"),
    (f"out={LONG_PATH}", "out=/tmp/aaa"),
    (f"tokenizer_file={LONG_PATH}/t.json", "tokenizer_file=/tmp/aaa"),
])
def test_gpucheck_refuses_a_bad_option_before_anything_runs(option, needle, nothing_runs,
                                                            tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["gpucheck", option, *([] if option.startswith("out=") else
                                           [f"out={out}"])]) == 2
    assert needle in one_error_line(capsys.readouterr().err)
    assert not out.exists()


def test_gpucheck_refuses_an_option_given_twice(nothing_runs, tmp_path, capsys):
    assert cli.main(["gpucheck", "budget=60", "budget=70", f"out={tmp_path / 'out'}"]) == 2
    assert "'budget' is given twice" in one_error_line(capsys.readouterr().err)


# -- paths the file system cannot take: one line naming the option

@pytest.mark.parametrize("args,needle", [
    (["run", "print_config=true", f"out_dir={LONG_PATH}"], "out_dir="),
    (["sweep", "seed=0,1", f"out_dir={LONG_PATH}"], "out_dir="),
    (["run", "print_config=true", f"resume={LONG_PATH}/x.ckpt"], "resume="),
    (["run", "print_config=true", "resume=/tmp/" + "r" * 300 + ".ckpt"],
     "a file name of 305 bytes"),
    (["suite", f"name={LONG_PATH}/x.yaml"], "name="),
    (["eval", f"weights={LONG_PATH}/x.pt"], "weights="),
    (["claims", f"rules={LONG_PATH}/x.yaml"], "rules="),
    (["claims", f"out_dir={LONG_PATH}"], "out_dir="),
    (["claims", f"out={LONG_PATH}/c.md"], "out="),
    (["claims", "plan", f"out_dir={LONG_PATH}"], "out_dir="),
])
def test_a_path_too_long_for_the_file_system_is_one_line(args, needle, nothing_runs, capsys):
    assert cli.main(args) == 2
    line = one_error_line(capsys.readouterr().err)
    assert needle in line and "bytes; file systems allow" in line, line


def test_the_limits_are_the_file_systems(tmp_path):
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    check_path("out", str(tmp_path / ("n" * name_max)))
    with pytest.raises(ConfigError, match=f"a folder name of {name_max + 1} bytes; file systems "
                                          f"allow {name_max}"):
        check_path("out_dir", str(tmp_path / ("n" * (name_max + 1))), folder=True)
    with pytest.raises(ConfigError, match="holds a NUL byte"):
        check_path("out", "a\x00b")


# -- from the shell, the issue's cases as given

def bench(*args, cwd: Path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


@pytest.mark.parametrize("case", ["run", "run-brace", "run-quote", "sweep", "suite", "eval",
                                  "suite-5000", "entries", "claims", "gpucheck", "out_dir"])
def test_from_the_shell(case, tmp_path, weights):
    work = tmp_path / "work"
    work.mkdir()
    colour = rules(tmp_path, 'paper: "000"', 'colour: red\npaper: "000"')
    many = suite_file(tmp_path, [[f"seed={i}"] for i in range(5000)], "many.yaml")
    args, needle = {
        "run": (["run", "task.gd_steps=[1,2"], "task.gd_steps=[1,2: malformed value"),
        "run-brace": (["run", "task.order={a"], "task.order={a: malformed value"),
        "run-quote": (["run", "model.name='abc"], "model.name='abc: malformed value"),
        "sweep": (["sweep", "task.gd_steps=]1,2["], "task.gd_steps=]1,2[: malformed value"),
        "suite": (["suite", f"name={suite_file(tmp_path, [['task.gd_steps=[1,2']])}"],
                  "entry 1: task.gd_steps=[1,2: malformed value"),
        "eval": (["eval", f"weights={weights}", "task.order={a"], "task.order={a: malformed"),
        "suite-5000": (["suite", f"name={many}"], "holds 5000 runs; a suite has at most 1000"),
        "entries": (["sweep", "seed=0,1", "entries="], "entries is empty"),
        "claims": (["claims", f"rules={colour}", "out_dir=."], "unknown key 'colour'"),
        "gpucheck": (["gpucheck", "budget=0", f"out={tmp_path / 'out'}"],
                     "budget must be a positive number of seconds"),
        "out_dir": (["run", f"out_dir={LONG_PATH}"], "bytes; file systems allow"),
    }[case]
    done = bench(*args, cwd=work)
    assert done.returncode == 2, done.stderr[-2000:]
    assert needle in one_error_line(done.stderr)
    assert list(work.iterdir()) == []
