"""leaderboard.md from run records: per task and held-out set, the Bayes gap of every model with
its interval, the figures of each section, and the notes on what was left out. Which records
pool into a row: bench/reports/selection.py (the header of leaderboard.md repeats its rules)."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
from pathlib import Path

from bench.config import ConfigError
from bench.config.formats import fmt, fmt_loss, fmt_sig, loss_resolution, plural
from bench.records.store import not_a_regular_file, not_written, output_path
from bench.reports.identities import resolved_config
from bench.reports.plot import plot_gaps
from bench.reports.selection import (Section, Selection, code_label, commit_of, digest, headline,
                                     label_of, version_label)
from tasks.files import write_atomic
from tasks.stats import across_seeds

SECTION_FIGURE = re.compile(r"[\w.-]+-[0-9a-f]{8}-n\d+\.png")  # write_leaderboard's names


def exp_or_inf(x: float) -> float:
    """math.exp, or infinity where it overflows (a perplexity beyond the float range)."""
    return math.exp(x) if x < 709.0 else math.inf


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
        models[name] = [r["per_position"]["loss.model"] for r in group]
    lines += superseded_note(section)
    lines += ["", "| baseline | perplexity | 95% CI | nats/token | bits/byte |",
              "|---|---|---|---|---|"]
    references = {}
    for name in sorted(metrics["roles"], key=lambda n: metrics["loss"][n]):
        lo, hi = metrics["perplexity_ci"][name]
        lines.append(f"| {name} | {metrics['perplexity'][name]:.2f} | [{lo:.2f}, {hi:.2f}] | "
                     f"{fmt(metrics['loss'][name])} | {fmt(metrics['bits_per_byte'][name], 3)} |")
        references[f"{name} (baseline)"] = newest["per_position"].get(f"loss.{name}", [])
    plot_gaps(figure, f"{section.task}: loss by position", models, references,
              "loss (nats/token)")
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
        models[name] = [r["per_position"]["gap.model"] for r in group]  # a band across seeds
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
              f"gap to {reference}, loss − loss({reference}) "
              f"({'nats/token' if 'accuracy' in metrics else 'squared error'})")
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
