"""The leaderboard's pooling rules (distinct seeds, one held-out set, one code version), what it
leaves out and says so (ad-hoc, duplicate, failed and unreadable records), how it refuses bad
input without touching the existing board, and the colours of its figures."""
import itertools
import json
import math
import os
import shutil
import stat
import subprocess
from pathlib import Path

import matplotlib.colors
import matplotlib.pyplot as plt
import pytest

from bench.reports import leaderboard
from bench.records import store as records
from bench.cli.main import main
from bench.config import ConfigError
from bench.config.formats import fmt_sig
from bench.reports.leaderboard import write_leaderboard
from bench.reports.selection import select_runs
from bench.reports.plot import curve_styles, gap_figure
from bench.records.store import SCHEMA, provenance, read_records

REPO = Path(__file__).resolve().parents[1]
_ids = itertools.count()


def record(task="markov", model="mamba", seed=0, stamp="20260101-120000", gap=0.1, sequences=64,
           commit="a" * 40, dirty=False, origin="suite:leaderboard", **extra) -> dict:
    """A minimal `ok` run record with everything the leaderboard reads."""
    loss = {"bayes": 1.0, "unigram": 1.5, "model": 1.0 + gap}
    rec = {"schema": SCHEMA, "run_id": f"{task}--{model}--s{seed}--{stamp}-{next(_ids):06x}",
           "task": {"name": task, "config": {"order": 1, "seq_len": 8}},
           "model": {"name": model, "config": {"d_model": 8}},
           "trainer": {"name": "default", "config": {"max_steps": 10, "lr": 0.01,
                                                     "eval_sequences": sequences}},
           "seed": seed, "overrides": [], "origin": origin,
           "provenance": {"commit": commit, "dirty": dirty}, "status": "ok",
           "params": 100, "state_size": 16, "train": {"steps": 10, "wall_time_s": 1.0},
           "metrics": {"gap_reference": "bayes", "gap_reference_role": "bayes", "loss": loss,
                       "gap": {k: v - 1.0 for k, v in loss.items()},
                       "gap_ci": {k: [v - 1.01, v - 0.99] for k, v in loss.items()},
                       "roles": {"bayes": "bayes", "unigram": "baseline"}, "accuracy": {},
                       "bayes_gap": gap, "bayes_gap_ci": [gap - 0.01, gap + 0.01],
                       "relative_gap": gap, "sequences": sequences},
           "per_position": {"gap.model": [gap] * 8, "gap.unigram": [0.5] * 8}}
    if origin is None:  # legacy records lack origin and provenance.dirty
        rec.pop("origin")
    if dirty is None:
        rec["provenance"].pop("dirty")
    rec.update(extra)
    return rec


def put(directory: Path, *recs: dict) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for rec in recs:
        paths.append(directory / f"{rec['run_id']}.json")
        paths[-1].write_text(json.dumps(rec))
    return paths


def model_rows(text: str) -> list[dict]:
    """The rows of every model table: {section, model, code, gap, seeds}."""
    rows, section = [], None
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:]
        elif line.startswith("| ") and not line.startswith(("| model", "| reference")):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 10:
                rows.append({"section": section, "model": cells[0], "code": cells[1],
                             "gap": float(cells[2]), "seeds": int(cells[8])})
    return rows


def build(out_dir: Path, out: Path, include="suite") -> str:
    selection = select_runs(str(out_dir), include)
    write_leaderboard(selection, str(out))
    return out.read_text()


def test_a_seed_counts_once_and_its_newest_record_is_used(tmp_path):
    old, new = (record(seed=0, stamp="20260101-120000", gap=0.5),
                record(seed=0, stamp="20260101-130000", gap=0.3, resumed_from="ckpt"))
    paths = put(tmp_path / "results", old, new, record(seed=1, gap=0.1))
    # the older run is read last and its file is the newer one: the run_id's stamp decides
    paths[0].rename(tmp_path / "results" / "zz-copy.json")
    os.utime(tmp_path / "results" / "zz-copy.json", (2e9, 2e9))
    os.utime(paths[1], (1e9, 1e9))
    text = build(tmp_path / "results", tmp_path / "lb.md")
    (row,) = model_rows(text)
    assert row["seeds"] == 2 and row["gap"] == pytest.approx((0.3 + 0.1) / 2, abs=1e-4)
    assert "1 duplicate record (re-runs or resumed copies of a seed already counted)" in text
    assert select_runs(str(tmp_path / "results")).duplicates == 1


def test_held_out_sets_of_different_sizes_are_separate_sections(tmp_path):
    put(tmp_path / "results", record(seed=0, gap=0.2, sequences=64),
        record(seed=1, gap=0.4, sequences=128))
    rows = model_rows(build(tmp_path / "results", tmp_path / "lb.md"))
    assert len(rows) == 2 and [r["seeds"] for r in rows] == [1, 1]
    assert {r["section"].split(", ")[1]: r["gap"] for r in rows} == {
        "64 held-out sequences": 0.2, "128 held-out sequences": 0.4}
    assert len(list((tmp_path / "lb-figures").glob("markov-*.png"))) == 2


def test_a_new_board_removes_the_section_figures_it_no_longer_draws(tmp_path):
    put(tmp_path / "results", record(seed=0, gap=0.2, sequences=64))
    figures = tmp_path / "lb-figures"
    figures.mkdir()
    stale = figures / "markov-0123abcd-n64.png"
    mine = figures / "my-notes.png"  # not a name the board gives: kept
    stale.write_bytes(b"old")
    mine.write_bytes(b"mine")
    build(tmp_path / "results", tmp_path / "lb.md")
    assert not stale.exists() and mine.exists()
    assert len(list(figures.glob("markov-*-n64.png"))) == 1


def test_rows_pool_only_one_code_version_and_the_table_shows_the_newest(tmp_path):
    """Code versions never pool; the table shows the row of the newest record (what the code does
    now) and names the older versions' rows, with their intervals, below it."""
    put(tmp_path / "results",
        record(seed=0, gap=0.1), record(seed=1, gap=0.3),  # one row, two seeds
        record(seed=0, gap=0.5, dirty=True, stamp="20260101-110000"),
        record(seed=0, gap=0.7, commit="b" * 40, stamp="20260101-100000"),
        record(seed=0, gap=0.9, commit="c" * 40, dirty=None, stamp="20260101-090000"))
    text = build(tmp_path / "results", tmp_path / "lb.md")
    rows = model_rows(text)
    assert [(r["code"], r["gap"], r["seeds"]) for r in rows] == [
        ("aaaaaaa", pytest.approx(0.2), 2)]
    (note,) = [line for line in text.splitlines() if line.startswith("Older code versions")]
    assert note == ("Older code versions of rows above, left out of the table: "
                    + "; ".join(f"mamba @ {code}: gap [{fmt_sig(gap - 0.01)}, {fmt_sig(gap + 0.01)}], "
                                "1 seed" for code, gap in [("ccccccc?", 0.9), ("bbbbbbb", 0.7),
                                                           ("aaaaaaa+dirty", 0.5)]) + ".")
    selection = select_runs(str(tmp_path / "results"))
    assert selection.duplicates == 0 and selection.superseded == 3  # seed 0 once per version
    assert "3 of them by older code versions of a row, named below its section's table" in text


def test_commits_with_the_same_code_pool_into_one_row(tmp_path):
    """A commit that changed only README, tests or results runs the same code: its records pool
    with the previous commit's (provenance.code: the digest of bench/ tasks/ models/ conf/
    pyproject.toml), shown with the newest record's commit; different code, different rows."""
    same = {"provenance": {"commit": "d" * 40, "code": "c0de", "dirty": False}}
    put(tmp_path / "results",
        record(seed=0, gap=0.1, stamp="20260101-120000", **same),
        record(seed=1, gap=0.3, stamp="20260101-130000",
               provenance={"commit": "e" * 40, "code": "c0de", "dirty": False}),
        record(seed=2, gap=0.5, provenance={"commit": "f" * 40, "code": "0the", "dirty": False}))
    selection = select_runs(str(tmp_path / "results"))
    (section,) = selection.sections
    assert sorted(len(runs) for runs in section.rows.values()) == [2]
    assert [len(runs) for runs in section.superseded.values()] == [1]


def test_a_config_field_added_later_with_its_default_does_not_split_a_section(tmp_path):
    """Records written before a task field existed lack it: they read as that field's default,
    so they pool with newer records that carry it (records.config_matches reads them the same)."""
    newer = record(seed=1, gap=0.3)
    newer["task"]["family"] = "markov"
    newer["task"]["config"]["num_tasks"] = 0  # markov's default: an infinite task pool
    older = record(seed=0, gap=0.1)
    older["task"]["family"] = "markov"
    other = record(seed=2, gap=0.5)
    other["task"]["family"] = "markov"
    other["task"]["config"]["num_tasks"] = 4  # not the default: another task
    put(tmp_path / "results", older, newer, other)
    selection = select_runs(str(tmp_path / "results"))
    assert sorted(sum(len(r) for r in s.rows.values()) for s in selection.sections) == [1, 2]


H100 = {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "kernel": "mamba_ssm",
        "precision": "32-true", "compile": False, "tf32": False}


def trained(where: dict, **rec) -> dict:
    """A record of the Mamba config below whose `train` part says `where` (device, kernel...)."""
    rec = record(**rec)
    rec["model"]["config"]["kernel"] = "auto"
    rec["trainer"]["config"].update(precision="32-true", compile=False)
    rec["train"].update(where)
    return rec


def test_cpu_and_gpu_runs_of_one_config_are_separate_rows(tmp_path):
    """`auto` settings resolve differently on a GPU: a GPU run of a seed neither replaces its CPU
    record nor pools with it, and its row says where it ran; an old CPU record (no device_name,
    tf32, kernel, precision or compile in `train`) pools with a new one."""
    put(tmp_path / "results",
        trained({"device": "cpu"}, seed=0, gap=0.1),  # as records before those fields were
        trained({"device": "cpu", "device_name": "cpu", "kernel": "torch", "precision": "32-true",
                 "compile": False, "tf32": False}, seed=1, gap=0.3),
        trained(H100, seed=0, gap=0.7, stamp="20260102-120000"))
    rows = model_rows(build(tmp_path / "results", tmp_path / "lb.md"))
    assert {r["model"]: (r["gap"], r["seeds"]) for r in rows} == {
        "mamba": (pytest.approx(0.2), 2),
        "mamba [cuda: NVIDIA H100 80GB HBM3, mamba_ssm]": (0.7, 1)}
    assert select_runs(str(tmp_path / "results")).duplicates == 0
    assert records.environment(trained({"device": "cuda:1"})).device == "cuda"  # name unknown
    assert records.environment(trained({**H100, "tf32": True})).name == (
        "cuda: NVIDIA H100 80GB HBM3, mamba_ssm, tf32")


def test_the_code_digest_follows_the_code_not_the_commit(tmp_path, monkeypatch):
    import bench.records.store as records
    repo = tmp_path / "repo"
    for path in records.CODE_PATHS[:-1]:
        (repo / path).mkdir(parents=True)
        (repo / path / "x.py").write_text("x = 1\n")
    (repo / "pyproject.toml").write_text("[project]\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "code")
    monkeypatch.setattr(records, "REPO", repo)
    head = lambda: subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"],  # noqa: E731
                                  capture_output=True, text=True).stdout.strip()
    first = head()
    (repo / "README.md").write_text("words\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "docs only")
    docs = head()
    (repo / "conf" / "suite").mkdir()  # a suite's list and a claim's rule shape no result
    (repo / "conf" / "suite" / "s.yaml").write_text("runs: []\n")
    (repo / "conf" / "papers" / "000" / "suites").mkdir(parents=True)
    (repo / "conf" / "papers" / "000" / "claims.yaml").write_text("claims: []\n")
    (repo / "conf" / "papers" / "000" / "suites" / "p.yaml").write_text("runs: []\n")
    (repo / "bench" / "claims.py").write_text("rule = 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "downstream only")
    downstream = head()
    (repo / "tasks" / "x.py").write_text("x = 2\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "code change")
    changed = head()
    assert records.code_digest(first) == records.code_digest(docs) is not None
    assert records.code_digest(downstream) == records.code_digest(first)
    assert records.code_digest(changed) != records.code_digest(first)
    assert records.code_digest("0" * 40) is None


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True, timeout=30)


def test_provenance_commit_and_dirty_code(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    (repo / "bench" / "x.py").write_text("a = 1\n")
    (repo / "README.md").write_text("text\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "first")
    monkeypatch.setattr(records, "REPO", repo)
    clean = provenance()
    assert len(clean["commit"]) == 40 and clean["dirty"] is False
    (repo / "README.md").write_text("other text\n")  # not code: still clean
    assert provenance()["dirty"] is False
    (repo / "bench" / "claims.py").write_text("rule = 2\n")  # reads records only: still clean
    assert provenance()["dirty"] is False
    (repo / "bench" / "x.py").write_text("a = 2\n")
    assert provenance() == {**clean, "dirty": True}


def test_provenance_is_none_outside_a_checkout_and_never_raises(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "REPO", tmp_path)  # no checkout at all
    assert (provenance()["commit"], provenance()["dirty"]) == (None, None)
    (tmp_path / "site-packages").mkdir()  # an installed copy inside someone else's checkout
    (tmp_path / "f").write_text("x")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "f")
    git(tmp_path, "commit", "-qm", "theirs")
    monkeypatch.setattr(records, "REPO", tmp_path / "site-packages")
    assert (provenance()["commit"], provenance()["dirty"]) == (None, None)
    monkeypatch.setattr(records, "REPO", REPO)
    for error in (subprocess.TimeoutExpired("git", 5), FileNotFoundError("git")):
        def broken(*args, **kwargs):
            raise error
        monkeypatch.setattr(records.subprocess, "run", broken)
        assert (provenance()["commit"], provenance()["dirty"]) == (None, None)


def test_ad_hoc_and_legacy_records_need_include_all(tmp_path, capsys):
    results = tmp_path / "results"
    put(results, record(model="mamba"), record(model="lstm", origin="adhoc"),
        record(model="gru", origin=None))  # legacy: no origin, counts as ad-hoc
    board = tmp_path / "lb.md"
    assert main(["leaderboard", f"out_dir={results}", f"out={board}"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"{board}: 1 run (2 ad-hoc records in {results}/ not included; include=all adds them)")
    assert [r["model"] for r in model_rows(board.read_text())] == ["mamba"]
    assert "2 ad-hoc records" in board.read_text()
    assert main(["leaderboard", f"out_dir={results}", f"out={board}", "include=all"]) == 0
    assert capsys.readouterr().out.strip() == f"{board}: 3 runs"
    assert sorted(r["model"] for r in model_rows(board.read_text())) == ["gru", "lstm", "mamba"]


@pytest.mark.parametrize("case,needle", [
    ("missing", "does not exist"), ("file", "is not a directory"),
    ("empty", "no usable run record in"), ("adhoc", "1 ad-hoc record in"),
    ("failed", "1 failed run left out"), ("unknown", "include=suite|all"),
    ("include", "include must be one of suite|all"), ("out", "is a directory"),
])
def test_bad_input_is_one_line_exit_2_and_keeps_the_board(tmp_path, capsys, case, needle):
    board = tmp_path / "lb.md"
    board.write_text("the committed board")
    results = tmp_path / "results"
    results.mkdir()
    args = [f"out_dir={results}", f"out={board}"]
    if case == "missing":
        args[0] = f"out_dir={tmp_path / 'nope'}"
    elif case == "file":
        args[0] = f"out_dir={board}"
    elif case == "adhoc":
        put(results, record(origin="adhoc"))
    elif case == "failed":
        put(results, {**record(), "status": "failed"})
    elif case == "unknown":
        put(results, record())
        args.append("figures=x")
    elif case == "include":
        args.append("include=some")
    elif case == "out":
        put(results, record())
        args[1] = f"out={tmp_path}"
    assert main(["leaderboard", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and len(err.splitlines()) == 1
    if case == "unknown":
        assert "out_dir=" in err and "out=" in err
    assert board.read_text() == "the committed board"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lb.md", "results"]


def test_a_failed_write_leaves_the_old_board_and_no_temporary_file(tmp_path, monkeypatch):
    put(tmp_path / "results", record())
    board = tmp_path / "lb.md"
    board.write_text("old")
    real = os.replace

    def replace(src, dst):
        if str(dst).endswith(".md"):
            raise OSError("disk full")
        real(src, dst)
    monkeypatch.setattr(leaderboard.os, "replace", replace)
    with pytest.raises(ConfigError, match="not written: disk full"):  # one line, exit 2
        build(tmp_path / "results", board)
    assert board.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_unreadable_and_failed_records_are_named_and_counted(tmp_path, capsys):
    results = tmp_path / "results"
    put(results, record(seed=0), {**record(seed=1), "status": "failed"})
    (results / "broken.json").write_text("{not json")
    (results / "list.json").write_text("[1, 2]")
    (results / "other.json").write_text(json.dumps({"schema": "someone/else/1"}))
    no_metrics = record(seed=2)
    del no_metrics["metrics"]["sequences"]
    (results / "partial.json").write_text(json.dumps(no_metrics))
    (results / ".tmp-abc.json").write_text("{half a rec")  # write_record's temporary: ignored

    found, bad = read_records(results)
    assert len(found) == 2  # a record that fails bench.records.schema is refused where it is read
    assert bad == [(str(results / "broken.json"), "not valid JSON"),
                   (str(results / "list.json"), "not a JSON object"),
                   (str(results / "other.json"),
                    f"schema 'someone/else/1', expected '{SCHEMA}'"),
                   (str(results / "partial.json"), "missing or malformed metrics.sequences")]

    board = tmp_path / "lb.md"
    assert main(["leaderboard", f"out_dir={results}", f"out={board}"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"warning: skipped {results / 'broken.json'}: not valid JSON",
        f"warning: skipped {results / 'list.json'}: not a JSON object",
        f"warning: skipped {results / 'other.json'}: schema 'someone/else/1', expected '{SCHEMA}'",
        f"warning: skipped {results / 'partial.json'}: missing or malformed metrics.sequences"]
    assert out.strip() == f"{board}: 1 run (1 failed run left out; 4 unreadable records skipped)"
    assert "1 failed run left out; 4 unreadable records skipped" in board.read_text()


@pytest.mark.parametrize("models,references", [(4, 3), (9, 3), (25, 3)])
def test_curve_colours_never_repeat_and_references_are_dashed(models, references):
    styles = curve_styles(models, references)
    assert len({colour for colour, _ in styles}) == models + references
    fig = gap_figure("t", {f"m{i}": [[0.1, 0.2]] for i in range(models)},
                     {f"r{i}": [0.3, 0.4] for i in range(references)}, "gap")
    try:
        lines = fig.axes[0].lines  # the curves and the zero line
        colours = [matplotlib.colors.to_rgb(line.get_color()) for line in lines]
        assert len(lines) == models + references + 1 and len(set(colours)) == len(colours)
        assert [line.get_linestyle() for line in lines[:-1]] == ["-"] * models + ["--"] * references
    finally:
        plt.close(fig)


def test_the_committed_records_still_make_a_board(tmp_path):
    """Records older than `origin` and `dirty` are all usable with include=all and render; a
    board written under another name keeps its figures beside it, not in the results directory.
    (Rendering is limited to two tasks: the figures are the slow part.)"""
    committed = sorted((REPO / "results").glob("*.json"))
    if not committed:
        pytest.skip("no committed records")
    results = tmp_path / "results"
    results.mkdir()
    for path in committed:
        shutil.copy(path, results)
    selection = select_runs(str(results), "all")
    assert selection.bad == [] and selection.runs > 0
    selection.sections = selection.sections[:2]
    board = tmp_path / "lb.md"
    write_leaderboard(selection, str(board))
    text = board.read_text()
    assert len(model_rows(text)) > 0 and text.count("![per-position gap](lb-figures/") == 2
    assert not (results / "figures").exists()


@pytest.mark.parametrize("command,kind", [
    *(("leaderboard", kind) for kind in ("symlink", "fifo", "figures-symlink", "figures-file")),
    ("claims", "symlink"), ("claims", "fifo")])  # claims.md has no figures
def test_a_report_is_never_written_through_a_path_it_did_not_create(tmp_path, capsys, command,
                                                                     kind):
    """out= naming a symlink, a FIFO (or a device), or a figures folder that is a link or a
    file: one line, exit 2, and every one of them as it was."""
    results = tmp_path / "results"
    put(results, record())
    target = tmp_path / "target.md"
    target.write_text("the link's target")
    out = tmp_path / "report.md"
    if kind == "symlink":
        out.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(out)
    elif kind == "figures-symlink":
        (tmp_path / "report-figures").symlink_to(tmp_path)
    else:
        (tmp_path / "report-figures").write_text("a file")
    assert main([command, f"out_dir={results}", f"out={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert ("a symlink" if "symlink" in kind else "a FIFO" if kind == "fifo" else "a file") in err
    assert target.read_text() == "the link's target"
    if kind == "symlink":
        assert out.is_symlink()
    if kind == "fifo":
        assert stat.S_ISFIFO(os.lstat(out).st_mode)


def spoil(rec: dict, change: str) -> dict:
    """rec with one field gone wrong as the issue's malformed records were (also used by
    tests/test_bad_input.py on the claims' records); "none" leaves it as it is."""
    m = rec["metrics"]
    if change == "seed true":
        rec["seed"] = True  # JSON's true is no seed 1
    elif change == "raw NaN":
        m["bayes_gap"] = math.nan  # json.dumps writes a bare NaN
    elif change == "interval of 3":
        m["bayes_gap_ci"] = [0.1, 0.2, 0.3]
    elif change == "strings in a curve":
        rec["per_position"]["gap.model"] = ["0.1", 0.2]
    elif change == "overrides: 5":
        rec["overrides"] = 5
    elif change == "infinite gap":
        m["gap"]["model"] = math.inf
    return rec


@pytest.mark.parametrize("change,reason", [
    ("seed true", "seed"), ("raw NaN", "metrics.bayes_gap (not a finite number)"),
    ("interval of 3", "not a pair of numbers"), ("strings in a curve", "per_position.gap.model"),
    ("overrides: 5", "overrides"), ("infinite gap", "not a finite number: metrics.gap.model")])
def test_a_malformed_record_is_named_and_left_out_not_pooled(tmp_path, capsys, change, reason):
    """A schema-valid record with a mistyped field is named in a warning and left out: JSON's
    `true` is not seed 1 (it replaced the real seed-1 record), a NaN does not blank a row."""
    results = tmp_path / "results"
    good = record(seed=1, gap=0.1)
    bad_path = put(results, good, spoil(record(seed=1, gap=0.3), change))[1]
    board = tmp_path / "lb.md"
    assert main(["leaderboard", f"out_dir={results}", f"out={board}"]) == 0
    err = capsys.readouterr().err
    assert f"warning: skipped {bad_path}" in err
    assert any(part in err for part in reason.split("|")), err
    rows = model_rows(board.read_text())
    assert len(rows) == 1 and rows[0]["gap"] == pytest.approx(0.1)


def test_a_record_nested_too_deeply_is_named(tmp_path, capsys):
    results = tmp_path / "results"
    put(results, record())
    deep = results / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    assert main(["leaderboard", f"out_dir={results}", f"out={tmp_path / 'lb.md'}"]) == 0
    assert f"warning: skipped {deep}: JSON nested too deeply" in capsys.readouterr().err


# --- figures (bench/reports/plot.py) and python -m bench plot -----------------------------------------
def test_the_gap_axis_turns_symlog_only_when_references_are_off_the_models_scale():
    from bench.reports.plot import gap_scale
    models = {"a": [1e-4, -2e-4, None], "b": [5e-4]}
    assert gap_scale(models, {"erm": [5.0]}) == ("symlog", pytest.approx(5e-4))
    # 10x flattened the room task's 0.02 and 0.06 models under erm's 1.9: symlog too
    assert gap_scale(models, {"unigram": [5e-3]}) == ("symlog", pytest.approx(5e-4))
    assert gap_scale(models, {"unigram": [1e-3]}) == ("linear", None)  # 2x: readable as is
    assert gap_scale({"a": [0.0]}, {"erm": [5.0]}) == ("linear", None)  # nothing to zoom on
    fig = gap_figure("t", {name: [curve] for name, curve in models.items()},
                     {"erm": [5.0, 5.0, 5.0]}, "nats")
    assert fig.axes[0].get_yscale() == "symlog"
    plt.close(fig)


def test_plot_draws_records_and_names_what_it_skips(tmp_path, capsys):
    """`python -m bench plot`: one PNG of the usable records of a directory; a failed record
    and a non-record are named and skipped; nothing usable or a stray option is exit 2."""
    ok = [record(model=m, seed=s, train={"steps": 10, "wall_time_s": 1.0,
                                         "loss_curve": [[0, 0.7], [5, 0.6]]})
          for m in ("mamba", "transformer") for s in (0, 1)]
    put(tmp_path / "runs", *ok, record(seed=3, status="failed"))
    (tmp_path / "runs" / "notes.json").write_text("[1]")
    assert main(["plot", str(tmp_path / "runs")]) == 0
    figure = tmp_path / "runs" / "curves.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    err = capsys.readouterr().err
    assert "notes.json: not a JSON object" in err and "status 'failed'" in err
    single = put(tmp_path / "one", ok[0])[0]
    assert main(["plot", str(single)]) == 0 and single.with_suffix(".png").is_file()
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert main(["plot", str(single), "colour=red"]) == 2
    put(tmp_path / "bad", record(status="failed"))
    assert main(["plot", str(tmp_path / "bad")]) == 2
    link = tmp_path / "link.png"
    link.symlink_to(tmp_path / "target.png")
    assert main(["plot", str(single), f"out={link}"]) == 2  # writers never write through links
    assert not (tmp_path / "target.png").exists()


def test_a_partial_rerun_by_newer_code_adds_a_row_and_never_replaces_more_seeds(tmp_path):
    """A newer code version replaces an older one only with at least as many seeds: until then
    both rows are shown, the newer marked incomplete (the claims keep the older row's seeds:
    tests/test_claims.py)."""
    old = [record(seed=s, gap=0.1, commit="a" * 40, stamp="20260101-100000") for s in range(3)]
    new = [record(seed=s, gap=0.1, commit="b" * 40, stamp="20260102-100000") for s in range(2)]
    put(tmp_path / "results", *old, *new)
    text = build(tmp_path / "results", tmp_path / "lb.md")
    assert sorted((r["code"], r["seeds"]) for r in model_rows(text)) == [
        ("aaaaaaa", 3), ("bbbbbbb (incomplete: 2 of 3 seeds)", 2)]
    assert "Older code versions" not in text
    # the third seed by the newer code: it replaces the older row, which is named below
    put(tmp_path / "results", record(seed=2, gap=0.1, commit="b" * 40, stamp="20260102-110000"))
    text = build(tmp_path / "results", tmp_path / "lb.md")
    assert [(r["code"], r["seeds"]) for r in model_rows(text)] == [("bbbbbbb", 3)]
    assert "Older code versions of rows above, left out of the table: mamba @ aaaaaaa" in text


def test_boards_of_other_records_go_beside_them_and_a_tracked_board_says_so(tmp_path, capsys,
                                                                          monkeypatch):
    """leaderboard and claims without out=: from results/ the published files at the top (one
    line says when they rewrite a file git tracks); from any other folder (runs/) a board and
    claims beside those records, never over the published ones."""
    from bench.cli.main import main
    monkeypatch.chdir(tmp_path)
    put(tmp_path / "runs", record(seed=0), record(seed=1, gap=0.3))
    assert main(["leaderboard", "out_dir=runs"]) == 0  # claims alike: tests/test_readme.py
    assert (tmp_path / "runs" / "leaderboard.md").is_file()
    assert not (tmp_path / "leaderboard.md").exists()
    assert "tracked by git" not in capsys.readouterr().out
    put(tmp_path / "results", record(seed=0))
    git(tmp_path, "init", "-q")
    assert main(["leaderboard"]) == 0
    git(tmp_path, "add", "leaderboard.md")
    capsys.readouterr()
    assert main(["leaderboard"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "note: leaderboard.md is tracked by git (a published report), unchanged")
    put(tmp_path / "results", record(seed=1, gap=0.3))
    assert main(["leaderboard"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "note: leaderboard.md is tracked by git (a published report), rewritten: `git diff` "
        "shows what changed")
