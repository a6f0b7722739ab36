"""README.md's commands run as written (issue 20): every `python -m bench` line of its bash blocks
runs in-process, in README order (later lines read what earlier ones wrote: records, weights),
in a scratch directory and at a few training steps (those `.ci/run` runs as written are left to
it); the install lines name what `.ci/run` installs; the test command is the one it runs."""
from __future__ import annotations

import glob
import re
import shlex
import shutil
from pathlib import Path

from bench.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI = ROOT / ".ci" / "run"

# What makes a training command cheap: replaces the command's own value of these keys.
FEW_STEPS = {"trainer.max_steps": "3", "trainer.warmup_steps": "0", "trainer.eval_sequences": "16",
             "trainer.bootstrap": "50", "trainer.progress": "false", "trainer.threads": "1",
             "trainer.val_sequences": "8"}
CHEAPER = {"run": FEW_STEPS, "sweep": FEW_STEPS, "suite": {**FEW_STEPS, "entries": "1"},
           "eval": {k: v for k, v in FEW_STEPS.items() if k in (
               "trainer.eval_sequences", "trainer.bootstrap", "trainer.progress", "trainer.threads")},
           "references": {"n": "16"}, "speed": {"steps": "1", "compile": "off",
                                                "precisions": "32-true"}}


def readme_commands(text: str) -> list[str]:
    """The shell commands of the ```bash blocks: continuation lines joined, `&&` chains split,
    comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands += [part.strip() for part in line.split("&&")]
    return commands


def expand(arg: str) -> str:
    """A shell glob of a path (`runs/x--*.json`) as the shell would expand it when it matches one
    file (the newest name when several do); `<run_id>`: the README's first run (Quick start)."""
    key, sep, value = arg.partition("=") if "=" in arg else ("", "", arg)
    if "<run_id>" in value:  # README's placeholder for the run a command printed: its first run's
        # the first written: runs of one second share a time stamp, and their ids' random tails
        # do not sort by age
        first = min(Path("runs").glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        value = value.replace("<run_id>", first.stem)
    matches = sorted(glob.glob(value)) if any(c in value for c in "*?") else []
    value = matches[-1] if matches else value
    return f"{key}={value}" if sep else value


def cheap(argv: list[str], scratch: Path) -> list[str]:
    """argv with the few-steps settings of its command; the published records read, never
    written: a board or claims of results/ go to the scratch directory (those of the runs/
    the commands filled go beside them, as the README says)."""
    command, args = argv[0], argv[1:]
    settings = dict(CHEAPER.get(command, {}))
    if command == "run" and "print_config=true" in args:
        settings = {}
    if command == "compare" and args and all("=" in a for a in args):
        settings = dict(FEW_STEPS)  # by selection: the settings the runs above were made with
    if any(a.startswith("trainer.val_every=") for a in args):
        settings["trainer.val_every"] = "1"
    if command in ("leaderboard", "claims") and not any(a.startswith("out_dir=") for a in args):
        settings["out_dir"] = str(ROOT / "results")  # the published records: read, never written
        if args[:1] == ["plan"]:  # the power plan writes a suite file, and only with out=
            settings["out"] = str(scratch / "plan.yaml")
        elif "check=true" not in args:
            settings["out"] = str(scratch / f"{command}.md")
    for arg in args:  # a report compared with: the README names it from the repository's top
        if command == "claims" and arg.startswith("against="):
            settings["against"] = str(ROOT / arg.split("=", 1)[1])
    if command == "identities" and not any(a.startswith("out_dir=") for a in args):
        settings["out_dir"] = "runs"  # the runs the commands above made; results/ never written
    kept = [expand(a) for a in args if a.split("=", 1)[0] not in settings]
    return [command, *kept, *(f"{k}={v}" for k, v in settings.items())]


def ci_commands() -> list[str]:
    """The `python -m bench` commands .ci/run runs itself, as README writes them."""
    return [line.replace("python3 ", "python ", 1) for line in CI.read_text().splitlines()
            if line.startswith("python3 -m bench ")]


def test_readme_commands_are_found():
    commands = readme_commands(README.read_text())
    bench = [c for c in commands if c.startswith("python -m bench ")]
    assert len(bench) >= 15 and any(c.startswith("pip install") for c in commands)
    assert all(c.startswith(("python -m bench ", "python -m pytest ", "pip install",
                             "MAMBA_FORCE_BUILD=TRUE"))
               for c in commands), [c for c in commands]


def test_the_install_lines_are_what_ci_installs():
    ci = CI.read_text().replace("python3 -m pip", "pip").replace('"', "").replace("--quiet ", "")
    ci = re.sub(r"\\\n\s*", "", ci)
    for command in readme_commands(README.read_text()):
        if command.startswith("pip install -e ."):
            assert "pip install -e .[test]" in ci  # the package with its test extra
        elif command.startswith(("pip install", "MAMBA_FORCE_BUILD")):
            assert command.replace('"', "") in ci, command
        elif command.startswith("python -m pytest"):
            assert command.replace("python", "python3", 1) in CI.read_text(), command
    # the research check, which the README test leaves to CI: CI runs it as README writes it
    assert "python -m bench claims check=true against=claims.md" in ci_commands()


def test_every_bench_command_of_the_readme_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    # The board of results/ goes to scratch/leaderboard.md, whose figures folder starts as the
    # committed board's: the README's command finds those drawn and redraws only what changed
    # (bench/reports/plot.py plot_gaps; drawing 42 sections afresh took 30 s here). Drawing is
    # tested in tests/test_leaderboard.py.
    shutil.copytree(ROOT / "results" / "figures", scratch / "leaderboard-figures")
    failed, run_by_ci = [], ci_commands()
    for command in readme_commands(README.read_text()):
        if not command.startswith("python -m bench ") or command in run_by_ci:
            continue  # what CI runs as written it runs after the tests (17 s for the claims')
        argv = cheap(shlex.split(command)[3:], scratch)
        code = main(argv)
        out = capsys.readouterr()
        if code != 0:
            failed.append(f"{command}\n  as {' '.join(argv)}: exit {code}: {out.err.strip()[-300:]}")
    assert not failed, "\n".join(failed)
    assert (tmp_path / "runs" / "curves.png").is_file()  # `plot runs/` drew the runs above
    # the suite's records went to runs/, and the board and claims of them beside them
    assert not (tmp_path / "results").exists()
    assert (tmp_path / "runs" / "leaderboard.md").is_file()
    assert (tmp_path / "runs" / "claims.md").is_file()
