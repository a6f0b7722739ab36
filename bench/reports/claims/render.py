"""claims.md: one row per claim, grouped by paper (the suite's own extensions apart), with the
numbers that decided it, its control, rule, verdict and the command that makes its records."""
from __future__ import annotations

import functools
import math
import re
import shlex
from pathlib import Path

import yaml

from bench.config import ConfigError, conf_file, load_suite
from bench.config.formats import plural
from bench.records.store import not_written, output_path
from bench.reports.claims.spec import (PAPERS, Claim, Quantity, composed, default_rules,
                                       is_reference, load_claims, read_rules_text, rules_files,
                                       run_key)
from bench.reports.claims.rules import NO_INTERVAL
from bench.reports.claims.verdicts import FAILS, VERDICTS, Decision, Measured, decide_all
from bench.reports.selection import Selection
from tasks.files import write_atomic

SHOW_SEEDS_BELOW = 5  # seeds are listed one by one below this many (or when they split in two)


def num(x: float, like: float | None = None) -> str:
    """Four significant digits (of `like`, when given: an interval's ends follow its value)."""
    if x is None or not math.isfinite(x):
        return str(x)
    ref = abs(like if like is not None and math.isfinite(like) and like != 0 else x)
    if ref == 0:
        return "0"
    if ref < 1e-4 or ref >= 1e6:
        return f"{x:.3g}"
    decimals = max(0, 3 - math.floor(math.log10(ref)))
    return f"{x:.{decimals}f}"


def seeds_text(seeds: list[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}–{seeds[-1]}"
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, seeds))


def split_in_two(values: list[float]) -> bool:
    """Whether seeds fall into two groups: the widest gap between sorted values is over half
    their range (a mean and a t-interval then describe neither group)."""
    ordered = sorted(v for v in values if math.isfinite(v))
    if len(ordered) < 3 or ordered[-1] == ordered[0]:
        return False
    gap = max(b - a for a, b in zip(ordered, ordered[1:]))
    return gap > 0.5 * (ordered[-1] - ordered[0])


def measured_text(name: str, m: Measured) -> str:
    ci = ""
    if m.interval is not None and m.interval[0] != m.interval[1]:
        ci = f" [{num(m.interval[0], m.value)}, {num(m.interval[1], m.value)}]"
    each = ""
    if 1 < len(m.per_seed) and (len(m.per_seed) < SHOW_SEEDS_BELOW or split_in_two(m.per_seed)):
        each = f"; per seed {' / '.join(num(v, m.value) for v in m.per_seed)}"
    return f"`{name}` = {num(m.value)}{ci} ({seeds_text(m.seeds)}{each})"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def why_not(decision: Decision) -> str:
    """Why a claim is not measured: the protocol it needs, or the quantities without records."""
    if decision.claim.needs:
        return decision.note
    return ("no record of " + ", ".join(f"`{n}`" for n in decision.missing)
            + (f" — {decision.note}" if decision.note else ""))


def records_of(decision: Decision, names=None) -> frozenset[str]:
    """The run ids of the records behind decision's quantities (of names only, when given)."""
    return frozenset(run for name, m in decision.values.items()
                     if names is None or name in names for run in m.runs)


def shared_records(decisions: list[Decision]) -> dict[str, str]:
    """{claim id: a note naming the other claims decided on the same records}: such rows are
    one measurement read twice, not two pieces of evidence, and say so — those on exactly the
    same records, else those whose rules read the same records (their controls may differ)."""
    def groups(key) -> dict[frozenset, list[str]]:
        found: dict[frozenset, list[str]] = {}
        for d in decisions:
            runs = key(d)
            if d.verdict != "not measured" and runs:
                found.setdefault(runs, []).append(d.claim.id)
        return found
    notes: dict[str, str] = {}
    for ids in groups(records_of).values():
        for claim in ids:
            if len(ids) > 1:
                notes[claim] = "the same records as " + ", ".join(i for i in ids if i != claim)
    for ids in groups(lambda d: records_of(d, d.claim.rule.used)).values():
        for claim in ids:
            named = notes.get(claim, "")
            others = [i for i in ids if i != claim and i not in named.split(", ")
                      and f"as {i}" not in named]
            if others:
                notes[claim] = "; ".join(filter(None, [
                    named, "its rule reads the same records as " + ", ".join(others)]))
    # rules that read one model's records as two rows' evidence (one ablation, two claims): not
    # two pieces of evidence for it either
    def models(d: Decision) -> set[frozenset]:
        return {frozenset(m.runs) for name, m in d.values.items()
                if name in d.claim.rule.used and not is_reference(d.claim.quantities[name])}
    read = {d.claim.id: models(d) for d in decisions if d.verdict != "not measured"}
    for claim, runs in read.items():
        named = notes.get(claim, "")
        others = [other for other, theirs in read.items() if other != claim and runs & theirs
                  and other not in named]
        if others:
            notes[claim] = "; ".join(filter(None, [
                named, "its rule reads a model's records that " + ", ".join(others) +
                " also read"]))
    return notes


def ours_cell(decision: Decision, shared: str | None = None) -> str:
    """Our numbers, the scale and code version they come from, where they ran (machine and
    SSD kernel) unless on the CPU, and the other claims decided on the same records."""
    parts = [measured_text(name, decision.values[name]) for name in decision.claim.quantities
             if name in decision.values]
    machine, ran = decision.machine, []
    if machine is not None and not machine.default and parts:
        kernels = sorted({m.kernel for m in decision.values.values()} - {None})
        ran = [f"trained on [{machine.name}]"
               + (f" with SSD kernel {', '.join(kernels)}" if kernels else "")]
    if decision.verdict == "not measured":
        return "<br>".join([f"*not measured: {why_not(decision)}*", *parts,
                            *(f"*{text}*" for text in ran)])
    twins = disagreeing_twins(decision)
    codes = sorted({m.code for m in decision.values.values()})
    scale = "paper scale" if decision.scale == "paper" else "reduced (CPU) scale"
    tail = f"*{', '.join([scale, 'code ' + ', '.join(codes), *ran])}*" + (
        f"; {decision.note}" if decision.note else "") + (
        f"; {shared}" if shared else "") + (f"; {twins}" if twins else "")
    return "<br>".join([*parts, tail])


def disagreeing_twins(decision: Decision) -> str:
    """A note on the seeds whose records of one version disagree (the newest is used): pooled
    as one experiment, they did not reproduce each other, and the row must say so."""
    # every disagreement as (its size relative to the value used, measure, seed): measures share
    # seeds, so one measure's must not hide another's; the largest is the one reported
    found = [(abs(o - used) / max(abs(used), 1e-12), name, seed)
             for name, m in decision.values.items() for seed, (used, others) in m.twins.items()
             for o in others]
    if not found:
        return ""
    worst, name, seed = max(found)
    seeds = seeds_text(sorted({seed for _, _, seed in found}))
    size = f"{worst:.0%}" if worst >= 0.01 else f"{worst * 100:.1g}%"  # never "up to 0%"
    used = "the newest of each seed is used"
    if decision.on_draws is not None:
        newest, oldest = decision.on_draws
        used = (f"on the newest of each seed the verdict is {newest}, on the oldest {oldest}: "
                "it rests on the draw, so it is undecided")
    return (f"records of one version disagree on {seeds} (up to {size} of the value used, "
            f"`{name}` of seed {seed}: "
            "float-level differences between code versions or thread counts that training "
            f"amplifies); {used}")


def verdict_counts(decisions: list[Decision], bold: bool = False) -> str:
    """The verdicts counted apart for the papers' claims and the suite's own extensions (an
    extension's verdict is no evidence about a paper)."""
    parts = []
    for title, part in (("paper claim", [d for d in decisions if not d.claim.extension]),
                        ("extension", [d for d in decisions if d.claim.extension])):
        if part or title == "paper claim":
            counts = ", ".join(f"{sum(d.verdict == v for d in part)} {v}" for v in VERDICTS)
            what = plural(len(part), title)
            parts.append(f"{f'**{what}**' if bold else what} ({counts})")
    return "; ".join(parts)


CELL_BORDER = re.compile(r"(?<!\\)\|")  # a table row's borders; cell() escapes a | in a cell


def verdicts_in(text: str) -> dict[str, str]:
    """Each claim's verdict in a claims report that `render` wrote: the rows of its tables, id
    in the first cell and verdict in the sixth (a fail in bold). Other lines are skipped."""
    found = {}
    for line in text.splitlines():
        cells = [c.strip() for c in CELL_BORDER.split(line)]
        if len(cells) == 10 and not cells[0] and not cells[-1]:
            verdict = cells[6].removeprefix("**").removesuffix("**")
            if verdict in VERDICTS:
                found[cells[1]] = verdict
    return found


def verdict_changes(before: dict[str, str], decisions: list[Decision]) -> list[str]:
    """One line for each claim whose verdict differs from `before` (verdicts_in of an earlier
    report), for claims new since, and for claims gone."""
    now = {d.claim.id: d.verdict for d in decisions}
    return ([f"{claim}: {before[claim]} → {verdict}" for claim, verdict in now.items()
             if claim in before and before[claim] != verdict]
            + [f"{claim}: new, {verdict}" for claim, verdict in now.items() if claim not in before]
            + [f"{claim}: gone, was {verdict}" for claim, verdict in before.items()
               if claim not in now])


def header(selection: Selection, rules: Path, claims: list[Claim],
           decisions: list[Decision]) -> list[str]:
    command = f"python -m bench claims out_dir={selection.out_dir}" + (
        " include=all" if selection.include == "all" else "")
    scope = "suite and ad-hoc records" if selection.include == "all" else "suite records only"
    files = sorted({c.source for c in claims})
    where = rules.as_posix() if not rules.is_absolute() else rules.name
    notes = selection.notes()
    return ["# Claims", "",
            f"Generated by `{command}` from {plural(selection.runs, 'run')} ({scope}"
            + "".join(f"; {n}" for n in notes) + f") with the rules in `{where}` "
            f"({', '.join(files)}): {verdict_counts(decisions, bold=True)}.", "",
            "Each claim of the three papers is one row: where the paper makes it, the claim in a "
            "sentence, the paper's number, our number(s), the verdict, the rule that decided it "
            "and the command that produces its records. A rule is a boolean expression over the "
            "claim's quantities; each quantity is a record selector (overrides as on the command "
            "line, composed like a run; a record matches when its task, model and trainer "
            "configs equal them) and a metric path. Records are pooled as on the leaderboard: "
            "one environment (device, SSD kernel, precision, compile, TF32), one version (the "
            "records' behavioural identity where <out_dir>/identities.json has it — `≡<id>, "
            "current`: records of any commit whose code today's reproduces — else their code "
            "version; of several, the newest unless an older one has more seeds), each seed "
            "once (where two records of one seed and version disagree beyond rounding, the "
            "newest, and the row says so; the claim is decided on the oldest too, and is "
            "undecided where that verdict differs), a quantity from the records that carry its "
            "metric, and all quantities of a claim from "
            "one machine (device and TF32: CPU and GPU runs are never compared or pooled; the "
            "machine where most quantities have records, then the most seeds, then the newest; "
            "named in the row unless the CPU); several seeds "
            "show the mean and a 95% t-interval across seeds, one seed its record's bootstrap "
            "interval (or ±1.96 standard errors; a slice of a per-position curve ±1.96 times "
            "the mean of its positions' standard errors, which bounds the standard error of "
            "their mean from above), and a "
            "reference, one number on every seed (the held-out set they share), its records' "
            "bootstrap interval. A number whose records give it no interval has unknown noise: "
            "a comparison that counts no noise at all decides nothing (*no interval*), unless "
            "its claim declares the quantity exact (a function of the trained weights alone), "
            "and one that leaves out some quantity's noise says so.", "",
            "Comparisons are paired: each comparison of a rule (`a < b`, `t1 >= 0.5 * unigram`) "
            "is decided on its difference (left − right), taken seed by seed where the "
            "quantities share seeds — the models of one seed saw the same training batches, and "
            "every model is scored on the same held-out sequences — with the 95% t-interval of "
            "the per-seed differences; on one shared seed, a bootstrap over the held-out "
            "sequences of the records' per-sequence losses (and of the per-sequence values "
            "behind a task metric that keeps them, such as an error distribution's spread), "
            "resampled together; only where "
            "neither exists (different seeds, older records without per-sequence losses of the "
            "references) are the quantities' own intervals combined, and the row says "
            "*unpaired*. Each comparison is listed under the rule with its difference, interval "
            "and pairing. `abs(a - b) <= margin` is an equivalence test with the margin the rule "
            "states (two one-sided tests: a − b − margin and b − a − margin both below 0). A "
            "claim about each trained model (`per_seed`) is judged seed by seed and says k of "
            "n seeds: it holds when every seed holds, and seeds that disagree leave it "
            "undecided. A control marked *on seed s* asks whether the protocol can train the "
            "control's model at all, which one seed shows: it is judged on the seed whose run "
            "ended with the lowest training loss (chosen from the training curves, never the "
            "held-out sequences), while the rule reads every seed. A claim whether the protocol "
            "trains a model to a level, whose seeds split (some stall, some learn: a mean "
            "describes neither group), is judged the same way, whole, *on seed s* (the best run "
            "of a grid of widths, where it names several): that the model reaches the level, "
            "which one run shows, or that it does not, which one run refutes; every seed's "
            "verdict is still listed. Seeds added by the power plan "
            "(`python -m bench claims plan`) come from `python -m bench suite name=claims_power`.",
            "",
            "Verdicts — a claim is decided only when the evidence could have gone the other way: "
            "its **control** (a positive control trained under the same protocol, e.g. the "
            "2-layer transformer learns when the 1-layer one is said to fail, or the model beats "
            "its no-learning baseline) must hold, and every comparison is made on 95% intervals, "
            "deciding only when they are apart: **holds** — the rule holds on records at the "
            "paper's scale (or the claim is about the task itself); **holds at reduced scale** — "
            "it holds on CPU-sized runs of a claim the paper made at GPU scale; **fails** (**at "
            "reduced scale** on CPU-sized runs) — the control held and the rule is false, "
            "intervals apart; **task cannot separate** — "
            "the task itself leaves less room than the rule's margin (its `separable` "
            "condition is false: e.g. what in-context inference can gain on it, Bayes over the "
            "clairvoyant bound, is below the difference the rule asks for), so no outcome of "
            "the models would be evidence; the row gives the bound; **not reached at reduced "
            "scale** — the control did not hold: the models did not train at our budget, which "
            "is no evidence about the paper; **undecided** — intervals overlap, a quantity is "
            "not a number, or the verdict rests on which of a seed's disagreeing records is "
            "used; **not measured** — a quantity has no record yet (the row says which "
            "and what to run; *needs a GPU* where it cannot run on a CPU), or the claim needs a "
            "protocol the code does not have yet. A verdict at reduced scale is about "
            "CPU-sized runs (smaller models, fewer steps and seeds) under the paper's protocol: "
            "it can show that an effect appears, or does not, at that budget; it cannot show "
            "that the paper's numbers at its own scale are wrong. Seeds are listed one by one where there are "
            "fewer than 5 or they split into two groups. Claims the papers do not make — the "
            "suite's own extensions — are in a section of their own.", ""]


def paper_titles(rules: Path) -> dict[str, str]:
    titles = {}
    for file in rules_files(rules):
        data = yaml.safe_load(read_rules_text(file)) or {}
        if isinstance(data, dict) and data.get("title"):
            titles[str(data.get("paper"))] = str(data["title"])
    return titles


def evidence(decision: Decision) -> str:
    claim = decision.claim
    numbers = "; ".join(measured_text(n, decision.values[n]) for n in claim.quantities
                        if n in decision.values)
    measured = (f" Measured ({decision.verdict}, rule `{claim.rule.text}`): {numbers}."
                if decision.verdict != "not measured"
                else f" From records: not measured yet ({why_not(decision)}).")
    return f"- **{claim.id}** ({claim.section}): {claim.contradicts}{measured}"


@functools.lru_cache(maxsize=None)
def suite_run_keys(name: str) -> frozenset[str]:
    """The run keys (spec.run_key: what makes records pool, seed aside) of a suite's entries:
    computed once a suite, as every claim not measured asks each of its suites for them."""
    return frozenset(run_key(composed(tuple(entry))) for entry in load_suite(name))


def producing(command: str, quantity: Quantity) -> bool:
    """Whether command (a suite) has an entry that makes records of quantity; a command that is
    not a suite is taken at its word."""
    words = shlex.split(command)
    if words[3] != "suite":
        return True
    name = next(a.split("=", 1)[1] for a in words[4:] if a.startswith("name="))
    return run_key(quantity.config) in suite_run_keys(name)


def commands_for(decision: Decision) -> list[str]:
    """The claim's commands that would make its missing records (all of them for a claim that
    needs a protocol first, or when none is found to match)."""
    claim = decision.claim
    if claim.needs or not decision.missing:
        return claim.commands
    found = [c for c in claim.commands
             if any(producing(c, claim.quantities[name]) for name in decision.missing)]
    return found or claim.commands


def to_measure(decisions: list[Decision]) -> list[str]:
    """The commands that would decide the claims not measured yet, with the suite's header."""
    by_command: dict[str, list[Decision]] = {}
    for d in decisions:
        if d.verdict == "not measured":
            for command in commands_for(d):
                by_command.setdefault(command, []).append(d)
    if not by_command:
        return []
    lines = ["## To measure the rest", "",
             "| command | claims | runs on | what it is |", "|---|---|---|---|"]
    for command, ds in sorted(by_command.items()):
        words = shlex.split(command)
        about = ""
        if words[3] == "suite":
            name = next(a.split("=", 1)[1] for a in words[4:] if a.startswith("name="))
            first = conf_file("suite", name).read_text().splitlines()
            about = " ".join(l.lstrip("# ").strip() for l in first[:2] if l.startswith("#"))
        gpu = any(d.claim.gpu for d in ds)
        blocked = [d.claim.id for d in ds if d.claim.needs]
        where = "a GPU" if gpu else "a CPU"
        if blocked:
            where += f" ({', '.join(blocked)}: not before the protocol it needs exists)"
        lines.append(f"| `{command}` | {', '.join(d.claim.id for d in ds)} | {where} | "
                     f"{cell(about)} |")
    return lines + [""]


def test_text(test) -> str:
    """A comparison as it was decided: its difference left − right with the 95% interval, and
    how it was paired."""
    like = max((abs(x) for x in (test.difference, *test.interval) if math.isfinite(x)),
               default=None)
    mark = {True: "✓", False: "✗", None: "?"}[test.outcome]
    if test.why.startswith(NO_INTERVAL):
        return f"{mark} `{test.text}`: difference {num(test.difference, like)}, {test.why}"
    how = f"paired, {test.paired}" if test.paired else "unpaired"
    return (f"{mark} `{test.text}`: difference {num(test.difference, like)} "
            f"[{num(test.interval[0], like)}, {num(test.interval[1], like)}] ({how}{test.note})")


def table_row(d: Decision, shared: str | None = None) -> str:
    c = d.claim
    verdict = f"**{d.verdict}**" if d.verdict in FAILS else d.verdict
    commands = "<br>".join(f"`{x}`" for x in c.commands)
    paper = c.paper_number + (f"<br>*“{c.quote}”*" if c.quote else "")
    if c.control is not None:
        mark = {True: "✓", False: "✗", None: "?"}[d.control] if d.values else ""
        on = "; ".join(
            f"`{name}` on its seed {seed} of {of}" if seed is not None else
            f"`{name}` on no seed (none of {of} has a training curve)"
            for name, (seed, of) in d.control_on.items())
        if on:
            on = f" ({on}: the lowest final training loss)"
        logic = (f"control{(' ' + mark) if mark else ''}{on}: `{c.control.text}`<br>"
                 f"rule: `{c.rule.text}`")
    else:
        logic = f"{c.kind}: `{c.rule.text}`" if c.kind != "trained" else f"`{c.rule.text}`"
    if d.judged_on is not None:
        seed, of = d.judged_on
        logic = (f"on seed {seed} of {of} (the lowest final training loss of "
                 f"{' or '.join(f'`{name}`' for name in c.judge_seed)})" if seed is not None else
                 f"on no seed (none of {of} has a training curve)") + f": {logic}"
    if c.separable is not None:
        mark = {True: " ✓", False: " ✗", None: " ?"}[d.separable] if d.values else ""
        logic = f"separable{mark}: `{c.separable.text}`<br>{logic}"
    if d.tests:
        logic += "<br>" + "<br>".join(test_text(t) for t in d.tests)
    return "| " + " | ".join(cell(x) for x in (
        c.id, c.section, c.text, paper, ours_cell(d, shared), verdict, logic, commands)) + " |"


def render(selection: Selection, rules: Path, claims: list[Claim],
           decisions: list[Decision]) -> str:
    lines = header(selection, rules, claims, decisions)
    titles = paper_titles(rules)
    shared = shared_records(decisions)
    for paper in PAPERS:
        ds = [d for d in decisions if d.claim.paper == paper]
        if not ds:
            continue
        counts = ", ".join(f"{n} {v}" for v in VERDICTS
                           if (n := sum(d.verdict == v for d in ds)))
        lines += [f"## {paper} — {titles.get(paper, 'paper ' + paper)}", "",
                  f"{plural(len(ds), 'claim')}: {counts}.", ""]
        for title, part in (("", [d for d in ds if not d.claim.extension]),
                            ("The suite's own extensions (claims the paper does not make)",
                             [d for d in ds if d.claim.extension])):
            if not part:
                continue
            if title:
                lines += [f"### {title}", ""]
            lines += ["| id | section | claim | paper | ours | verdict | control · rule | "
                      "reproduce |", "|---|---|---|---|---|---|---|---|"]
            lines += [table_row(d, shared.get(d.claim.id)) for d in part]
            lines.append("")
        # the evidence stands beside a claim the records contradict, or one not measured yet
        # (its note then says where its numbers come from); a claim that now holds drops it
        against = [d for d in ds if d.claim.contradicts and d.verdict in (*FAILS, "not measured")]
        if against:
            lines += ["", "**Evidence against the paper**", ""]
            lines += [evidence(d) for d in against]
        lines.append("")
    return "\n".join(lines + to_measure(decisions))


def write_claims(selection: Selection, out: str = "claims.md", rules: str | Path | None = None,
                 claims: list[Claim] | None = None) -> tuple[Path, list[Decision]]:
    """Decide every claim from selection's records and write out atomically; refuse, leaving
    out as it was, when the rules are bad, no record is usable or out cannot be written."""
    out_path = output_path(out)
    rules_path = Path(rules) if rules else default_rules()
    claims = load_claims(rules_path) if claims is None else claims
    if not selection.runs:
        notes = selection.notes()
        why = f" ({'; '.join(notes)})" if notes else f" in {selection.out_dir.rstrip('/')}/"
        raise ConfigError(f"no usable run record{why}; {out} not written")
    decisions = decide_all(claims, selection)
    shown = rules_path
    try:
        shown = rules_path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    text = render(selection, shown, claims, decisions)
    try:
        write_atomic(out_path, lambda tmp: Path(tmp).write_text(text))
    except OSError as error:
        raise not_written(out, error) from None
    return out_path, decisions
