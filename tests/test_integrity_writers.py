"""Writers of reports check their destination before anything is drawn, and a failure on the
way (a disk that fills up) is one line, exit 2, with nothing left behind: leaderboard, claims and
plot out= on a read-only file system or an over-long path were `internal error: OSError`, and
the leaderboard left its `-figures/` folder behind. Also: compare refuses a run compared with
itself, and the memory check counts the live-validation set."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import bench.reports.leaderboard
from bench.cli.main import main
from test_claims import MAMBA, NOCONV, put, record, rules_file
from test_integrity_records import good

UNWRITABLE = Path("/proc/icl-bench-report.md")  # procfs: no regular file can be made there


def reader(command: str, results: Path, out: str, tmp_path: Path) -> list[str]:
    args = [command, f"out_dir={results}", f"out={out}"]
    return args + ([f"rules={rules_file(tmp_path)}"] if command == "claims" else [])


@pytest.fixture
def results(tmp_path):
    put(tmp_path / "results", good(seed=0), record(NOCONV, gap=0.06))
    return tmp_path / "results"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs procfs")
@pytest.mark.parametrize("command", ["leaderboard", "claims"])
def test_a_report_on_a_file_system_that_takes_no_file_is_one_line(command, results, tmp_path,
                                                                  capsys):
    assert main(reader(command, results, str(UNWRITABLE), tmp_path)) == 2
    err = [line for line in capsys.readouterr().err.splitlines()
           if not line.startswith("warning")]
    assert err == [f"error: out '{UNWRITABLE}' cannot be written: No such file or directory"]
    assert not Path("/proc/icl-bench-report-figures").exists()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs procfs")
def test_plot_on_a_file_system_that_takes_no_file_is_one_line(results, capsys):
    [path] = [p for p in results.iterdir() if "mamba--" in p.name and "conv" not in p.name][:1]
    assert main(["plot", str(path), "out=/proc/icl-bench.png"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: out '/proc/icl-bench.png' cannot be written: No such file or directory"]


@pytest.mark.parametrize("command", ["leaderboard", "claims"])
@pytest.mark.parametrize("shape", ["a 300-byte name", "25 folders of 200 bytes"])
def test_an_over_long_out_path_is_one_line(command, shape, results, tmp_path, capsys):
    out = (tmp_path / ("a" * 300 + ".md") if shape == "a 300-byte name"
           else tmp_path.joinpath(*["b" * 200] * 25, "x.md"))
    assert main(reader(command, results, str(out), tmp_path)) == 2
    err = [line for line in capsys.readouterr().err.splitlines()
           if not line.startswith("warning")]
    assert len(err) == 1 and ("File name too long" in err[0]
                              or "bytes; file systems allow" in err[0]), err
    assert len(err[0]) < 300  # the path is shortened in the message


def test_a_disk_that_fills_up_while_the_board_is_written_leaves_nothing(results, tmp_path,
                                                                       capsys, monkeypatch):
    def full(path, write):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(bench.reports.leaderboard, "write_atomic", full)
    out = tmp_path / "board.md"
    assert main(["leaderboard", f"out_dir={results}", f"out={out}"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {out} not written: No space left on device"]
    assert not out.exists() and not (tmp_path / "board-figures").exists()


def test_a_full_disk_keeps_a_figures_folder_that_was_there(results, tmp_path, monkeypatch):
    """Only what this writer made is removed: an earlier board's folder stays."""
    out = tmp_path / "board.md"
    assert main(["leaderboard", f"out_dir={results}", f"out={out}"]) == 0
    before = sorted(p.name for p in (tmp_path / "board-figures").iterdir())
    monkeypatch.setattr(bench.reports.leaderboard, "write_atomic",
                        lambda path, write: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    assert main(["leaderboard", f"out_dir={results}", f"out={out}"]) == 2
    assert sorted(p.name for p in (tmp_path / "board-figures").iterdir()) == before


def test_compare_refuses_a_file_compared_with_itself(tmp_path, capsys):
    put(tmp_path, good(seed=0))
    [a] = list(tmp_path.glob("*.json"))
    assert main(["compare", str(a), str(a)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "are the same file" in err


def test_the_memory_check_counts_the_live_validation_set(tmp_path, capsys):
    out_dir = tmp_path / "runs"
    assert main(["run", "trainer.val_every=10", f"trainer.val_sequences={10**12}",
                 "trainer.max_steps=2", f"out_dir={out_dir}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the live-validation set" in err \
        and "reduce trainer.val_sequences" in err
    assert not out_dir.exists()


def test_a_validation_set_that_fits_is_no_reason_to_refuse(tmp_path):
    from bench.training.checks import checked_task
    from bench.config import compose
    from bench.training.memory import memory_estimate
    small, large = (compose(["trainer.val_every=10", f"trainer.val_sequences={n}"])
                    for n in (64, 10**6))
    part, grown = ([term for term in memory_estimate(c, checked_task(c), "cpu").terms
                    if "live-validation" in term.what] for c in (small, large))
    assert len(part) == len(grown) == 1 and 0 < part[0].bytes * 10**4 < grown[0].bytes * 1.01


del MAMBA  # imported for the fixtures' selectors only
