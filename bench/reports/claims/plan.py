"""`python -m bench claims plan`: for each undecided claim, the seeds its undecided comparisons
need, what they cost here, and the runs that make them (a suite file that `python -m bench
suite` runs and, interrupted, resumes).

A comparison paired across n seeds has a difference d̄ and, from its t-interval, a per-seed
spread s; the plan is the smallest n' at which the same effect with the same spread would
decide, t(n'−1)·s/√n' < |d̄| — an estimate, not a promise: d̄ and s come from n seeds. A
comparison read on one seed has no spread to estimate: it gets seeds up to 3, which give one.
One that would need more than MAX_SEEDS is listed as not decidable by seeds at this effect
size; so is a per-seed claim whose seeds disagree (more seeds cannot make them agree) and a
quantity that is not a number."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from bench.config.formats import plural
from bench.reports.claims.verdicts import Decision
from tasks.files import write_atomic
from tasks.stats import t_quantile

MAX_SEEDS = 30
FIRST_SPREAD = 3  # seeds that give a one-seed comparison a spread to judge


@dataclass
class Need:
    """What one undecided claim needs."""

    claim: str
    tests: list[str]  # its undecided comparisons
    seeds_now: int
    seeds: int | None  # in all, for the comparison that needs most; None: not by seeds
    why: str = ""  # why not by seeds
    # (selector, seed) of each run to add -> its CPU seconds here (None: unknown)
    runs: dict[tuple[tuple[str, ...], int], float | None] = field(default_factory=dict)

    @property
    def cpu_s(self) -> float | None:
        costs = list(self.runs.values())
        return None if any(c is None for c in costs) else sum(costs)


def seeds_to_decide(difference: float, interval: tuple[float, float], n: int) -> int | None:
    """The seeds at which a paired difference with this mean and spread decides (module doc)."""
    if n < 2:
        return FIRST_SPREAD
    half = (interval[1] - interval[0]) / 2
    spread = half * math.sqrt(n) / t_quantile(n - 1)
    if not math.isfinite(spread) or not math.isfinite(difference) or difference == 0:
        return None
    for m in range(n + 1, MAX_SEEDS + 1):
        if t_quantile(m - 1) * spread / math.sqrt(m) < abs(difference):
            return m
    return None


MODEL_METRICS = ("bayes_gap", "relative_gap", "l1_to_bayes", "probe", "gap_closed")


def is_reference(quantity) -> bool:
    """Whether a quantity reads a reference's number (the same on every seed: a predictor other
    than the model, e.g. metrics.gap.unigram, per_position.loss.bayes[0])."""
    path = quantity.path
    if len(path) > 1 and path[0] == "metrics" and path[1] in MODEL_METRICS:
        return False
    return path[-1].split(".")[-1] != "model"


def need_of(decision: Decision) -> Need:
    claim = decision.claim
    open_tests = [t for t in decision.tests if t.outcome is None]
    seeds_now = min((len(m.seeds) for m in decision.values.values()), default=0)
    need = Need(claim.id, [t.text for t in open_tests], seeds_now, None)
    if claim.per_seed:
        need.why = ("a claim about each run, judged on each seed's own record: more seeds "
                    "cannot make seeds that disagree agree, nor narrow one seed's interval")
        return need
    if not open_tests:
        need.why = decision.note or "nothing to estimate"
        return need
    quantities = (claim.paper_quantities if decision.scale == "paper" and claim.paper_quantities
                  else claim.quantities)
    wanted = []
    for test in open_tests:
        if all(is_reference(quantities[name]) for name in test.names):
            need.why = (f"`{test.text}` compares references, the same on every seed: their "
                        "held-out noise shrinks with more held-out sequences "
                        "(trainer.eval_sequences), not with seeds")
            return need
        n = int(test.paired.split()[0]) if test.paired.endswith("seeds") else 1
        m = seeds_to_decide(test.difference, test.interval, n)
        if m is None:
            need.why = (f"`{test.text}`: " + ("not a number" if math.isnan(test.difference)
                        else f"needs more than {MAX_SEEDS} seeds at this effect size"))
            return need
        wanted.append((test, m))
    need.seeds = max(m for _, m in wanted)
    for test, m in wanted:
        for name in test.names:
            measured, selector = decision.values[name], tuple(quantities[name].where)
            for seed in sorted(set(range(m)) - set(measured.seeds)):
                need.runs.setdefault((selector, seed), measured.wall_time_s)
    return need


def make_plan(decisions: list[Decision]) -> list[Need]:
    """Every undecided claim's need, the cheapest per claim first (those seeds cannot decide
    last)."""
    needs = [need_of(d) for d in decisions if d.verdict == "undecided"]
    return sorted(needs, key=lambda n: (n.seeds is None, n.cpu_s is None, n.cpu_s or 0.0,
                                        n.claim))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def plan_table(needs: list[Need], budget_s: float | None
               ) -> tuple[list[str], list[Need], float]:
    """The plan as markdown lines, the needs that fit the budget (cheapest first) and their CPU
    seconds, a run shared by several claims counted once."""
    lines = ["| claim | undecided comparisons | seeds now → to decide | runs to add | CPU time |",
             "|---|---|---|---|---|"]
    chosen, spent, planned = [], 0.0, set()
    for need in needs:
        tests = "<br>".join(f"`{t}`" for t in need.tests) or "—"
        if need.seeds is None:
            lines.append(f"| {need.claim} | {tests} | {need.seeds_now} → not by seeds: "
                         f"{need.why} | — | — |")
            continue
        extra = sum(c or 0.0 for r, c in need.runs.items() if r not in planned)
        fits = budget_s is None or (need.cpu_s is not None and spent + extra <= budget_s)
        if fits:
            chosen.append(need)
            planned.update(need.runs)
            spent += extra
        mark = "" if fits else " (over the budget)"
        lines.append(f"| {need.claim} | {tests} | {need.seeds_now} → {need.seeds} | "
                     f"{len(need.runs)} | {duration(need.cpu_s)}{mark} |")
    return lines, chosen, spent


def suite_yaml(needs: list[Need], command: str) -> str:
    """A suite file of the needs' runs, each once, in the needs' order (cheapest claim first:
    an interrupted suite has decided what it could)."""
    runs = list(dict.fromkeys(run for need in needs for run in sorted(need.runs)))
    claims = ", ".join(n.claim for n in needs)
    lines = [f"# Made by `{command}`: the seeds that a power estimate says would decide "
             f"{claims or 'nothing'}.", "runs:"]
    lines += [f"  - [{', '.join([*selector, f'seed={seed}'])}]" for selector, seed in runs]
    return "\n".join(lines) + "\n" if runs else "\n".join(lines) + " []\n"


def power_plan(decisions: list[Decision], budget_s: float | None, out: Path | None,
               command: str, out_dir: str) -> str:
    """The plan's report: its table, a summary line, and (out) the suite file it wrote."""
    needs = make_plan(decisions)
    lines, chosen, spent = plan_table(needs, budget_s)
    runs = {run for need in chosen for run in need.runs}
    decidable = [n for n in needs if n.seeds is not None]
    budget = f" within {budget_s / 3600:g} h" if budget_s is not None else ""
    lines.append(f"{plural(len(needs), 'undecided claim')}: {len(decidable)} a power estimate "
                 f"says more seeds would decide; {plural(len(chosen), 'claim')} chosen{budget}: "
                 f"{plural(len(runs), 'run')}, {duration(spent)} of CPU here (from the records' "
                 "wall times)")
    if out is not None:
        text = suite_yaml(chosen, command)
        write_atomic(out, lambda tmp: Path(tmp).write_text(text))
        lines.append(f"{out}: {plural(len(runs), 'run')}; run them with python -m bench suite "
                     f"name={out} out_dir={out_dir}")
    return "\n".join(lines)
