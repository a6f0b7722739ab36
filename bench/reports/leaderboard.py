"""leaderboard.md from run records: per task and held-out set, the Bayes gap of every model with
its interval.

Pooling rules (the header of leaderboard.md repeats them):
- A section is one task name + resolved task config + held-out set size (`metrics.sequences`):
  gaps measured on different held-out sets are never compared or pooled.
- Within a section a row is one model name + resolved model config + training budget +
  version + environment (records.environment: device, SSD kernel, precision, compile, TF32); a
  row that did not run on the CPU says where it ran. The version is the record's behavioural
  identity where <out_dir>/identities.json knows it (bench/reports/identities.py: records of different
  commits whose code does the same with the config pool), else its code version (commit, and
  whether bench/ tasks/ models/ conf/ pyproject.toml differed from it).
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
import math
import os
import re
import shutil
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from bench.config import ConfigError
from bench.config.formats import fmt, fmt_loss, fmt_sig, loss_resolution, plural
from bench.reports.identities import Index, current_code, load_index, resolved_config
from bench.reports.plot import plot_gaps
from bench.records.store import (RESULT_NEUTRAL, code_digest, environment, not_a_regular_file,
                           not_written, output_path, read_records)
from tasks.files import write_atomic
from tasks.stats import across_seeds

INCLUDE = ("suite", "all")
IGNORED_IN_LABELS = tuple(f"trainer.{key}" for key in RESULT_NEUTRAL)

SECTION_FIGURE = re.compile(r"[\w.-]+-[0-9a-f]{8}-n\d+\.png")  # write_leaderboard's names
STAMP = re.compile(r"--(\d{8}-\d{6})-[0-9a-f]+$")  # bench.records.store.new_run_id's time stamp


def digest(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:8]


def exp_or_inf(x: float) -> float:
    """math.exp, or infinity where it overflows (a perplexity beyond the float range)."""
    return math.exp(x) if x < 709.0 else math.inf


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
    it (bench/reports/identities.py: today's when today's code reproduces what the record's code did),
    labelled `≡<identity>`, with `, current` when it is today's; else its code version
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


def select_runs(out_dir: str, include: str = "suite") -> Selection:
    """Read out_dir and sort its records into sections and rows by the pooling rules."""
    if include not in INCLUDE:
        raise ConfigError(f"include must be one of {'|'.join(INCLUDE)}, got '{include}'")
    directory = Path(out_dir)
    if not directory.exists():
        raise ConfigError(f"out_dir '{out_dir}' does not exist")
    if not directory.is_dir():
        raise ConfigError(f"out_dir '{out_dir}' is not a directory")
    records, bad = read_records(directory)
    index = load_index(directory)
    today = current_code() if index.codes else None
    index.today = today[0] if today else None
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
                conflicts[section].append((row, *sorted([seen, record], key=lambda r: r["_age"])))
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
    return abs(a - b) > 1e-6 * max(abs(a), abs(b), 1e-12)


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


def mean_curve(curves: list[list]) -> list:
    out = []
    for values in zip(*curves):
        present = [v for v in values if v is not None]
        out.append(sum(present) / len(present) if present else None)
    return out


def perplexity_section(section: Section, figure: Path, figure_link: str) -> list[str]:
    """A text task's section: perplexity (no Bayes predictor), its baselines, and the loss by
    position (how much the context helps)."""
    runs = [r for group in section.rows.values() for r in group]
    newest = max(runs, key=lambda r: r["_age"])
    metrics = newest["metrics"]
    lines = [f"## {section.title}", "",
             f"`{json.dumps(resolved_config(newest, 'task'), sort_keys=True)}` — perplexity on "
             f"{section.sequences} held-out windows ({metrics.get('bytes_per_token', 0):.2f} bytes "
             "per token); no Bayes predictor exists for text, the references are baselines fit "
             "on the training split.", "",
             *conflict_note(section),
             "| model | code | perplexity | 95% CI | nats/token | bits/byte | params | steps | "
             "seeds | wall (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    rows, models = [], {}
    for row_key, group in section.rows.items():
        nats, half = across_seeds([r["metrics"]["loss"]["model"] for r in group])
        lo, hi = ((exp_or_inf(nats - half), exp_or_inf(nats + half)) if half is not None
                  else tuple(group[0]["metrics"]["perplexity_ci"]["model"]))
        bpb = sum(r["metrics"]["bits_per_byte"]["model"] for r in group) / len(group)
        wall = sum(r["train"]["wall_time_s"] for r in group) / len(group)
        rows.append((nats, label_of(group[0]),
                     version_label(group[0]) + incomplete_mark(section, row_key), group,
                     f"{exp_or_inf(nats):.2f} | [{lo:.2f}, {hi:.2f}]"
                     f"{'' if half is None else ' (seeds)'} | {fmt(nats)} | {fmt(bpb, 3)} | "
                     f"{group[0]['params']:,} | {group[0]['train']['steps']} | {len(group)} | "
                     f"{wall:.0f} |"))
    rows.sort(key=lambda row: (row[0], row[1], row[2]))
    for _, label, code, group, cells in rows:
        lines.append(f"| {label} | {code} | {cells}")
        name = label if label not in models else f"{label} @ {code}"
        models[name] = mean_curve([r["per_position"]["loss.model"] for r in group])
    lines += superseded_note(section)
    lines += ["", "| baseline | perplexity | 95% CI | nats/token | bits/byte |",
              "|---|---|---|---|---|"]
    references = {}
    for name in sorted(metrics["roles"], key=lambda n: metrics["loss"][n]):
        lo, hi = metrics["perplexity_ci"][name]
        lines.append(f"| {name} | {metrics['perplexity'][name]:.2f} | [{lo:.2f}, {hi:.2f}] | "
                     f"{fmt(metrics['loss'][name])} | {fmt(metrics['bits_per_byte'][name], 3)} |")
        references[f"{name} (baseline)"] = newest["per_position"].get(f"loss.{name}", [])
    plot_gaps(figure, f"{section.task}: loss by position", models, references, "nats/token")
    lines += ["", f"![loss by position]({figure_link})", ""]
    return lines


def pooled_gap(group: list[dict]) -> tuple[float, float, float, float | None]:
    """(mean gap, interval low, high, t half-width or None): across seeds where there are
    several, else the one seed's bootstrap interval."""
    mean, half = across_seeds([r["metrics"]["bayes_gap"] for r in group])
    lo, hi = ((mean - half, mean + half) if half is not None
              else tuple(group[0]["metrics"]["bayes_gap_ci"]))
    return mean, lo, hi, half


def incomplete_mark(section: Section, row: str) -> str:
    """" (incomplete: 2 of 3 seeds)" for a newer code version's row that has fewer seeds than
    the row of an older version shown beside it (keep_newest_code)."""
    if row not in section.incomplete:
        return ""
    return f" (incomplete: {len(section.rows[row])} of {section.incomplete[row]} seeds)"


def conflict_note(section: Section) -> list[str]:
    """Records of one seed that one identity pooled although their results differ (disagree),
    each with the difference in units of the row's standard deviation across seeds: well
    within it, float-level differences amplified by training; far beyond it, a change of
    behaviour after the identity's probe, and the row mixes two experiments."""
    if not section.conflicts:
        return []
    items = []
    for row, older, newer in section.conflicts:
        values = [headline(r) for r in section.rows.get(row) or section.superseded.get(row, [])]
        spread = statistics.stdev(values) if len(values) > 1 else None
        a, b = headline(older), headline(newer)
        ratio = (f", {abs(a - b) / spread:.2g}× the seeds' standard deviation"
                 if spread else "")
        items.append(f"{label_of(newer)} seed {newer['seed']}: {fmt_sig(a, 6)} "
                     f"({code_label(*commit_of(older))}) vs {fmt_sig(b, 6)} "
                     f"({code_label(*commit_of(newer))}){ratio}")
    return [f"Note: records of one seed in one row differ — training amplifies float-level "
            f"differences, behaviour after the identity's probe changed, or a record was "
            f"edited: {'; '.join(items)}. The newest record of each seed is used.", ""]


def superseded_note(section: Section) -> list[str]:
    """One line naming the rows of older code versions that the table leaves out."""
    if not section.superseded:
        return []
    items = []
    for group in sorted(section.superseded.values(), key=lambda g: (label_of(g[0]), g[0]["_age"])):
        if "bayes_gap" in group[0]["metrics"]:
            _, lo, hi, _ = pooled_gap(group)
            value = f"gap [{fmt_sig(lo)}, {fmt_sig(hi)}]"
        else:
            nats, _ = across_seeds([r["metrics"]["loss"]["model"] for r in group])
            value = f"perplexity {exp_or_inf(nats):.2f}"
        items.append(f"{label_of(group[0])} @ {version_label(group[0])}: {value}, "
                     f"{plural(len(group), 'seed')}")
    return ["", "Older code versions of rows above, left out of the table: " + "; ".join(items)
            + "."]


def task_section(section: Section, figure: Path, figure_link: str) -> list[str]:
    runs = [r for group in section.rows.values() for r in group]
    newest = max(runs, key=lambda r: r["_age"])
    metrics = newest["metrics"]
    if metrics.get("scoring") == "perplexity":
        return perplexity_section(section, figure, figure_link)
    reference = metrics["gap_reference"]
    unit = "nats/token" if "accuracy" in metrics else "squared error per coordinate"
    lines = [f"## {section.title}", "",
             f"`{json.dumps(resolved_config(newest, 'task'), sort_keys=True)}` — gap to "
             f"`{reference}` ({metrics['gap_reference_role']}), {unit}; "
             f"{section.sequences} held-out sequences.", ""]
    if section.duplicates:
        lines += [f"{plural(section.duplicates, 'duplicate record')} (re-runs or resumed copies "
                  "of a seed already counted) left out; the newest record of each seed is used.",
                  ""]
    lines += conflict_note(section)
    losses = {version_label(r): r["metrics"]["loss"][reference] for r in runs}
    if max(losses.values()) - min(losses.values()) > 1e-9 * (1 + abs(max(losses.values()))):
        # same held-out set, different reference loss: the code versions disagree on the task
        lines += [f"Note: the loss of `{reference}` differs between code versions ("
                  + ", ".join(f"{code}: {fmt(loss, 6)}" for code, loss in sorted(losses.items()))
                  + "); compare rows of different code versions with care.", ""]
    lines += ["| model | code | Bayes gap | 95% CI | relative gap | params | state | steps | "
              "seeds | wall (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for row_key, group in section.rows.items():
        mean, lo, hi, half = pooled_gap(group)
        rel = sum(r["metrics"]["relative_gap"] for r in group) / len(group)
        wall = sum(r["train"]["wall_time_s"] for r in group) / len(group)
        code = version_label(group[0]) + incomplete_mark(section, row_key)
        rows.append((mean, label_of(group[0]), code, group,
                     f"{fmt_sig(mean)} | [{fmt_sig(lo)}, {fmt_sig(hi)}]"
                     f"{'' if half is None else ' (seeds)'} | "
                     f"{fmt_sig(100 * rel)}% | {group[0]['params']} | {group[0]['state_size']} | "
                     f"{group[0]['train']['steps']} | {len(group)} | {wall:.0f} |"))
    rows.sort(key=lambda row: (row[0], row[1], row[2]))
    labels = [label for _, label, _, _, _ in rows]
    models = {}
    for mean, label, code, group, cells in rows:
        lines.append(f"| {label} | {code} | {cells}")
        # legend names must be unique: add the code version, then the row's config digest
        name = label if labels.count(label) == 1 else f"{label} @ {code}"
        if name in models:
            name = f"{name} #{digest([group[0]['model'], group[0]['trainer']])}"
        models[name] = mean_curve([r["per_position"]["gap.model"] for r in group])
    lines += superseded_note(section)
    lines += ["", f"Reference losses from the newest record ({version_label(newest)}).",
              "", "| reference | role | loss | gap | 95% CI |", "|---|---|---|---|---|"]
    references = {}
    resolution = loss_resolution({n: metrics["gap"][n] for n in metrics["roles"]})
    for name in sorted(metrics["roles"], key=lambda n: metrics["loss"][n]):
        lo, hi = metrics["gap_ci"][name]
        lines.append(f"| {name} | {metrics['roles'][name]} | "
                     f"{fmt_loss(metrics['loss'][name], resolution)} | "
                     f"{fmt_sig(metrics['gap'][name])} | [{fmt_sig(lo)}, {fmt_sig(hi)}] |")
        if name != reference and f"gap.{name}" in newest["per_position"]:
            references[f"{name} ({metrics['roles'][name]})"] = newest["per_position"][f"gap.{name}"]
    plot_gaps(figure, f"{section.task}: gap to {reference} by position", models, references,
              f"loss − loss({reference})")
    lines += ["", f"![per-position gap]({figure_link})", ""]
    return lines


def figures_dir(out_dir: Path, out: Path) -> Path:
    """The committed board (leaderboard.md beside the results directory) keeps its figures in
    <out_dir>/figures; a board written under any other name or place gets <stem>-figures/ beside
    it, so writing one elsewhere (out=/tmp/lb.md) never rewrites the committed board's figures."""
    if out.name == "leaderboard.md" and out.resolve().parent == out_dir.resolve().parent:
        return out_dir / "figures"
    return out.parent / f"{out.stem}-figures"


def header(selection: Selection) -> list[str]:
    command = f"python -m bench leaderboard out_dir={selection.out_dir}" + (
        " include=all" if selection.include == "all" else "")
    scope = ("suite and ad-hoc records" if selection.include == "all"
             else "suite records only")
    notes = selection.notes()
    return ["# Leaderboard", "",
            f"Generated by `{command}` from {plural(selection.runs, 'run')} ({scope}"
            + "".join(f"; {note}" for note in notes)
            + (f"; {selection.superseded} of them by older code versions of a row, named below "
               "its section's table" if selection.superseded else "") + "). Bayes gap = held-out loss of the "
            "model − loss of the task's exact Bayes predictor on the same sequences (or of its "
            "clairvoyant bound, where the table says `bound`). Relative gap = gap / reference "
            "loss. State = floats carried to continue a sequence. Text tasks have no Bayes "
            "predictor: their sections show perplexity beside n-gram baselines.", "",
            "A section is one task config on one held-out set (task name + config + number of "
            "held-out sequences): gaps on different held-out sets are never pooled. A row pools "
            "distinct seeds of one model config and training budget run with one behavioural "
            "identity (`≡<identity>`: what the config does under the code that ran it, measured "
            "by `python -m bench identities` and kept in <out_dir>/identities.json, so records "
            "of commits whose code behaves alike pool; `, current`: today's code has that "
            "identity) or, for a record without one, one code version (the code of bench/, "
            "tasks/, models/, conf/ and pyproject.toml: commits that changed "
            "only other files pool; `code`: the commit of the row's first record; `+dirty`: that "
            "code differed from the commit; `?`: not recorded) in one environment (device, SSD "
            "kernel, precision, compile, TF32: CPU and GPU runs never pool; a row that did not "
            "run on the CPU says where in brackets). Each seed counts once: its newest record is "
            "used and re-runs or resumed copies are left out. Several seeds: mean gap and 95% "
            "t-interval across seeds (marked `(seeds)`); one seed: bootstrap interval over "
            "held-out sequences.", ""]


def write_leaderboard(selection: Selection, out: str = "leaderboard.md") -> Path:
    """Write the board (and its figures) for selection to out; refuse, leaving out as it was,
    when there is nothing to show or out cannot be written."""
    out_path = output_path(out)
    if not selection.runs:
        notes = selection.notes()
        why = f" ({'; '.join(notes)})" if notes else f" in {selection.out_dir.rstrip('/')}/"
        raise ConfigError(f"no usable run record{why}; {out} not written")
    figures = figures_dir(Path(selection.out_dir), out_path)
    not_plain = not_a_regular_file(figures, folder=True)
    if not_plain:
        raise ConfigError(f"the figures folder {figures} is {not_plain}; {out} not written")
    lines, drawn, made = header(selection), set(), not figures.exists()
    try:
        for section in selection.sections:
            figure = figures / f"{section.task}-{section.task_digest}-n{section.sequences}.png"
            link = Path(os.path.relpath(figure.resolve(), out_path.resolve().parent)).as_posix()
            lines += task_section(section, figure, link)
            drawn.add(figure.name)
        write_atomic(out_path, lambda tmp: Path(tmp).write_text("\n".join(lines)))
    except OSError as error:
        if made:  # nothing left behind: the folder and the figures drawn into it are ours
            shutil.rmtree(figures, ignore_errors=True)
        raise not_written(out, error) from None
    remove_stale_figures(figures, drawn)
    return out_path


def remove_stale_figures(figures: Path, drawn: set[str]) -> None:
    """The section figures of an earlier board that this one no longer has (a section merged or
    gone): left behind, they would look current. Only names the board gives its figures."""
    for path in figures.glob("*.png"):
        if path.name not in drawn and SECTION_FIGURE.fullmatch(path.name) and path.is_file():
            path.unlink()
