"""Bad inputs that escaped the third fault trial (issue 45): each is one line and exit 2, or a
warning that names the file, and no record with an impossible value or a provenance git would
resolve to today's code counts."""
from __future__ import annotations

import errno
import json
import tempfile

import pytest

import bench.reports.identities as identities
import bench.training.memory as memory
from bench.cli.main import main
from bench.cli.suites import finished_runs
from bench.config import compose
from bench.records import store
from bench.records.store import read_record
from test_claims import MAMBA, NOCONV, put, record
from test_integrity_records import good


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("warning")]
    assert len(err) == 1, err
    return err[0]


@pytest.fixture
def no_probes(monkeypatch):
    """identities without today's probes (as in a dirty checkout): nothing is trained here."""
    monkeypatch.setattr(identities, "current_code", lambda: None)


def test_an_identity_index_that_is_a_folder_is_refused_before_any_probe(tmp_path, capsys,
                                                                         monkeypatch):
    put(tmp_path, good(seed=0))
    (tmp_path / "identities.json").mkdir()
    monkeypatch.setattr(identities, "fill", lambda *a, **k: pytest.fail("probes ran"))
    assert main(["identities", f"out_dir={tmp_path}"]) == 2
    assert one_error_line(capsys) == (f"error: the identity index '{tmp_path}/identities.json' "
                                      "is a directory; it must be a file")


def test_an_identity_index_that_cannot_be_written_is_refused_before_any_probe(tmp_path, capsys,
                                                                              monkeypatch):
    put(tmp_path, good(seed=0))

    def refused(*args, **kwargs):  # a read-only file system (as root, chmod would not stop it)
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refused)
    monkeypatch.setattr(identities, "fill", lambda *a, **k: pytest.fail("probes ran"))
    assert main(["identities", f"out_dir={tmp_path}"]) == 2
    assert one_error_line(capsys).endswith("cannot be written: Read-only file system")


def test_identities_names_a_record_it_leaves_out(tmp_path, capsys, no_probes):
    reversed_ci = good(seed=1)
    reversed_ci["metrics"]["bayes_gap_ci"] = reversed_ci["metrics"]["bayes_gap_ci"][::-1]
    put(tmp_path, good(seed=0), reversed_ci)
    assert main(["identities", f"out_dir={tmp_path}"]) == 0
    out, err = capsys.readouterr()
    assert f"warning: skipped {tmp_path / (reversed_ci['run_id'] + '.json')}: " \
           "metrics.bayes_gap_ci is reversed" in err
    assert ": 1 record," in out


def test_a_damaged_record_that_finished_a_run_is_named_when_the_run_runs_again(tmp_path, capsys,
                                                                               monkeypatch):
    monkeypatch.setattr(store, "provenance", lambda: {"commit": "a" * 40, "code": "c0de",
                                                      "dirty": False})
    config = compose([*MAMBA, f"out_dir={tmp_path}"])
    config.origin = "sweep"
    (tmp_path / "markov--mamba--s0--20260101-120000-000000.json").write_text('{"schema": ')
    assert finished_runs([config]) == {}
    err = capsys.readouterr().err
    assert "warning: skipped " in err and "s0--20260101-120000-000000.json: not valid JSON; " \
                                         "it finishes no run" in err


def test_compare_names_a_newest_record_it_cannot_read(tmp_path, capsys):
    older, newer = good(seed=0), good(seed=0, stamp="20260102-120000")
    put(tmp_path, older)
    bad = tmp_path / f"{newer['run_id']}.json"
    bad.write_text(json.dumps(newer)[:200])  # truncated
    main(["compare", *MAMBA[:-1], "model=mamba,transformer", f"out_dir={tmp_path}"])
    assert f"warning: skipped {bad}: not valid JSON" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["seed=²"], "error: compare: seed must be a number, got '²'"),
    (["seed=１"], "error: compare: seed must be a number, got '１'"),
    (["task=markov"], "error: compare: 'task' is given twice; give each key once"),
    (["out_dir=elsewhere"], "error: compare: 'out_dir' is given twice; give each key once"),
], ids=["superscript", "fullwidth", "task twice", "out_dir twice"])
def test_compare_refuses_what_it_read_loosely(args, message, tmp_path, capsys):
    put(tmp_path, good(seed=0))
    assert main(["compare", "task=lgssm", "model=mamba,transformer", f"out_dir={tmp_path}",
                 *args]) == 2
    assert one_error_line(capsys) == message


def test_a_suite_file_nested_too_deeply_is_one_line(tmp_path, capsys):
    deep = tmp_path / "deep.yaml"
    deep.write_text("runs: " + "[" * 20000 + "]" * 20000 + "\n")
    assert main(["suite", f"name={deep}", f"out_dir={tmp_path}"]) == 2
    assert one_error_line(capsys) == f"error: suite file {deep} is not valid YAML: nested too deeply"


@pytest.mark.parametrize("field", ["train.wall_time_s", "wall_time_s"])
def test_a_time_no_run_takes_is_refused(field, tmp_path):
    rec = good(seed=0)
    rec["wall_time_s"] = 2.0
    *parents, last = field.split(".")
    target = rec
    for key in parents:
        target = target[key]
    target[last] = 1e308
    put(tmp_path, rec)
    found, reason = read_record(tmp_path / f"{rec['run_id']}.json")
    assert found is None and reason == f"missing or malformed {field} (over a year)"
    target[last] = 86400.0  # a day is a time a run takes
    put(tmp_path, rec)
    assert read_record(tmp_path / f"{rec['run_id']}.json")[0] is not None


@pytest.mark.parametrize("commit", ["HEAD", "main", "HEAD~0", "a" * 7])
def test_a_commit_that_names_todays_code_is_not_resolved(commit):
    """A record's provenance.commit "HEAD" resolved to today's checkout and counted current."""
    assert store.code_digest(commit) is None
    rec = good(seed=0)
    rec["provenance"] = {"commit": commit, "dirty": False}
    assert identities.record_code(rec) == (None, None, "its commit is not a full commit hash")


def test_the_full_hash_of_this_checkout_is_still_resolved():
    head = store.provenance()["commit"]
    if head is None:
        pytest.skip("not a git checkout")
    assert store.code_digest(head) is not None


@pytest.mark.parametrize("option", ["include=bogus", "out_dir=/nonexistent/records",
                                    "out=/nonexistent/folder/claims.md"])
@pytest.mark.parametrize("command", [["claims"], ["claims", "plan"], ["leaderboard"]])
def test_reports_refuse_their_options_before_reading_rules_or_records(command, option, capsys,
                                                                      monkeypatch):
    import bench.reports.claims
    import bench.reports.selection
    monkeypatch.setattr(bench.reports.selection, "read_records",
                        lambda *a: pytest.fail("records were read"))
    monkeypatch.setattr(bench.reports.claims, "load_claims",
                        lambda *a: pytest.fail("the rules were read"))
    if command == ["claims", "plan"] and option.startswith("out="):
        option = "out=/nonexistent/folder/plan.yaml"
    assert main([*command, option]) == 2
    assert one_error_line(capsys).startswith("error: ")


def test_a_full_disk_under_the_reference_cache_says_so(tmp_path, monkeypatch, capsys):
    import bench.training.reference_cache as cache
    from test_failures import tiny
    from bench.training.train import build
    config = compose([f"out_dir={tmp_path}", *tiny("trainer.eval_sequences=16")])
    task, _ = build(config)
    batch, _ = cache.held_out_set(config, task)

    class Full:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            pass
    monkeypatch.setattr(cache, "open", Full, raising=False)  # the module's open, not the builtin
    cache.complete(config, task, batch, None)
    err = capsys.readouterr().err
    assert "No space left on device" in err and "enforce fail" not in err, err


def test_a_suites_seeds_measure_the_model_once(monkeypatch):
    from bench.training.checks import checked_task_of
    measured = []
    real = memory._measure
    monkeypatch.setattr(memory, "_measured", {})
    monkeypatch.setattr(memory, "_measure", lambda *a: measured.append(1) or real(*a))
    for selector in ([*MAMBA, "seed=0"], [*MAMBA, "seed=1"], [*MAMBA, "seed=2", "name=x"]):
        checked_task_of(compose(selector))
    assert len(measured) == 1
    checked_task_of(compose(NOCONV))  # another model: measured
    checked_task_of(compose([*MAMBA, "trainer.batch_size=16"]))  # another batch: measured
    assert len(measured) == 3


@pytest.mark.parametrize("override,message", [
    ("task.gd_steps=[[1,2]]", "error: task.gd_steps: [[1, 2]] holds a list or mapping; give a "
                              "flat list of numbers"),
    ("task.seq_len=1_0", "error: task.seq_len: '1_0' is not a plain decimal number (YAML 1.1 "
                         "reads it as 10); write the number you mean"),
])
def test_overrides_a_reader_would_misread(override, message, capsys):
    assert main(["run", "task=linreg", override, "print_config=true"]) == 2
    assert one_error_line(capsys) == message


def test_a_record_made_by_a_full_hash_still_pools(tmp_path):
    """The check of commits keeps a real record's code version (the test's commit is no commit
    of this repository: its code stays unknown, as before)."""
    rec = record(MAMBA)
    assert identities.record_code(rec)[2] == f"commit {'a' * 7} is not in this repository"
