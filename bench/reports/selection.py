"""Which records a report reads and how they pool (the leaderboard, the claims and the suite
runner read records through it).

Pooling rules (the header of leaderboard.md repeats them):
- A section is one task name + resolved task config + held-out set size (`metrics.sequences`):
  gaps measured on different held-out sets are never compared or pooled.
- Within a section a row is one model name + resolved model config + training budget +
  version + environment (records.environment: device, SSD kernel, precision, compile, TF32); a
  row that did not run on the CPU says where it ran. The version is the record's behavioural
  identity where <out_dir>/identities.json knows it (bench/reports/identities.py: records of
  different commits whose code does the same with the config pool, by the identities of today's
  code, or of the probed code nearest HEAD until today's is probed), else its code version
  (commit, and whether bench/ tasks/ models/ conf/ pyproject.toml differed from it).
- A row counts each seed once: of several records of one seed (a re-run, a resumed copy) the
  newest is kept and the others are counted as duplicates; two records of one seed from
  different commits pooled by one identity whose results differ are named (the identity missed
  a difference).
- Several seeds are summarised by their mean gap and a 95% t-interval across seeds; a single
  seed shows its bootstrap interval over held-out sequences.
By default only suite records (origin "suite:<name>") are used, so an ad-hoc `python -m bench run`
never changes the committed board; include=all adds ad-hoc records (and legacy ones, which have no
origin). Records of `python -m bench eval` (origin "eval") are never used."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from bench.config import ConfigError
from bench.config.formats import fmt_sig, plural
from bench.records.store import RESULT_NEUTRAL, code_digest, environment, read_records
from bench.reports.identities import (Index, current_code, load_index, pooling_code,
                                      resolved_config)
from bench.reports.identity import TOLERANCE

INCLUDE = ("suite", "all")
IGNORED_IN_LABELS = tuple(f"trainer.{key}" for key in RESULT_NEUTRAL)
STAMP = re.compile(r"--(\d{8}-\d{6})-[0-9a-f]+$")  # bench.records.store.new_run_id's time stamp


def digest(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:8]


def label_of(record: dict) -> str:
    """Model name plus the model and trainer overrides of its command line (seeds, paths and
    display options aside), so a row says how it differs from conf/model/<name>.yaml, and where
    it ran unless on the CPU (`[cuda: NVIDIA H100 80GB HBM3, mamba_ssm]`)."""
    shown = [o for o in record.get("overrides", [])
             if o.startswith(("model.", "trainer.")) and not o.startswith(IGNORED_IN_LABELS)]
    preset = record["trainer"].get("name")
    if isinstance(preset, str) and preset not in ("", "default"):  # trainer=paper: 10k steps...
        shown.insert(0, f"trainer={preset}")
    env = environment(record)
    return (record["model"]["name"] + (f" ({', '.join(shown)})" if shown else "")
            + ("" if env.default else f" [{env.name}]"))


def commit_of(record: dict) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the code that made the record; None where it was not recorded."""
    prov = record.get("provenance")
    prov = prov if isinstance(prov, dict) else {}
    commit, dirty = prov.get("commit"), prov.get("dirty")
    return (str(commit) if commit else None), (dirty if isinstance(dirty, bool) else None)


@functools.lru_cache(maxsize=None)
def _digest_of_commit(commit: str) -> str | None:
    return code_digest(commit)


def code_version(record: dict) -> tuple[str | None, bool | None]:
    """(code, dirty): what rows pool by. `code` is the digest of the result-shaping code
    (records.code_digest: recorded, or worked out from the commit for older records), so runs of
    commits that changed only README, results or tests pool; the commit where git cannot tell."""
    commit, dirty = commit_of(record)
    prov = record.get("provenance")
    code = prov.get("code") if isinstance(prov, dict) else None
    if not code and commit:
        code = _digest_of_commit(commit)
    return (str(code) if code else commit), dirty


def code_label(commit: str | None, dirty: bool | None) -> str:
    if commit is None:
        return "unknown"
    return commit[:7] + {True: "+dirty", False: "", None: "?"}[dirty]


def version_of(record: dict, index: Index) -> tuple[tuple, str]:
    """(what rows pool by, its label): the record's behavioural identity where the index knows
    it (bench/reports/identities.py: today's when today's code reproduces what the record's code
    did), labelled `≡<identity>`, with `, current` when it is today's; else its code version
    (code_version), labelled by commit."""
    found, current = index.version(record)
    if found is None:
        return code_version(record), code_label(*commit_of(record))
    return ("identity", found), f"≡{found[:8]}" + (", current" if current else "")


def version_label(record: dict) -> str:
    """The label of the version a selected record pools by (version_of), or its commit's."""
    return record.get("_version") or code_label(*commit_of(record))


def age(record: dict) -> tuple:
    """Sort key, newest last: the run_id's time stamp, else the file's modification time."""
    path = record.get("_path")
    try:
        mtime = os.stat(path).st_mtime_ns if path else 0
    except OSError:
        mtime = 0
    found = STAMP.search(str(record.get("run_id", "")))
    stamp = found.group(1) if found else time.strftime("%Y%m%d-%H%M%S",
                                                       time.localtime(mtime / 1e9))
    return stamp, mtime, str(path)


@dataclass
class Section:
    """The runs of one task config on one held-out set; `rows` maps a row key to its runs,
    one record per seed."""
    task: str
    task_digest: str
    sequences: int
    rows: dict[str, list[dict]] = field(default_factory=dict)
    duplicates: int = 0
    superseded: dict[str, list[dict]] = field(default_factory=dict)  # rows of older code
    # newer code versions of a row with fewer seeds than the row shown for it: row -> its seeds
    incomplete: dict[str, int] = field(default_factory=dict)
    # records of one seed of one row, made by different commits pooled by one identity, whose
    # results differ: (row, older record, newer record) (disagree)
    conflicts: list[tuple[str, dict, dict]] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"{self.task} [{self.task_digest}], {self.sequences} held-out sequences"


@dataclass
class Selection:
    """The records of out_dir sorted into sections, plus what was left out and why."""
    out_dir: str
    include: str
    sections: list[Section]
    bad: list[tuple[str, str]]  # (path, reason) of records that could not be read or shown
    failed: int
    adhoc: int
    evaluations: int = 0  # records of `python -m bench eval` (origin "eval"): never pooled

    @property
    def runs(self) -> int:
        return sum(len(runs) for s in self.sections
                   for runs in [*s.rows.values(), *s.superseded.values()])

    @property
    def superseded(self) -> int:
        return sum(len(runs) for s in self.sections for runs in s.superseded.values())

    @property
    def duplicates(self) -> int:
        return sum(s.duplicates for s in self.sections)

    def notes(self) -> list[str]:
        where = self.out_dir.rstrip("/") + "/"
        notes = []
        if self.adhoc:
            notes.append(f"{plural(self.adhoc, 'ad-hoc record')} in {where} not included; "
                         "include=all adds them")
        if self.duplicates:
            notes.append(f"{plural(self.duplicates, 'duplicate record')} of an already counted "
                         "seed left out")
        if self.failed:
            notes.append(f"{plural(self.failed, 'failed run')} left out")
        if self.evaluations:
            notes.append(f"{plural(self.evaluations, 'evaluation')} of saved weights left out")
        if self.bad:
            notes.append(f"{plural(len(self.bad), 'unreadable record')} skipped")
        return notes

    def warnings(self) -> list[str]:
        """One line per record left out as unusable and per seed whose records disagree, each
        naming the files: what a reader of the output should not have to find out alone."""
        lines = [f"warning: skipped {path}: {reason}" for path, reason in self.bad]
        for section in self.sections:
            for _row, older, newer in section.conflicts:
                lines.append(f"warning: {older['_path']} and {newer['_path']}: two records of "
                             f"{older['model']['name']} seed {newer['seed']} in one row differ "
                             f"({fmt_sig(headline(older), 6)} vs {fmt_sig(headline(newer), 6)});"
                             f" the newer is used")
        return lines

    def summary(self) -> str:
        notes = self.notes()
        return plural(self.runs, "run") + (f" ({'; '.join(notes)})" if notes else "")


def check_selection(out_dir: str, include: str) -> None:
    """The options of a selection, refused before anything is read (a command checks them first,
    so a typo does not wait for the claims' rules or the records)."""
    if include not in INCLUDE:
        raise ConfigError(f"include must be one of {'|'.join(INCLUDE)}, got '{include}'")
    directory = Path(out_dir)
    if not directory.exists():
        raise ConfigError(f"out_dir '{out_dir}' does not exist")
    if not directory.is_dir():
        raise ConfigError(f"out_dir '{out_dir}' is not a directory")


def select_runs(out_dir: str, include: str = "suite") -> Selection:
    """Read out_dir and sort its records into sections and rows by the pooling rules."""
    check_selection(out_dir, include)
    directory = Path(out_dir)
    records, bad = read_records(directory)
    index = load_index(directory)
    today = current_code() if index.codes else None
    index.today = today[0] if today else None
    index.reference = pooling_code(index) if index.codes else None
    failed = adhoc = evaluations = 0
    newest: dict[tuple, dict[tuple, dict]] = defaultdict(dict)  # section -> (row, seed) -> record
    duplicates: dict[tuple, int] = defaultdict(int)
    conflicts: dict[tuple, list[tuple[str, dict, dict]]] = defaultdict(list)
    lineage: dict[str, str] = {}  # row -> the same row without its code version
    for record in records:
        if record.get("status") != "ok":
            failed += 1
            continue
        if record.get("origin") == "eval":  # a re-scoring of a trained run, not a run of its own:
            evaluations += 1  # pooled, it would count that run's seed twice (or replace it)
            continue
        if include == "suite" and not str(record.get("origin") or "adhoc").startswith("suite:"):
            adhoc += 1  # records without origin predate it: ad-hoc as far as anyone knows
            continue
        record["_age"] = age(record)
        section = (record["task"]["name"], digest(resolved_config(record, "task")),
                   record["metrics"]["sequences"])
        trainer = {k: v for k, v in resolved_config(record, "trainer").items()
                   if k not in RESULT_NEUTRAL}
        config = [record["model"]["name"], resolved_config(record, "model"), trainer,
                  *environment(record)]
        version, record["_version"] = version_of(record, index)
        row = digest([*config, *version])
        lineage[row] = digest(config)
        seen = newest[section].get((row, record["seed"]))
        if seen is not None:
            duplicates[section] += 1
            if disagree(seen, record):
                older, newer = sorted([seen, record], key=lambda r: r["_age"])
                conflicts[section].append((row, older, newer))
                # the record kept carries what its twins said: a row that uses it says so
                newer.setdefault("_twins", []).extend([older, *older.get("_twins", [])])
            if seen["_age"] > record["_age"]:
                continue
        newest[section][(row, record["seed"])] = record
    sections = []
    for key in sorted(newest, key=lambda k: (k[0], k[2], k[1])):
        section = Section(*key, duplicates=duplicates[key], conflicts=conflicts[key])
        for (row, _seed), record in sorted(newest[key].items(), key=lambda kv: kv[0]):
            section.rows.setdefault(row, []).append(record)
        keep_newest_code(section, lineage)
        sections.append(section)
    return Selection(str(out_dir), include, sections, sorted(bad), failed, adhoc,
                     evaluations=evaluations)


def headline(record: dict) -> float:
    metrics = record["metrics"]
    return metrics["bayes_gap"] if "bayes_gap" in metrics else metrics["loss"]["model"]


def disagree(first: dict, second: dict) -> bool:
    """Whether two records of one seed in one row differ in their headline beyond rounding —
    reported, never decided silently: of different commits pooled by their identity, behaviour
    the identity's probe cannot see differs (a change after its steps, or float-level
    differences that training amplifies: one seed of MambaZero with an L1 head ends 13% apart
    on 1 and 2 threads); of one commit, the same run gave two answers or a record was edited."""
    a, b = headline(first), headline(second)
    # relative to the model's loss: a gap is a difference of two losses, and rounding moves the
    # losses (a gap of 1e-5 on losses of 1.3 differs by 1e-7 between thread counts: no change)
    losses = [r["metrics"].get("loss", {}).get("model") for r in (first, second)]
    scale = max(abs(a), abs(b), *(abs(x) for x in losses if isinstance(x, (int, float))), 1e-12)
    return abs(a - b) > TOLERANCE * scale


def current_version(rows: list[list[dict]]) -> list[dict]:
    """Of the same config's rows of different code versions, the one that stands for it: a
    newer version replaces an older one only when it has at least as many seeds, so a partial
    re-run adds evidence and never removes any (a newer row of fewer seeds waits, shown as
    incomplete, until it has them)."""
    current = None
    for runs in sorted(rows, key=lambda runs: max(r["_age"] for r in runs)):
        if current is None or len(runs) >= len(current):
            current = runs
    return current


def keep_newest_code(section: Section, lineage: dict[str, str]) -> None:
    """Of rows that differ only by code version, the table shows the current one
    (current_version) and, when a newer one has fewer seeds, that one too, marked incomplete
    (section.incomplete); the others move to section.superseded, listed below the table."""
    by_config: dict[str, list[str]] = defaultdict(list)
    for row in section.rows:
        by_config[lineage[row]].append(row)
    for rows in by_config.values():
        newest = max(rows, key=lambda row: max(r["_age"] for r in section.rows[row]))
        chosen = current_version([section.rows[row] for row in rows])
        current = next(row for row in rows if section.rows[row] is chosen)
        if newest != current:
            section.incomplete[newest] = len(section.rows[current])
        for row in rows:
            if row not in (current, newest):
                section.superseded[row] = section.rows.pop(row)
