"""Malformed invocations of every command end with one `error:` line and exit code 2, before
anything runs: no traceback, no hang, no record, no temporary file, no directory.

Each case runs in-process from an empty working directory (the default out_dir, `results`, is
relative to it) under an alarm, so a hang fails the test instead of stalling the suite."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli.main import main
from bench.training.checks import MULTI_NODE_LAUNCH

REPO = Path(__file__).resolve().parents[1]
HUGE = 10**9

# (category, arguments, a fragment of the expected message). {fixtures} is a directory holding
# a text file `notes.txt` and an empty directory `empty/`.
CASES = [
    # -- syntax: what is not key=value, malformed keys, repeated keys, unknown commands/flags
    ("syntax", ["run", "orphan"], "expected key=value"),
    ("syntax", ["run", ""], "expected key=value"),
    ("syntax", ["run", "=3"], "malformed key"),
    ("syntax", ["run", "task.=hmm"], "malformed key 'task.'"),
    ("syntax", ["run", ".order=2"], "malformed key"),
    ("syntax", ["run", "task..order=2"], "malformed key"),
    ("syntax", ["run", "seed=1", "seed=2"], "given twice"),
    ("syntax", ["run", "task.order=1", "task.order=2"], "given twice"),
    ("syntax", ["run", "--steps", "3"], "unknown option '--steps'"),
    ("syntax", ["frobnicate"], "unknown command 'frobnicate'"),
    ("syntax", ["references", "n=3", "n=4"], "given twice"),
    ("syntax", ["speed", "-x"], "unknown option"),
    # -- unknown choices of a config group or a suite
    ("unknown choice", ["run", "task=nope"], "unknown task 'nope'; choose one of:"),
    ("unknown choice", ["run", "model=nope"], "unknown model 'nope'"),
    ("unknown choice", ["run", "trainer=nope"], "unknown trainer 'nope'"),
    ("unknown choice", ["run", "task="], "unknown task ''"),
    ("unknown choice", ["references", "task=Markov"], "unknown task 'Markov'"),
    ("unknown choice", ["speed", "model=mamba2"], "unknown model 'mamba2'"),
    ("unknown choice", ["suite", "name=nope"], "unknown suite 'nope'"),
    # -- unknown keys
    ("unknown key", ["run", "task.nope=1"], "unknown key 'task.nope'"),
    ("unknown key", ["run", "model.nope=1"], "unknown key 'model.nope'"),
    ("unknown key", ["run", "trainer.steps=5"], "unknown key 'trainer.steps'"),
    ("unknown key", ["run", "bogus=1"], "unknown key 'bogus'"),
    ("unknown key", ["run", "task=hmm", "task.order=2"], "unknown key 'task.order'"),
    ("unknown key", ["references", "n_sequences=5"], "unknown key 'n_sequences'"),
    ("unknown key", ["speed", "trainer.lr.x=1"], "trainer"),
    # -- wrong types: integers are integers, numbers are numbers, booleans are booleans
    ("type", ["run", "seed=1.5"], "seed: invalid value '1.5'"),
    ("type", ["run", "seed=true"], "seed: invalid value 'true'"),
    ("type", ["run", "seed=-1"], "seed: invalid value '-1'"),
    ("type", ["run", "seed=x"], "seed: invalid value 'x'"),
    ("type", ["run", "seed="], "seed: invalid value ''"),
    ("type", ["run", "seed=²"], "seed: invalid value '²'"),
    ("type", ["references", "n=²"], "n: invalid value '²'"),  # was an internal error, exit 1
    ("type", ["references", "n=010"], "n: invalid value '010'"),  # read as 10, unlike seed=010
    ("range", ["speed", "steps=10^30"], "steps: invalid value"),
    ("range", ["speed", "steps=1000000000000000000000000000000"], "outside 1..100000"),  # ran on
    # one way everywhere: as task.seq_len=010 is refused, so is seed=010 (it read as 10)
    ("type", ["run", "seed=010"], "seed: '010' is not a plain decimal number (YAML 1.1 reads it as 8)"),
    # numbers YAML 1.1 reads otherwise than they read: refused, never reinterpreted
    ("type", ["run", "task.seq_len=010"], "'010' is not a plain decimal number (YAML 1.1 reads it as 8)"),
    ("type", ["run", "task.seq_len=1:04"], "'1:04' is not a plain decimal number (YAML 1.1 reads it as 64)"),
    ("type", ["run", "trainer.batch_size=0x10"], "'0x10' is not a plain decimal number"),
    ("type", ["run", "task=linreg", "task.gd_steps=[1,010]"], "'010' is not a plain decimal number"),
    ("type", ["run", "trainer.max_steps=1000000000000000000000000000000"],
     "trainer.max_steps: 1000000000000000000000000000000 does not fit a 64-bit integer"),
    ("type", ["run", "task.seq_len=-1000000000000000000000000000000"],
     "does not fit a 64-bit integer"),
    # values that used to hang before the start (a 2^(10^18) integer, 10^8 GD iterations, a wait
    # for a second node nobody starts)
    ("range", ["run", "task.order=1000000000000000000"], "contexts do not fit a 64-bit index"),
    ("range", ["run", "task=switching_markov", "task.order=100"], "do not fit a 64-bit index"),
    # the hang, as given (markov and switching_markov): beyond 64 bits, refused at once
    ("type", ["run", "task.order=1000000000000000000000000000000"], "does not fit a 64-bit integer"),
    ("type", ["run", "task=switching_markov", "task.order=1000000000000000000000000000000"],
     "task.order: 1000000000000000000000000000000 does not fit a 64-bit integer"),
    ("type", ["run", "model=griffin", "model.window=1000000000000000000000000000000"],
     "model.window: 1000000000000000000000000000000 does not fit a 64-bit integer"),
    # integers that fit 64 bits but no tensor: torch's own overflow was an internal error, exit 1
    ("memory", ["run", "model=lstm", "model.d_model=1000000000"],
     "model.d_model=1000000000: the run's tensors cannot be allocated at this size"),
    ("memory", ["run", "model.d_state=4611686018427387904"],
     "model.d_state=4611686018427387904: the run's tensors cannot be allocated"),
    ("memory", ["run", "task=hmm", "task.vocab_size=4611686018427387904"],
     "task.vocab_size=4611686018427387904: the run's tensors cannot be allocated"),
    ("memory", ["run", "task=linreg", "task.seq_len=4611686018427387904"],
     "task.seq_len=4611686018427387904: the run's tensors cannot be allocated"),
    ("range", ["run", "task=linreg", "task.gd_steps=[1,100000000]"],
     "gd_steps must be at most 1000"),
    ("hardware", ["run", "trainer.num_nodes=2"], "needs a multi-node launcher"),
    ("range", ["run", "task=lgssm_colored", "task.grid_size=100000000"],
     "grid_size must be at most 4096"),
    ("range", ["run", "task=nonlinreg", "task.grid_phase=100000000"],
     "grid_phase must be at most 65536"),
    ("range", ["run", "task=lgssm", "task.bayes_particles=100000000000"],
     "bayes_particles <= 65536"),
    ("hardware", ["run", "trainer.threads=100000"], "trainer.threads=100000 but this machine has"),
    ("hardware", ["run", "trainer.devices=-1", "trainer.accelerator=cpu"],
     "trainer.devices=-1 means every GPU"),
    ("range", ["run", "model.chunk_size=1000000000000"], "chunk_size must be at most 4096"),
    ("type", ["run", "task.order=abc"], "task.order: invalid value abc"),
    ("type", ["run", "task.order=1.5"], "task.order: invalid value 1.5"),
    ("type", ["run", "task.order=true"], "task.order: invalid value true"),
    ("type", ["run", "task.order="], "task.order: invalid value"),
    ("type", ["run", "trainer.lr=fast"], "trainer.lr: invalid value fast"),
    ("type", ["run", "trainer.lr=true"], "trainer.lr"),
    ("type", ["run", "trainer.max_steps=1e3"], "trainer.max_steps: invalid value 1e3"),
    ("type", ["run", "trainer.progress=maybe"], "trainer.progress: invalid value maybe"),
    ("type", ["run", "model.conv=2"], "model.conv: invalid value 2"),
    ("type", ["run", "model.tie_embeddings=2"], "model.tie_embeddings: invalid value 2"),
    ("type", ["run", "model=lstm", "model.tie_embeddings=maybe"], "model.tie_embeddings"),
    ("type", ["run", "model.d_model=[16]"], "model.d_model"),
    ("type", ["run", "task=linreg", "task.gd_steps=5"], "task.gd_steps"),
    ("type", ["run", "task=linreg", "task.gd_steps=[1,x]"], "task.gd_steps"),
    ("type", ["references", "n=abc"], "n: invalid value 'abc'"),
    ("type", ["speed", "steps=2.5"], "steps: invalid value '2.5'"),
    # -- finiteness: NaN and infinities are errors wherever a number is read
    ("finiteness", ["run", "task.beta=nan"], "task.beta: nan is not a finite number"),
    ("finiteness", ["run", "task.beta=inf"], "task.beta: inf is not a finite number"),
    ("finiteness", ["run", "trainer.lr=nan"], "trainer.lr: nan"),
    ("finiteness", ["run", "trainer.weight_decay=-inf"], "trainer.weight_decay: -inf"),
    ("finiteness", ["run", "trainer.grad_clip=inf"], "trainer.grad_clip: inf"),
    ("finiteness", ["run", "task=lgssm", "task.eig_max=nan"], "task.eig_max: nan"),
    ("finiteness", ["run", "task=nonlinreg", "task.x_max=inf"], "task.x_max: inf"),
    ("finiteness", ["run", "model=lru", "model.r_max=nan"], "model.r_max: nan"),
    ("finiteness", ["run", "model=gd_ssm_constructed", "task=linreg_tokens",
                    "model.step_size=inf"], "model.step_size: inf"),
    # -- ranges of single fields
    ("range", ["run", "trainer.max_steps=0"], "trainer.max_steps must be >= 1"),
    ("range", ["run", "trainer.batch_size=0"], "trainer.batch_size must be >= 1"),
    ("range", ["run", "trainer.lr=0"], "trainer.lr must be > 0"),
    ("range", ["run", "trainer.lr=-1e-3"], "trainer.lr must be > 0"),
    ("range", ["run", "trainer.min_lr_ratio=1.5"], "min_lr_ratio must be in [0, 1]"),
    ("range", ["run", "trainer.min_lr_ratio=-0.1"], "min_lr_ratio must be in [0, 1]"),
    ("range", ["run", "trainer.weight_decay=-1"], "weight_decay"),
    ("range", ["run", "trainer.grad_clip=-1"], "grad_clip"),
    ("range", ["run", "trainer.warmup_steps=-1"], "warmup_steps must be >= 0"),
    ("range", ["run", "trainer.bootstrap=0"], "bootstrap must be >= 1"),
    ("range", ["run", "trainer.eval_batch_size=0"], "eval_batch_size must be >= 1"),
    ("range", ["run", "trainer.eval_sequences=1"], "eval_sequences must be >= 2"),
    ("range", ["run", "trainer.log_every=0"], "log_every must be >= 1"),
    ("range", ["run", "trainer.checkpoint_every=-5"], "checkpoint_every must be >= 0"),
    ("range", ["run", "trainer.threads=-1"], "threads must be >= 0"),
    ("range", ["run", "trainer.devices=0"], "devices must be >= 1, or -1"),
    ("range", ["run", "trainer.devices=-2"], "devices must be >= 1, or -1"),
    ("range", ["run", "trainer.num_nodes=0"], "num_nodes must be >= 1"),
    ("range", ["run", "task.order=0"], "order >= 1"),
    ("range", ["run", "task.vocab_size=1"], "vocab_size >= 2"),
    ("range", ["run", "task.beta=0"], "beta > 0"),
    ("range", ["run", "task.beta=-1"], "beta > 0"),
    ("range", ["run", "task.seq_len=0"], "seq_len >= 1"),
    ("range", ["run", "task=switching_markov", "task.p_switch=1"], "0 <= p_switch < 1"),
    ("range", ["run", "task=hmm", "task.num_states=0"], "num_states >= 1"),
    ("range", ["run", "task=hmm", "task.emission_concentration=0"], "positive Dirichlet"),
    ("range", ["run", "task=lgssm", "task.eig_max=1"], "eig_max < 1"),
    ("range", ["run", "task=lgssm", "task.obs_noise_min=0"], "noise_min"),
    ("range", ["run", "task=lgssm_colored", "task.eval_rho=1.5"], "eval_rho in (0, 1)"),
    ("range", ["run", "task=linreg", "task.noise_std=-0.1"], "noise_std >= 0"),
    ("range", ["run", "task=linreg", "task.gd_steps=[0]"], "gd_steps"),
    ("range", ["run", "task=nonlinreg", "task.noise_std=0"], "noise_std > 0"),
    ("range", ["run", "model.d_model=0"], "d_model must be a positive integer"),
    ("range", ["run", "model.n_layers=0"], "n_layers must be a positive integer"),
    ("range", ["run", "model.d_conv=0"], "d_conv must be a positive integer"),
    ("range", ["run", "model=transformer", "model.n_layers=-1"], "must be positive"),
    ("range", ["run", "model=lstm", "model.d_model=0"], "lstm: d_model and n_layers"),
    ("range", ["run", "model=griffin", "model.window=-1"], "window >= 0"),
    ("range", ["run", "model=selective_ssm", "model.d_model=0"], "must be positive"),
    ("range", ["run", "model=transformer", "model.d_ff=-1"], "d_ff must be >= 0"),
    ("range", ["references", "n=1"], "n: invalid value '1'; expected an integer >= 2"),
    ("range", ["speed", "steps=0"], "steps: invalid value '0'"),
    # -- enumerations
    ("enumeration", ["run", "trainer.precision=fp8"], "trainer.precision must be one of"),
    ("enumeration", ["run", "trainer.strategy=fsdp"], "trainer.strategy must be one of"),
    ("enumeration", ["run", "trainer.accelerator=tpu"], "trainer.accelerator must be one of"),
    ("enumeration", ["run", "model.kernel=triton"], "kernel must be one of"),
    ("enumeration", ["run", "model.activation=tanh"], "activation must be one of"),
    ("enumeration", ["run", "model=transformer", "model.attention=flash"], "attention="),
    ("enumeration", ["run", "model=griffin", "model.block_pattern=RXA"], "block_pattern="),
    ("enumeration", ["run", "model=griffin", "model.block_pattern="], "model.block_pattern"),
    ("enumeration", ["run", "model=selective_ssm", "model.transition=tanh"], "transition="),
    ("enumeration", ["run", "model=gd_ssm", "model.scan=fast"], "scan="),
    ("enumeration", ["run", "task=linreg", "task.prompt=chat"], "prompt must be"),
    # -- constraints across fields, and between model, task and hardware
    ("cross-field", ["run", "model=transformer", "model.n_heads=3"], "not divisible by n_heads=3"),
    ("cross-field", ["run", "model=griffin", "model.n_heads=3"], "n_heads=3"),
    ("cross-field", ["run", "model=lru", "model.r_min=0.99", "model.r_max=0.9"], "r_min < r_max"),
    ("cross-field", ["run", "model.headdim=7"], "divisible by headdim"),
    ("cross-field", ["run", "model.ngroups=3"], "must divide n_heads"),
    ("cross-field", ["run", "task=lgssm", "task.eig_min=0.9", "task.eig_max=0.8"], "eig_min"),
    ("cross-field", ["run", "task=lgssm_colored", "task.rho_min=0.99", "task.rho_max=0.9"],
     "rho_min <= rho_max"),
    ("cross-field", ["run", "task=nonlinreg", "task.amplitude_min=5", "task.amplitude_max=1"],
     "amplitude_min < amplitude_max"),
    ("cross-field", ["run", "model=transformer", "model.attention=linear", "model.window=4"],
     "window > 0 is only defined"),
    ("cross-field", ["run", "model=gd_ssm_constructed"], "needs a vectors task"),
    ("cross-field", ["run", "model=gd_ssm_constructed", "task=lgssm"], "is not a linreg"),
    ("cross-field", ["run", "model=gd_ssm_constructed", "task=linreg"], "is not a linreg"),
    ("cross-field", ["run", "model=mambazero", "model.l1_prediction=true", "task=lgssm"],
     "l1_prediction needs a tokens task"),
    ("cross-field", ["run", "model=gd_ssm", "model.constructed=true", "model.n_layers=2"],
     "constructed=true is the paper's one-layer construction"),
    ("cross-field", ["run", "model=mamba_lm14m", "task=lgssm"],
     "cannot be built for task lgssm: tie_embeddings=true shares the token embedding"),
    ("cross-field", ["run", "model=mambazero", "model.tie_embeddings=true"],
     "the mambazero core maps inputs to predictions itself"),
    ("hardware", ["run", "trainer=ddp"], "no CUDA GPU is visible"),
    ("hardware", ["run", "trainer.accelerator=gpu"], "no CUDA GPU is visible"),
    ("hardware", ["run", "model.kernel=mamba_ssm"], "runs only on a CUDA GPU"),
    ("hardware", ["run", "model=mambazero", "model.kernel=mamba_ssm"], "runs only on a CUDA GPU"),
    ("hardware", ["run", "trainer.precision=16-mixed"], "16-mixed needs a CUDA GPU"),
    ("hardware", ["run", "trainer.accelerator=cpu", "trainer.devices=4096"], "CPU processes"),
    # -- sizes that cannot fit in memory: refused with the estimate
    ("memory", ["run", "task.order=30"], "GiB"),
    ("memory", ["run", "task.vocab_size=100000", "task.order=2"], "GiB"),
    ("memory", ["run", f"task.seq_len={HUGE}"], "GiB"),
    ("memory", ["run", f"trainer.batch_size={HUGE}"], "GiB for training"),
    ("memory", ["run", f"trainer.eval_sequences={HUGE}"], "GiB for evaluation"),
    ("memory", ["run", f"trainer.bootstrap={HUGE}"], "GiB for evaluation"),
    ("memory", ["run", "model.d_model=65536", "model.headdim=64"], "GiB"),
    ("memory", ["run", "model=transformer", "model.n_layers=100000"], "GiB"),
    ("memory", ["run", "task=hmm", "task.num_states=100000"], "GiB"),
    ("memory", ["references", f"n={HUGE}"], "GiB for evaluation"),
    ("memory", ["speed", f"trainer.batch_size={HUGE}"], "GiB for training"),
    # -- paths: out_dir and resume
    ("path", ["run", "out_dir="], "out_dir is empty"),
    ("path", ["run", "out_dir={fixtures}/notes.txt"], "is not a directory"),
    ("path", ["run", "out_dir={fixtures}/notes.txt/sub"], "is not a directory"),
    ("path", ["run", "out_dir=/proc/icl-bench-results"], "out_dir=/proc/icl-bench-results"),
    ("path", ["run", "out_dir={fixtures}/dangling"], "is a symlink that leads nowhere"),
    ("path", ["run", "out_dir={fixtures}/loop/sub"], "is a symlink that leads nowhere"),
    ("path", ["run", "out_dir={fixtures}/" + "x" * 300], "a folder name of 300 bytes"),
    ("path", ["run", "out_dir={fixtures}/with-files"], "with-files/logs is not a directory"),
    ("path", ["run", "out_dir={fixtures}/with-files", "trainer.logger=none",
              "trainer.checkpoint_every=2"], "with-files/checkpoints is not a directory"),
    ("path", ["run", "resume={fixtures}/missing.ckpt"], "missing.ckpt"),
    ("path", ["run", "resume={fixtures}/notes.txt"], "notes.txt"),
    ("path", ["run", "resume={fixtures}/empty"], "empty"),
    # -- the other commands' own options
    ("command options", ["suite"], "suite needs name=<suite>"),
    ("command options", ["suite", "name=leaderboard", "shard=2/2"], "shard must be i/n"),
    ("command options", ["suite", "name=leaderboard", "shard=a/b"], "shard must be i/n"),
    ("command options", ["suite", "name=leaderboard", "shard=1"], "shard must be i/n"),
    ("command options", ["suite", "name=leaderboard", "shard=-1/2"], "shard must be i/n"),
    ("command options", ["suite", "name=leaderboard", "task.nope=1"], "unknown key 'task.nope'"),
    ("command options", ["suite", "name=leaderboard", "trainer=ddp"], "no CUDA GPU"),
    ("command options", ["list", "x"], "list takes no arguments"),
    ("command options", ["list", "task=markov"], "list takes no arguments"),
    ("command options", ["leaderboard", "bogus=1"], "bogus"),
    ("command options", ["leaderboard", "out_dir={fixtures}/missing"], "missing"),
    ("command options", ["leaderboard", "out_dir={fixtures}/empty"], "empty"),
    ("command options", ["leaderboard", "out_dir={fixtures}/notes.txt"], "notes.txt"),
    ("command options", ["leaderboard", "include=maybe"], "include"),
]


@pytest.fixture
def fixtures(tmp_path):
    where = tmp_path / "fixtures"
    (where / "empty").mkdir(parents=True)
    (where / "notes.txt").write_text("not a checkpoint\n")
    (where / "dangling").symlink_to(where / "nothing-here")
    (where / "loop").symlink_to(where / "loop")
    (where / "with-files").mkdir()  # an out_dir whose logs and checkpoints folders are files
    for name in ("logs", "checkpoints"):
        (where / "with-files" / name).write_text("a file")
    return where


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*"))


class Hung(BaseException):
    """Not an Exception: the code under test catches those (the memory estimate falls back on
    any), and a TimeoutError swallowed there let trainer.batch_size=10^9 pass after 60 s when a
    user waited 6 minutes for its answer."""


def on_alarm(signum, frame):
    raise Hung("the command did not return within 60 s")


@pytest.mark.parametrize("category,args,needle", CASES,
                         ids=[f"{c}:{' '.join(a)}" for c, a, _ in CASES])
def test_malformed_invocation_is_one_line_and_exit_2(category, args, needle, fixtures, tmp_path,
                                                     monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # the default out_dir `results` would land here
    for name in MULTI_NODE_LAUNCH:  # as started by hand, not by a multi-node launcher
        monkeypatch.delenv(name, raising=False)
    args = [a.replace("{fixtures}", str(fixtures)) for a in args]
    needle = needle.replace("{fixtures}", str(fixtures))
    before = files_under(fixtures)
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(60)
    try:
        code = main(args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert needle in lines[0], lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert files_under(work) == [], "a rejected command left files behind"
    assert files_under(fixtures) == before


def test_enough_cases_of_every_command():
    """The issue's bar: at least 80 malformed invocations across the six commands."""
    commands = {args[0] for _, args, _ in CASES}
    assert len(CASES) >= 80
    assert {"run", "references", "leaderboard", "speed", "suite", "list"} <= commands


@pytest.mark.parametrize("args", [
    # each import of torch + lightning costs seconds: a few cases, one that needs the checks
    ["run", "task=nope"], ["run", "seed=1.5"], ["run", "task.order=30"], ["suite"], ["list", "x"],
])
def test_from_the_shell_exit_2_without_traceback(args, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["run", "references", "leaderboard", "speed", "suite",
                                     "list"])
def test_help_of_each_command(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"python -m bench {command}")


def test_a_non_editable_install_carries_conf(tmp_path):
    """`pip install .` (not -e) puts conf/ inside the package: the CLI finds its YAML files
    from any directory."""
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--target", str(target), str(REPO)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    sources = {path.relative_to(REPO) for package in ("bench", "tasks", "models")
               for path in (REPO / package).rglob("*.py")}
    missing = sorted(str(path) for path in sources if not (target / path).is_file())
    assert not missing, f"modules pyproject.toml's packages leave out: {missing}"
    assert len(list((target / "bench" / "conf").rglob("*.yaml"))) == len(
        list((REPO / "conf").rglob("*.yaml")))
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run([sys.executable, "-c", "import bench.config as c; print(c.CONF_DIR)"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert where.stdout.strip() == str(target / "bench" / "conf"), where.stderr
    listed = subprocess.run([sys.executable, "-m", "bench", "list"], capture_output=True,
                            text=True, cwd=tmp_path, env=env, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "markov" in listed.stdout and "mamba" in listed.stdout


# --- every integer field of every config, discovered ---------------------------------------

# A family's fields are set through one of its conf files; text's must be found offline.
CONF_OF_FAMILY = {"text": "pydoc"}


def integer_fields() -> list[tuple[str, str, str, bool]]:
    """(group, conf file, field, holds a list) for every integer field (int, list[int], int |
    None) of the trainer and of every task and model family, each set through a conf file of
    its family: discovered from the dataclasses, so a field added later is covered too."""
    import dataclasses
    import typing

    import yaml

    from bench.config import CONF_DIR, TrainerConfig, choices, families as _families

    def integers(schema) -> list[tuple[str, bool]]:
        hints = typing.get_type_hints(schema)
        found = []
        for f in dataclasses.fields(schema):
            kind = hints[f.name]
            if kind is int or (typing.get_origin(kind) is not None and int in typing.get_args(kind)):
                found.append((f.name, typing.get_origin(kind) in (list, tuple)))
        return found

    fields = [("trainer", "default", name, many) for name, many in integers(TrainerConfig)]
    for group in ("task", "model"):
        confs: dict[str, list[str]] = {}
        for name in choices(group):
            values = yaml.safe_load((CONF_DIR / group / f"{name}.yaml").read_text()) or {}
            confs.setdefault(values.get("family", name), []).append(name)
        for family, cls in sorted(_families(group).items()):
            conf = CONF_OF_FAMILY.get(family, confs[family][0])
            fields += [(group, conf, name, many) for name, many in integers(cls.Config)]
    return fields


INTEGER_FIELDS = integer_fields()


def test_the_integer_fields_are_all_found():
    """The issue counted 35 fields that crashed at 10^30; every group contributes some."""
    assert len(INTEGER_FIELDS) >= 35
    assert {group for group, *_ in INTEGER_FIELDS} == {"trainer", "task", "model"}
    assert ("task", "linreg", "gd_steps", True) in INTEGER_FIELDS


def integer_override(group: str, conf: str, name: str, many: bool, value: int) -> list[str]:
    text = f"[{value}]" if many else str(value)
    return [f"{group}={conf}", f"{group}.{name}={text}"]


@pytest.mark.parametrize("value", [10**30, -10**30], ids=["1e30", "-1e30"])
@pytest.mark.parametrize("group,conf,name,many", INTEGER_FIELDS,
                         ids=[f"{g}.{n}" + ("" if c == "default" else f"({c})")
                              for g, c, n, _ in INTEGER_FIELDS])
def test_every_integer_field_beyond_64_bits_is_one_line_exit_2(group, conf, name, many, value,
                                                                tmp_path, monkeypatch, capsys):
    """10^30 in any integer field: one line naming the field, exit 2, before anything runs
    (an OverflowError after the start, exit 1 or a failed record, in 35 of them)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["run", *integer_override(group, conf, name, many, value)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert lines == [f"error: {group}.{name}: {value} does not fit a 64-bit integer"], captured.err
    assert files_under(work) == []


@pytest.fixture
def offline_text_caches(tmp_path, monkeypatch):
    """HF's hub off and its datasets cache private: the text family's fields are checked on the
    pydoc corpus, which ships with Python."""
    import datasets.config
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")


@pytest.mark.parametrize("group,conf,name,many", INTEGER_FIELDS,
                         ids=[f"{g}.{n}" + ("" if c == "default" else f"({c})")
                              for g, c, n, _ in INTEGER_FIELDS])
def test_every_integer_field_at_2_to_the_62_is_checked_or_harmless(group, conf, name, many,
                                                                    offline_text_caches,
                                                                    tmp_path):
    """2^62 fits 64 bits but no tensor: the whole-run checks refuse it in one line (a size) or
    accept it (a step count, an interval, a cap); never an internal error (torch's 'Storage
    size calculation overflowed' in 26 of them) and never a hang."""
    from bench.training.checks import compose_checked
    from bench.config import ConfigError
    args = [*integer_override(group, conf, name, many, 2**62), f"out_dir={tmp_path / 'out'}"]
    if conf == "gd_ssm_constructed":
        args.append("task=linreg_tokens")
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(60)
    try:
        compose_checked(args)
    except ConfigError as error:
        assert "\n" not in str(error) and str(error).strip(), str(error)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert not (tmp_path / "out").exists()


# --- the memory check counts what drawing a pool of tasks takes ----------------------------

def pool_tasks() -> list[str]:
    """A conf file of every task family with a finite pool of training tasks (num_tasks)."""
    import dataclasses

    from bench.config import choices, compose
    found = {}
    for name in choices("task"):
        config = compose([f"task={name}"])
        if "num_tasks" in {f.name for f in dataclasses.fields(config.task)}:
            found.setdefault(config.task_family, name)
    return sorted(found.values())


@pytest.mark.parametrize("task", pool_tasks())
def test_the_memory_estimate_covers_drawing_the_pool_of_tasks(task):
    """The pool is drawn in chunks that are then concatenated (twice its size at once), with
    the sampling temporaries of a chunk: linreg num_tasks=10^9 held 18.6 GiB, peaked at 37,
    passed a check that counted it once on a 21 GiB host and was killed with no record."""
    from bench.training.memory import Allocations, pool_peak_bytes
    from bench.config import compose
    from tasks import task_families
    config = compose([f"task={task}", "task.num_tasks=64"])
    sampled = task_families()[config.task_family](config.task, batch_size=32)
    with Allocations() as allocated:
        sampled.task_pool("cpu")
    assert allocated.peak <= pool_peak_bytes(sampled) <= 2 * allocated.peak
    assert pool_peak_bytes(sampled) >= 2 * sampled.pool_bytes()


# --- text data: found before the start, one line naming the file --------------------------

WORDS = "the cat sat on the mat while a dog ran after the ball in the park".split()


@pytest.fixture
def text_data(tmp_path, offline_text_caches):
    """A maker of corpus folders: train/validation/test of plain words, one file replaced."""
    def make(name: str, suffix: str = ".txt", **replace: bytes) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        line = (json.dumps({"text": " ".join(WORDS)}) if suffix == ".jsonl" else " ".join(WORDS))
        for split in ("train", "validation", "test"):
            (folder / f"{split}{suffix}").write_text(f"{line}\n" * 60, encoding="utf-8")
        for split, content in replace.items():
            (folder / f"{split}{suffix}").write_bytes(content)
        return folder
    return make


def tokenizer_file(path: Path) -> Path:
    path.write_text("garbage{")
    return path


TEXT_CASES = {  # name: (how the data differs, extra overrides, expected fragment)
    "binary train.txt": (dict(train=b"text then \x00\x01\x02 bytes" * 10), [],
                         "train.txt: a NUL byte at offset 10"),
    "latin-1 train.txt": (dict(train="caf\xe9 au lait\n".encode("latin-1") * 10), [],
                          "train.txt: not UTF-8 at byte 3"),
    "malformed .jsonl": (dict(suffix=".jsonl", train=b'{"text": "fine"}\n{not json\n'), [],
                         "train.jsonl:2: not JSON"),
    ".jsonl of lists": (dict(suffix=".jsonl", train=b'["text"]\n'), [],
                        "train.jsonl:1: a JSON list, not an object"),
    "empty train": (dict(train=b""), [], "the train split of local folder"),
    "empty validation": (dict(validation=b""), [], "the validation split of local folder"),
    "whitespace-only validation": (dict(validation=b"   \n\t\n"), [],
                                   "validation split of local folder"),
    "one-token validation": (dict(validation=b"a"), [],
                             "has 1 tokens, fewer than one evaluation window of task.seq_len + 1 "
                             "= 17 tokens"),
    "train shorter than a window": (dict(train=b"abcd"), [],
                                    "has 4 tokens, fewer than one training window of "
                                    "task.seq_len + 1 = 17 tokens"),
    "train shorter than a window, bpe": (dict(train=b"abcd"),
                                         ["task.tokenizer=bpe", "task.bpe_vocab_size=300"],
                                         "has at most 6 tokens, fewer than one training window"),
    "corrupt tokenizer_file, gpt2": ({}, ["task.tokenizer=gpt2", "task.tokenizer_file={garbage}"],
                                     "garbage.json: not a tokenizer.json"),
    "corrupt tokenizer_file, bpe": ({}, ["task.tokenizer=bpe", "task.tokenizer_file={garbage}"],
                                    "garbage.json: not a tokenizer.json"),
}


@pytest.mark.parametrize("case", list(TEXT_CASES))
def test_bad_text_data_is_one_line_exit_2_before_the_start(case, text_data, tmp_path, capsys):
    """Binary, non-UTF-8, malformed .jsonl, empty or whitespace-only splits, a split too short
    to train or evaluate on, a corrupt tokenizer file: one line naming the file or split, exit
    2, no record (datasets said only 'An error occurred while generating the dataset'; the short
    splits and a bpe tokenizer_file failed after the start)."""
    data, extra, needle = TEXT_CASES[case]
    data = dict(data)
    folder = text_data("data", data.pop("suffix", ".txt"), **data)
    garbage = tokenizer_file(tmp_path / "garbage.json")
    out = tmp_path / "out"
    given = {o.split("=", 1)[0]: o for o in
             ["task=text", f"task.data_dir={folder}", "task.tokenizer=byte", "task.seq_len=16",
              "model.d_model=16", f"out_dir={out}", *(o.format(garbage=garbage) for o in extra)]}
    code = main(["run", *given.values()])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0], lines[0]
    assert not out.exists()


# --- records that are schema-valid but malformed: named, left out, the report written --------

def malformed_record(command: str, change: str) -> dict:
    """A seed-1 record of the reader's test fixtures with one field gone wrong."""
    if command == "leaderboard":
        from test_leaderboard import record
        rec = record(seed=1, gap=0.1)
    else:
        from test_claims import MAMBA, record
        rec = record(MAMBA, seed=1, gap=0.001)
    from test_leaderboard import spoil
    return spoil(rec, change)


READERS = ["leaderboard", "claims"]
MALFORMED = ["seed true", "raw NaN", "interval of 3", "strings in a curve", "overrides: 5",
             "infinite gap", "200,000-deep JSON"]


def reader_args(command: str, results: Path, tmp_path: Path) -> list[str]:
    args = [command, f"out_dir={results}", f"out={tmp_path / 'report.md'}"]
    if command == "claims":
        from test_claims import rules_file
        args.append(f"rules={rules_file(tmp_path)}")
    return args


def good_records(command: str) -> list[dict]:
    if command == "leaderboard":
        from test_leaderboard import record
        return [record(seed=0, gap=0.1)]
    from test_claims import MAMBA, NOCONV, record
    return [record(MAMBA, seed=0, gap=0.001), record(NOCONV, seed=0, gap=0.06)]


def put_records(directory: Path, *records: dict) -> list[Path]:
    from test_leaderboard import put
    return put(directory, *records)


@pytest.mark.parametrize("change", MALFORMED)
@pytest.mark.parametrize("command", READERS)
def test_a_malformed_record_is_named_and_the_report_still_written(command, change, tmp_path,
                                                                  capsys):
    """Both readers validate every record: a wrong one is named with the reason in one warning
    and left out, the others make the report, exit 0 (they crashed without naming the file)."""
    results = tmp_path / "results"
    put_records(results, *good_records(command))
    if change == "200,000-deep JSON":
        bad = results / "deep.json"
        bad.write_text("[" * 200_000 + "]" * 200_000)
    else:
        bad, = put_records(results, malformed_record(command, change))
    assert main(reader_args(command, results, tmp_path)) == 0
    out, err = capsys.readouterr()
    assert [line for line in err.splitlines() if line.startswith("warning: skipped")] == \
        [next(line for line in err.splitlines() if line.startswith(f"warning: skipped {bad}: "))]
    assert "1 unreadable record skipped" in out and (tmp_path / "report.md").is_file()


@pytest.mark.parametrize("value", [1e308, -1e308])
@pytest.mark.parametrize("command", READERS)
def test_a_huge_finite_gap_is_pooled_without_overflow(command, value, tmp_path, capsys):
    """bayes_gap: 1e308 (with an interval that holds it) is a finite number: pooled with
    another seed its interval is infinite, not an OverflowError that lost the whole report
    (exit 1, 'internal error'). Outside its own interval it is refused: tests/
    test_integrity_records.py."""
    results = tmp_path / "results"
    huge = malformed_record(command, "none")
    huge["metrics"]["bayes_gap"] = value
    huge["metrics"]["bayes_gap_ci"] = [value, value]
    put_records(results, *good_records(command), huge)
    assert main(reader_args(command, results, tmp_path)) == 0
    assert "error" not in capsys.readouterr().err
    if command == "leaderboard":
        assert "[-inf, inf] (seeds)" in (tmp_path / "report.md").read_text()


def test_a_perplexity_beyond_the_float_range_is_infinite_not_a_crash(tmp_path, capsys):
    """A text row's perplexity is exp(mean nats): 800 nats/token overflowed math.exp."""
    from test_leaderboard import record
    results = tmp_path / "results"
    recs = []
    for seed, nats in ((0, 800.0), (1, 900.0)):
        rec = record(task="text", seed=seed)
        rec["metrics"] = {"scoring": "perplexity", "sequences": 64, "roles": {"unigram": "baseline"},
                          "loss": {"model": nats, "unigram": 5.0},
                          "perplexity": {"model": 1e300, "unigram": 148.4},
                          "perplexity_ci": {"model": [1e300, 1e300], "unigram": [140.0, 150.0]},
                          "bits_per_byte": {"model": 1.0, "unigram": 2.0}}
        rec["per_position"] = {"loss.model": [nats] * 8, "loss.unigram": [5.0] * 8}
        recs.append(rec)
    put_records(results, *recs)
    assert main(["leaderboard", f"out_dir={results}", f"out={tmp_path / 'lb.md'}"]) == 0
    assert capsys.readouterr().err == ""
    assert "| inf | [" in (tmp_path / "lb.md").read_text()


def test_a_report_is_never_written_over_a_device(tmp_path, capsys):
    """out=/dev/full (as root) replaced the device node and made /dev/full-figures/: a device
    at out= is refused in one line and left as it was (a copy of /dev/full's node, made here)."""
    import stat
    device = tmp_path / "full"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except (PermissionError, OSError) as error:
        pytest.skip(f"cannot make a device node here: {error}")
    from test_leaderboard import put, record
    results = tmp_path / "results"
    put(results, record())
    for command in READERS:
        args = [command, f"out_dir={results}", f"out={device}"]
        if command == "claims":
            from test_claims import rules_file
            args.append(f"rules={rules_file(tmp_path)}")
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is a device" in err[0], err
        assert stat.S_ISCHR(os.lstat(device).st_mode)
        assert not (tmp_path / "full-figures").exists()
