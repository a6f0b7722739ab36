"""The behavioural identity (bench/reports/identity.py) and its index (bench/reports/identities.py): a refactor
that changes no number keeps every identity, a planted change in each layer changes the identity
of exactly the configs it affects, rows and suites pool by identity, and an index that cannot be
trusted is not used."""
import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

import bench.training.module
import bench.training.train
from bench.reports import identities
from bench.config import compose
from bench.reports.identity import PARTS, SCALE, agrees, differing, label, probe, summarize
from bench.reports.leaderboard import write_leaderboard
from bench.reports.selection import select_runs
from tasks.markov import MarkovTask

from test_leaderboard import model_rows, put, record

REPO = Path(__file__).resolve().parents[1]

# Three small configs: what a planted change affects differs between them.
CONFIGS = {
    "markov-mamba-800": ["task=markov", "task.seq_len=32", "model=mamba", "model.d_model=8",
                         "model.headdim=8", "trainer.max_steps=800"],
    "markov-transformer-100": ["task=markov", "task.seq_len=32", "model=transformer",
                               "model.d_model=8", "trainer.max_steps=100"],
    "linreg-transformer-800": ["task=linreg", "task.seq_len=16", "task.n_features=2",
                               "model=transformer", "model.d_model=8", "trainer.max_steps=800"],
}


def spec(argv: list[str]) -> dict:
    described = compose([*argv, "trainer.bootstrap=50"]).describe()
    return {"key": "k", **{group: described[group] for group in ("task", "model", "trainer")}}


def identities_of() -> dict[str, dict]:
    return {name: probe(spec(argv)) for name, argv in CONFIGS.items()}


@pytest.fixture(scope="module")
def baseline():
    return identities_of()


def test_summaries_agree_up_to_rounding_and_see_a_change_in_one_number():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    base = summarize({"w": x, "loss": 0.6931, "tokens": torch.tensor([1, 0, 1])})
    # a sum taken in another order: each number moved by float32 rounding
    noisy = summarize({"w": x * (1 + 1e-7 * torch.randn(1000)), "loss": 0.6931 * (1 + 1e-7),
                       "tokens": torch.tensor([1, 0, 1])})
    assert differing(base, noisy) == []
    moved = x.clone()
    moved[17] += 1e-3  # one weight of a thousand
    assert differing(base, summarize({"w": moved, "loss": 0.6931,
                                      "tokens": torch.tensor([1, 0, 1])})) == ["/w"]
    assert differing(base, summarize({"w": x, "loss": 0.6932,
                                      "tokens": torch.tensor([1, 1, 1])})) == ["/loss", "/tokens"]
    # what the newer measurement adds is no difference; what it lacks is
    richer = summarize({"w": x, "loss": 0.6931, "tokens": torch.tensor([1, 0, 1]), "new": 1.0})
    assert differing(base, richer) == [] and differing(richer, base) == ["/new"]
    # the places of non-finite numbers count exactly; shapes and kinds of tensors count
    nan = x.clone()
    nan[3] = float("nan")
    assert differing(summarize(nan), summarize(torch.where(torch.arange(1000) == 4, nan[3], x)))
    assert summarize(torch.tensor([1, 2])) != summarize(torch.tensor([[1, 2]]))
    assert summarize(torch.tensor([1, 2])) != summarize(torch.tensor([1.0, 2.0]))
    assert agrees(0.0, 0.0) and not agrees(0.0, 1e-9) and agrees(1.0, 1.0 + 1e-7)
    assert label(base) == label(noisy)  # to 4 significant digits
    # a part's scale: a tiny tensor (a bias trained on rounding noise) agrees up to it
    tiny, other = torch.full((16,), 1e-4), torch.full((16,), 1.01e-4)
    assert differing(summarize([tiny]), summarize([other])) == ["[0]"]
    assert differing({**summarize([tiny]), SCALE: 10.0}, {**summarize([other]), SCALE: 10.0}) == []


def test_the_probe_is_deterministic_and_leaves_the_thread_count(baseline):
    threads = torch.get_num_threads()
    again = probe(spec(CONFIGS["markov-mamba-800"]))
    assert again["identity"] == baseline["markov-mamba-800"]["identity"]
    assert torch.get_num_threads() == threads
    assert set(again["parts"]) == set(PARTS)
    assert len({result["identity"] for result in baseline.values()}) == 3
    assert not identities.differing_parts(baseline["markov-mamba-800"], again)


def changed(baseline: dict, now: dict) -> dict[str, set[str]]:
    """{config: the parts that moved} for the configs whose probe today's code (`baseline`) no
    longer reproduces, either way."""
    moved = {name: set(identities.differing_parts(result, now[name])
                       + identities.differing_parts(now[name], result))
             for name, result in baseline.items()}
    return {name: parts for name, parts in moved.items() if parts}


def test_a_planted_sampler_change_moves_only_the_configs_of_that_task(baseline, monkeypatch):
    original = MarkovTask.sample_given

    def sample_given(self, latent, generator):  # one draw of one token differs
        batch = original(self, latent, generator)
        batch.inputs[0, 0] = 1 - batch.inputs[0, 0]
        return batch
    monkeypatch.setattr(MarkovTask, "sample_given", sample_given)
    moved = changed(baseline, identities_of())
    assert set(moved) == {"markov-mamba-800", "markov-transformer-100"}
    assert all({"train_batches", "held_out"} <= parts for parts in moved.values())


def test_a_planted_reference_change_moves_only_references_and_scoring(baseline, monkeypatch):
    original = MarkovTask.unigram

    def unigram(self, batch):
        out = original(self, batch).clone()
        out[0, 0, 0] -= 1e-3
        return out
    monkeypatch.setattr(MarkovTask, "unigram", unigram)
    moved = changed(baseline, identities_of())
    assert moved == {"markov-mamba-800": {"references", "scoring"},
                     "markov-transformer-100": {"references", "scoring"}}


def test_a_planted_init_change_moves_only_that_model(baseline, monkeypatch):
    original = bench.training.train.build_model

    def build_model(family, config, io):
        model = original(family, config, io)
        if family == "mamba":
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] += 1e-3
        return model
    monkeypatch.setattr(bench.training.train, "build_model", build_model)
    moved = changed(baseline, identities_of())
    assert set(moved) == {"markov-mamba-800"}
    assert {"init", "steps", "scoring"} <= moved["markov-mamba-800"]


def test_a_planted_late_schedule_change_moves_only_the_longer_runs(baseline, monkeypatch):
    original = bench.training.module.cosine_with_warmup

    def schedule(step, warmup, total, floor):  # differs from step 500 on only
        return original(step, warmup, total, floor) * (0.9 if step >= 500 else 1.0)
    monkeypatch.setattr(bench.training.module, "cosine_with_warmup", schedule)
    moved = changed(baseline, identities_of())
    assert moved == {"markov-mamba-800": {"schedule"}, "linreg-transformer-800": {"schedule"}}


def test_a_planted_scoring_change_moves_only_the_scoring(baseline, monkeypatch):
    """The bootstrap's intervals, which every config's scoring uses."""
    import bench.training.evaluate
    original = bench.training.evaluate.bootstrap_ci

    def bootstrap_ci(values, resamples, *args, **kwargs):
        lo, hi = original(values, resamples, *args, **kwargs)
        return lo, hi * (1 + 1e-3) if hi else hi
    monkeypatch.setattr(bench.training.evaluate, "bootstrap_ci", bootstrap_ci)
    moved = changed(baseline, identities_of())
    assert moved == {name: {"scoring"} for name in CONFIGS}


def test_a_refactor_that_moves_a_function_keeps_the_identity(baseline, tmp_path):
    """The schedule function moved to a module of its own: other bytes, a new code digest, the
    same identity (measured in a checkout of the refactored code, as old commits are)."""
    tree = tmp_path / "tree"
    for path in identities.CODE_PATHS:
        (shutil.copytree if (REPO / path).is_dir() else shutil.copyfile)(REPO / path, tree / path)
    module = (tree / "bench" / "training" / "module.py").read_text()
    start = module.index("def cosine_with_warmup(")
    end = module.index("class ICLModule(")
    (tree / "bench" / "training" / "schedule.py").write_text("import math\n\n\n" + module[start:end])
    (tree / "bench" / "training" / "module.py").write_text(
        module[:start] + "from bench.training.schedule import cosine_with_warmup\n\n\n" + module[end:])
    argv = CONFIGS["markov-mamba-800"]
    (result,) = identities.run_probes(tree, [spec(argv)]).values()
    assert "error" not in result, result
    assert identities.reproduces(baseline["markov-mamba-800"], result)
    assert identities.reproduces(result, baseline["markov-mamba-800"])


# --- the index and what reads it -----------------------------------------------------------

def indexed(tmp_path: Path, identity_of: dict[str, str], today: str | None = None) -> Path:
    """results/ with an index giving every config of record() the identity `identity_of[code]`
    under each code version."""
    out = tmp_path / "results"
    out.mkdir(parents=True, exist_ok=True)
    key = identities.config_key(record())
    index = identities.Index(out / identities.INDEX_NAME)
    for code, found in identity_of.items():
        index.codes[code] = {"commit": code * 5, "torch": torch.__version__,
                             "probe": identities.probe_format(),
                             "machine": identities.probe_machine(),
                             "configs": {key: {"identity": found, "parts": {}}}}
    identities.save_index(index, "test")
    return out


def made_by(code: str, **extra) -> dict:
    """A record of a clean checkout of code version `code` (its commit a full hash, as
    provenance() records it: another name would not be resolved)."""
    commit = hashlib.sha1(code.encode()).hexdigest()
    return record(provenance={"commit": commit, "code": code, "dirty": False,
                              "torch": torch.__version__}, **extra)


def test_an_old_checkout_is_probed_without_todays_modules(tmp_path, monkeypatch):
    """An editable install answers for a package by name wherever the checkout probed lacks it
    (bench.training in a checkout from before the folders): the probe counts it absent and does
    not import it, so no module of today's code enters an old code's probe."""
    import importlib.util
    import sys
    from bench.reports import identity
    checkout, installed = tmp_path / "checkout", tmp_path / "installed"
    (checkout / "probedpkg").mkdir(parents=True)
    (checkout / "probedpkg" / "__init__.py").write_text("")
    (checkout / "probedpkg" / "train.py").write_text("WHERE = 'old'\n")
    (installed / "training").mkdir(parents=True)
    (installed / "training" / "__init__.py").write_text("")
    (installed / "training" / "train.py").write_text("WHERE = 'today'\n")

    class EditableFinder:  # what `pip install -e` adds: a finder that answers by name
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name == "probedpkg.training":
                return importlib.util.spec_from_file_location(
                    name, installed / "training" / "__init__.py",
                    submodule_search_locations=[str(installed / "training")])
            return None

    monkeypatch.setattr(sys, "meta_path", [EditableFinder, *sys.meta_path])
    monkeypatch.syspath_prepend(str(checkout))
    monkeypatch.chdir(checkout)
    for name in ("probedpkg", "probedpkg.train", "probedpkg.training", "probedpkg.training.train"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert identity._first_module("probedpkg.training.train", "probedpkg.train").WHERE == "old"
    assert identity._first_module("probedpkg.training", optional=True) is None
    assert "probedpkg.training" not in sys.modules


def test_moving_the_probe_keeps_every_stored_identity(tmp_path, monkeypatch):
    """The index keys identities by the probe's format (bench.reports.identity.FORMAT), not by
    its file: the probe moved to another folder, with a comment added, leaves every stored entry
    usable, and filling the index probes nothing again (a digest of the file would have)."""
    code = "a" * 12
    out = indexed(tmp_path, {code: "id-a"})
    moved = tmp_path / "elsewhere" / "probe_moved.py"
    moved.parent.mkdir()
    moved.write_text(Path(identities.probe_module.__file__).read_text() + "\n# a comment\n")
    spec_ = importlib.util.spec_from_file_location("probe_moved", moved)
    module = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(module)
    monkeypatch.setattr(identities, "probe_module", module)
    index = identities.load_index(out)
    key = identities.config_key(record())
    ran = identities.fill(index, {code: {key: spec(CONFIGS["markov-mamba-800"])}},
                          {code: code * 5}, torch.__version__)
    assert ran == 0
    assert index.entry(code, key)["identity"] == "id-a"


def test_the_probe_finds_modules_where_old_and_new_checkouts_keep_them(tmp_path, monkeypatch):
    """_first_module takes the first name a checkout has (bench/training/train.py today,
    bench/train.py before the folders) and does not hide a module that fails inside."""
    from bench.reports import identity
    (tmp_path / "oldpkg").mkdir()
    (tmp_path / "oldpkg" / "__init__.py").write_text("")
    (tmp_path / "oldpkg" / "train.py").write_text("WHERE = 'old'\n")
    (tmp_path / "oldpkg" / "broken.py").write_text("import no_such_module_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # the probe runs in the checkout it probes
    assert identity._first_module("oldpkg.training.train", "oldpkg.train").WHERE == "old"
    with pytest.raises(ModuleNotFoundError, match="no_such_module_here"):
        identity._first_module("oldpkg.broken", "oldpkg.train")
    with pytest.raises(ModuleNotFoundError, match="none of"):
        identity._first_module("oldpkg.nothing", "oldpkg.training.nothing")


def test_records_of_different_commits_with_one_identity_pool_into_one_row(tmp_path):
    out = indexed(tmp_path, {"c0de1": "1d" * 8, "c0de2": "1d" * 8, "c0de3": "2e" * 8})
    put(out, made_by("c0de1", seed=0, gap=0.1, stamp="20260101-100000"),
        made_by("c0de2", seed=1, gap=0.3, stamp="20260102-100000"),
        made_by("c0de3", seed=0, gap=0.5, stamp="20260103-100000"))
    write_leaderboard(select_runs(str(out)), str(tmp_path / "lb.md"))
    text = (tmp_path / "lb.md").read_text()
    # the two commits that behave alike pool (2 seeds); the third is newer but has 1 seed
    assert sorted((r["code"], r["seeds"]) for r in model_rows(text)) == [
        ("≡1d1d1d1d", 2), ("≡2e2e2e2e (incomplete: 1 of 2 seeds)", 1)]


def test_pooling_stays_that_of_the_last_probed_code_until_todays_is_probed(tmp_path, monkeypatch):
    """Two codes whose own identities differ pool when a later code reproduces both. After a
    commit (or an edit) that `identities` has not probed yet, they still pool, by the probed code
    nearest HEAD, and are not called current: before, each fell back to its own identity, and
    `claims` on a fresh clone changed 10 of 106 verdicts until the next identities run."""
    import bench.records.store as store
    out = indexed(tmp_path, {"c0de1": "1d" * 8, "c0de2": "2e" * 8, "probed": "3f" * 8})
    put(out, made_by("c0de1", seed=0, stamp="20260101-100000"),
        made_by("c0de2", seed=1, stamp="20260102-100000"))

    def rows_under(code: str, history: list[str]) -> list[tuple[str, ...]]:
        monkeypatch.setattr(store, "provenance",
                            lambda: {"commit": "f" * 40, "code": code, "dirty": False})
        monkeypatch.setattr(store, "ancestors", lambda: history)
        (section,) = select_runs(str(out)).sections
        return sorted(tuple(r["_version"] for r in runs)
                      for runs in [*section.rows.values(), *section.superseded.values()])

    pooled = [("≡3f3f3f3f", "≡3f3f3f3f")]
    assert rows_under("probed", []) == [("≡3f3f3f3f, current", "≡3f3f3f3f, current")]
    assert rows_under("unprobed", ["f" * 40, "e" * 40, "probed" * 5, "c0de1" * 5]) == pooled
    # the nearest probed ancestor is the reference, not the first code of the index
    assert rows_under("unprobed", ["f" * 40, "c0de1" * 5, "probed" * 5]) == [
        ("≡1d1d1d1d", "≡1d1d1d1d")]
    assert rows_under("unprobed", []) == [("≡1d1d1d1d",), ("≡2e2e2e2e",)]  # no git: own


def test_one_seed_disagreeing_under_one_identity_is_named(tmp_path):
    out = indexed(tmp_path, {"c0de1": "1d" * 8, "c0de2": "1d" * 8})
    put(out, made_by("c0de1", seed=0, gap=0.1, stamp="20260101-100000"),
        made_by("c0de2", seed=0, gap=0.1, stamp="20260102-100000"),
        made_by("c0de1", seed=1, gap=0.2, stamp="20260101-100000"),
        made_by("c0de2", seed=1, gap=0.25, stamp="20260102-100000"))
    selection = select_runs(str(out))
    (section,) = selection.sections
    assert [(older["seed"], older["metrics"]["bayes_gap"], newer["metrics"]["bayes_gap"])
            for _, older, newer in section.conflicts] == [(1, 0.2, 0.25)]
    write_leaderboard(selection, str(tmp_path / "lb.md"))
    # the newest of each seed is used: seeds 0.1 and 0.25, standard deviation 0.106
    assert ("records of one seed in one row differ — training amplifies float-level "
            "differences, behaviour after the identity's probe changed, or a record was edited: "
            f"mamba seed 1: 0.2 ({made_by('c0de1')['provenance']['commit'][:7]}) vs 0.25 "
            f"({made_by('c0de2')['provenance']['commit'][:7]}), 0.47× the seeds' standard "
            "deviation") in \
        (tmp_path / "lb.md").read_text()


def test_an_index_that_does_not_match_its_digest_is_ignored(tmp_path, capsys):
    out = indexed(tmp_path, {"c0de1": "1d" * 8, "c0de2": "1d" * 8})
    data = json.loads((out / identities.INDEX_NAME).read_text())
    data["codes"]["c0de2"]["configs"][identities.config_key(record())]["identity"] = "ff" * 8
    (out / identities.INDEX_NAME).write_text(json.dumps(data))
    assert identities.load_index(out).codes == {}
    assert ("is altered (its content does not match the digest it was written with); ignored"
            in capsys.readouterr().err)
    put(out, made_by("c0de1", seed=0), made_by("c0de2", seed=1, stamp="20260102-100000"))
    (section,) = select_runs(str(out)).sections
    assert len(section.rows) + len(section.superseded) == 2  # by code version, not pooled


def test_a_record_of_another_torch_or_a_dirty_checkout_has_no_identity(tmp_path):
    out = indexed(tmp_path, {"c0de1": "1d" * 8})
    index = identities.load_index(out)
    assert index.identity(made_by("c0de1")) == "1d" * 8 and not index.is_current(made_by("c0de1"))
    other = made_by("c0de1")
    other["provenance"]["torch"] = "1.0"
    dirty = made_by("c0de1")
    dirty["provenance"]["dirty"] = True
    assert index.identity(other) is None and index.identity(dirty) is None
    status = identities.standing(index, [made_by("c0de1"), dirty])
    assert not status.current and set(status.unknown) == {
        "made by a dirty checkout", "today's code is dirty or unknown"}


def test_standing_names_the_parts_that_differ(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    key = identities.config_key(record())
    index = identities.Index(out / identities.INDEX_NAME, today="today")
    parts = {part: {"/x": 0.5} for part in PARTS}
    for code, moved in (("old", "init"), ("same", None), ("today", None)):
        index.codes[code] = {"torch": torch.__version__, "configs": {key: {
            "identity": moved or "same",
            "parts": {**parts, **({moved: {"/x": 0.6}} if moved else {})}}}}
    status = identities.standing(index, [made_by("old"), made_by("same")])
    assert [r["provenance"]["code"] for r in status.current] == ["same"]
    assert list(status.stale) == [("init",)]


def test_a_suite_entry_is_done_by_a_record_whose_identity_is_todays(tmp_path, monkeypatch):
    """A record made by older code counts as done when its identity is today's code's (the
    suite then runs only what is stale); with another identity it does not."""
    import bench.records.store
    from bench.cli.suites import finished_runs
    monkeypatch.setattr(bench.records.store, "provenance",
                        lambda: {"commit": "t" * 40, "code": "today", "dirty": False})
    argv = ["task=markov", "model=mamba", "trainer.max_steps=10", "trainer.progress=false"]
    config = compose([*argv, f"out_dir={tmp_path / 'results'}"])
    config.origin = "suite:leaderboard"
    described = config.describe()
    rec = made_by("older", overrides=argv)
    rec.update({k: described[k] for k in ("task", "model", "trainer")})
    rec["train"] = {"steps": 10, "wall_time_s": 1.0, "device": "cpu", "device_name": "cpu",
                    "kernel": "torch", "precision": "32-true", "compile": False, "tf32": False}
    for code_identity, done in (("1d" * 8, True), ("2e" * 8, False)):
        out = tmp_path / "results"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        index = identities.Index(out / identities.INDEX_NAME)
        key = identities.config_key(rec)
        for code, found in (("older", "1d" * 8), ("today", code_identity)):
            index.codes[code] = {"commit": code, "torch": torch.__version__,
                                 "probe": identities.probe_format(),
                                 "configs": {key: {"identity": found, "parts": {
                                     "init": {"/w": 1.0 if found == "1d" * 8 else 2.0}}}}}
        identities.save_index(index, "test")
        put(out, rec)
        assert (0 in finished_runs([config])) is done


@pytest.mark.parametrize("argv,needle", [
    (["identities", "check=maybe"], "check must be true or false"),
    (["identities", "colour=red"], "unknown argument 'colour=red'"),
    (["identities", "out_dir=/nonexistent/x"], "is not a directory"),
])
def test_identities_options_are_checked(argv, needle, capsys):
    from bench.cli.main import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_the_index_is_not_read_as_a_run_record(tmp_path):
    from bench.records.store import read_records
    out = indexed(tmp_path, {"c0de1": "1d" * 8})
    put(out, made_by("c0de1"))
    records, bad = read_records(out)
    assert len(records) == 1 and bad == []


def test_a_probe_that_hangs_is_killed_and_named(tmp_path, monkeypatch):
    """A checkout whose code never returns costs at most PROBE_TIMEOUT_S: the process is killed
    and its configs are named not computed. Here the checkout's code hangs as the probe's Python
    starts (its sitecustomize, which Python imports from the path before anything else), not
    after the seconds of torch's import."""
    tree = tmp_path / "tree"
    for path in ("bench/training/reference_cache.py", "bench/training/evaluate.py", "bench/training/train.py",
                 "bench/__init__.py", "bench/config.py"):
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text("")
    (tree / "sitecustomize.py").write_text("import sys, time\nprint('stuck', file=sys.stderr)"
                                           "\nsys.stderr.flush()\ntime.sleep(600)\n")
    monkeypatch.setattr(identities, "PROBE_TIMEOUT_S", 5)
    # two cores: the three configs are dealt out to two probe processes, both stuck
    monkeypatch.setattr(identities.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    started = []
    popen = identities.subprocess.Popen

    def counted(*args, **kwargs):
        started.append(args)
        return popen(*args, **kwargs)

    monkeypatch.setattr(identities.subprocess, "Popen", counted)
    import time
    start = time.monotonic()
    results = identities.run_probes(tree, [{**spec(CONFIGS["markov-mamba-800"]), "key": key}
                                           for key in "abc"])
    assert time.monotonic() - start < 30 and len(started) == 2
    assert results == {key: {"error": "the probe process ended early: stuck"} for key in "abc"}


def test_every_published_record_keeps_its_key_in_the_committed_index():
    """Each ok record of results/ finds its config key under its own code in the committed
    index (results/identities.json) wherever that code's probe was computed: a trainer or model
    field added since the index was keyed must leave every key as it was (identities
    KEY_OMITS_AT_DEFAULT, MODEL_KEY_OMITS_AT_DEFAULT), or every stored probe of every old
    commit would run again."""
    results = Path(__file__).resolve().parents[1] / "results"
    index = identities.load_index(results)
    records = identities.ok_records(results)
    assert index.codes and records
    lost = []
    for found in records:
        code = identities.record_code(found)[0]
        configs = (index.codes.get(code) or {}).get("configs")
        if configs and identities.config_key(found) not in configs:
            lost.append(found.get("run_id"))
    assert not lost, f"{len(lost)} records' keys are not in the index, e.g. {lost[:3]}"


def test_identities_are_compared_only_between_probes_of_one_machine(tmp_path, monkeypatch):
    """Two codes whose probes agree are one version when one machine probed both; a code probed
    on another CPU (its floats round otherwise: 25 of 136 configs moved beyond the tolerance
    between two machines) is not compared with today's, and filling the index probes it again
    here rather than keeping it."""
    out = indexed(tmp_path, {"c0de1": "1d" * 8, "c0de2": "1d" * 8}, today="c0de2")
    index = identities.load_index(out, today="c0de2")
    old = made_by("c0de1")
    assert index.version(old) == ("1d" * 8, True)
    index.codes["c0de1"]["machine"] = "AVX2 another CPU"
    assert index.version(old) == ("1d" * 8, False)  # its own identity: not called current
    key = identities.config_key(record())
    calls = []
    monkeypatch.setattr(identities, "export_commit", lambda commit, folder: None)
    monkeypatch.setattr(identities, "run_probes", lambda tree, specs, log=None: calls.append(
        len(specs)) or {s["key"]: {"identity": "1d" * 8, "parts": {}} for s in specs})
    identities.fill(index, {"c0de1": {key: {"key": key}}}, {"c0de1": "c0de1" * 5},
                    torch.__version__)
    assert calls == [1] and index.codes["c0de1"]["machine"] == identities.probe_machine()
    assert index.version(old) == ("1d" * 8, True)
