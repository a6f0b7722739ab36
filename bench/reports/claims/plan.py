"""`python -m bench claims plan`: for each open claim (undecided, not reached at reduced scale, not
measured), what would decide it and what that costs here: the seeds its undecided comparisons
need and the runs that make them (a suite file that `python -m bench suite` runs and,
interrupted, resumes), or, where seeds cannot, what can (more steps, more held-out sequences, a
GPU, a protocol the code lacks) with the price of what is known.

A comparison paired across n seeds has a difference d̄ and a half-width in two parts: the seeds'
t-interval, from a per-seed spread s, and the held-out set's, h, which more seeds do not narrow
(every seed is scored on the same held-out sequences). The plan is the smallest n' at which the
same effect with the same spread would decide, hypot(t(n'−1)·s/√n', h) < |d̄| — an estimate, not a
promise: d̄ and s come from n seeds. Where h alone reaches |d̄|, seeds cannot decide it. A
comparison read on one seed has no spread to estimate: it gets seeds up to 3, which give one. One
that would need more than MAX_SEEDS is listed as not decidable by seeds at this effect size; so
is a per-seed claim whose seeds disagree (more seeds cannot make them agree), a comparison whose
seeds split, holding on some seeds' own intervals and failing on others' (seeds_split: more
seeds only estimate the share), and a quantity that is not a number. A claim not reached (its
control's models did not train, or its model did not reach the level) is priced at twice the
steps of the runs of its failed comparisons' models, or at what the rate so far asks (so_far:
from records of its configs at a smaller budget, else from its runs' training curves), and not
at more steps where that is over MAX_STEPS_FACTOR; one not measured at the runs of its missing
quantities, three seeds each, timed from records of the same task and model."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from bench.config.formats import plural
from bench.reports.claims.rules import Interval, Rule, Sample, Test
from bench.reports.claims.spec import DEFAULT_METRIC, composed, is_reference, run_key
from bench.reports.claims.verdicts import Decision, judge_seeds
from bench.reports.costs import duration
from tasks.files import write_atomic
from tasks.stats import t_quantile

MAX_SEEDS = 30
FIRST_SPREAD = 3  # seeds that give a one-seed comparison a spread to judge
OPEN = ("undecided", "not reached at reduced scale", "not measured")
STEPS_FACTOR = 2  # a control that did not train is priced at this many times its steps
MAX_STEPS_FACTOR = 16  # or at what the rate so far asks, up to this; beyond it: not by steps
# metrics whose change over a run its training curve estimates: the held-out loss on the scored
# positions the training loss averages, and that loss less a reference's, which steps leave be
TRAIN_LOSS_UNITS = (DEFAULT_METRIC, "metrics.loss.model", "metrics.gap.model")

Run = tuple[tuple[str, ...], int]  # (selector, seed)


@dataclass
class Need:
    """What one open claim needs."""

    claim: str
    verdict: str
    tests: list[str]  # its undecided (or, not reached: failed control) comparisons
    seeds_now: int
    seeds: int | None  # in all, for the comparison that needs most; None: not by seeds
    why: str = ""  # why not by seeds, and what would decide it instead
    # (selector, seed) of each run to add -> its CPU seconds here (None: unknown)
    runs: dict[Run, float | None] = field(default_factory=dict)
    # what decides it when seeds cannot, and its CPU seconds here (None: unknown, or no CPU price)
    other_s: float | None = None

    @property
    def cpu_s(self) -> float | None:
        if self.seeds is None:
            return self.other_s
        costs = list(self.runs.values())
        return None if any(c is None for c in costs) else sum(costs)


def seeds_to_decide(difference: float, seed_half: float, n: int, held_out_half: float = 0.0
                    ) -> int | None:
    """The seeds at which a paired difference with this mean, seed half-width over n seeds and
    held-out half-width decides (module doc); None when no count up to MAX_SEEDS does."""
    if n < 2:
        return FIRST_SPREAD
    spread = seed_half * math.sqrt(n) / t_quantile(n - 1)
    if not (math.isfinite(spread) and math.isfinite(difference) and difference != 0
            and math.isfinite(held_out_half)) or held_out_half >= abs(difference):
        return None
    for m in range(n + 1, MAX_SEEDS + 1):
        if math.hypot(t_quantile(m - 1) * spread / math.sqrt(m), held_out_half) < abs(difference):
            return m
    return None


def _quantities(decision: Decision):
    claim = decision.claim
    return (claim.paper_quantities if decision.scale == "paper" and claim.paper_quantities
            else claim.quantities)


def _undecided(decision: Decision, need: Need) -> Need:
    claim, quantities = decision.claim, _quantities(decision)
    open_tests = [t for t in decision.tests if t.outcome is None]
    need.tests = [t.text for t in open_tests]
    if claim.per_seed:
        need.why = each_seed_open(decision)
        return need
    if claim.judge_seed:
        need.why = ("judged on the seed that trained best: more seeds do not narrow its "
                    "interval; more held-out sequences (trainer.eval_sequences) do")
        return need
    if decision.on_draws is not None and not open_tests:
        newest, oldest = decision.on_draws
        need.why = (f"the verdict rests on which of a seed's disagreeing records is used ({newest} "
                    f"on the newest, {oldest} on the oldest): more seeds, until no one draw "
                    "decides it; the power estimate cannot say how many")
        return need
    if not open_tests:
        need.why = decision.note or "nothing to estimate"
        return need
    wanted = []
    for test in open_tests:
        if all(is_reference(quantities[name]) for name in test.names):
            need.why = (f"`{test.text}` compares references, the same on every seed: their "
                        "held-out noise shrinks with more held-out sequences "
                        "(trainer.eval_sequences), not with seeds")
            return need
        if math.isnan(test.difference):
            need.why = f"`{test.text}`: not a number"
            return need
        if test.seeds >= 2:
            if (split := seeds_split(decision, test)) is not None:
                need.why = (f"`{test.text}`: its seeds split, {split}: more seeds would estimate "
                            "how many fall on each side, and a mean over seeds turns their share "
                            "into the verdict; a rule about each seed (per_seed) or about the "
                            "seed that trained best (judge_seed) says what the split means")
                return need
            m = seeds_to_decide(test.difference, test.seed_half, test.seeds, test.held_out_half)
            if m is None:
                need.why = f"`{test.text}`: " + (
                    f"the held-out set's noise alone (±{test.held_out_half:.3g}) reaches the "
                    f"difference {test.difference:.3g}: more held-out sequences "
                    "(trainer.eval_sequences), not seeds" + (
                        ", or records that keep the per-sequence values (today's code) to pair "
                        "it" if "unpaired" in test.paired else "")
                    if test.held_out_half >= abs(test.difference)
                    else f"needs more than {MAX_SEEDS} seeds at this effect size")
                return need
        else:  # one seed, or quantities on different seeds: each gets seeds to FIRST_SPREAD
            m = max([FIRST_SPREAD] + [len(decision.values[n].seeds) for n in test.names])
        wanted.append((test, m))
    need.seeds = max(m for _, m in wanted)
    for test, m in wanted:
        # a reference's records too: a comparison pairs on the seeds every quantity has, so a
        # reference read from another model's records (t1's gd1, from Mamba's) needs its seeds
        for name in test.names:
            measured, selector = decision.values[name], tuple(quantities[name].where)
            for seed in sorted(set(range(m)) - set(measured.seeds)):
                need.runs.setdefault((selector, seed), measured.wall_time_s)
    return need


def each_seed_open(decision: Decision) -> str:
    """Why a claim judged seed by seed (per_seed) is undecided, and what would decide it: seeds
    whose models trained and whose verdicts disagree leave it so whatever more runs show; seeds
    open on their own held-out intervals (their control, or their rule) close with more held-out
    sequences, which narrow one seed's interval, where more seeds do not."""
    held, failed, open_ = [], [], []
    each = judge_seeds(decision.claim, decision.scale == "cpu", decision.values)
    for seed, (verdict, control, *_) in each.items():
        if control is None or verdict == "undecided":
            open_.append(seed)
        elif control and verdict.startswith("holds"):
            held.append(seed)
        elif control and verdict.startswith("fails"):
            failed.append(seed)
    if held and failed:
        return (f"its seeds that trained disagree: it holds on {_seeds(held)} and fails on "
                f"{_seeds(failed)}, each on its own held-out interval, so a claim about each run "
                "stays undecided whatever more seeds or held-out sequences show")
    if open_:
        one = len(open_) == 1
        how_many = sequences_to_decide(decision, [each[seed][3] for seed in open_])
        return (f"{_seeds(open_)} {'is' if one else 'are'} open on {'its' if one else 'their'} "
                f"own held-out interval{'' if one else 's'}: more held-out sequences "
                f"(trainer.eval_sequences){how_many} would decide them; more seeds would not")
    return "a claim about each run, judged on each seed's own record"


def sequences_to_decide(decision: Decision, seeds_tests: list[list[Test]]) -> str:
    """How many held-out sequences would close the open comparisons of the open seeds (each
    seed's tests, judge_seeds), were their differences what they are now: an interval's
    half-width shrinks as 1/√n, so n grows by (half-width / |difference|)² for the widest of them
    (the estimate of an even chance; '' where a difference is 0 or the quantities' held-out sizes
    differ)."""
    sizes = {m.config.trainer.eval_sequences for m in decision.claim.quantities.values()}
    factor = 0.0
    for tests in seeds_tests:
        for test in tests:
            if test.outcome is None:
                half = (test.interval[1] - test.interval[0]) / 2
                if not test.difference or not math.isfinite(half / test.difference):
                    return ""
                factor = max(factor, (half / test.difference) ** 2)
    if len(sizes) != 1 or factor <= 1:
        return ""
    n = sizes.pop()
    return f", about {factor:.0f}× the {n} ({math.ceil(factor * n):,} sequences) at these differences,"


def _seeds(seeds: list[int]) -> str:
    return f"seed{'s' * (len(seeds) != 1)} {', '.join(map(str, seeds))}"


def seed_outcomes(decision: Decision, test: Test) -> tuple[list[int], list[int], int]:
    """The seeds on which a comparison, decided on each seed's record alone (its own held-out
    interval), holds and those on which it fails, and how many seeds its quantities share."""
    names = list(dict.fromkeys(test.names))
    seeds = sorted(set.intersection(*(set(decision.values[n].seeds) for n in names)))
    outcomes = {seed: decided(test, {n: decision.values[n].seed_sample(seed)
                                     for n in names}).outcome for seed in seeds}
    return ([seed for seed, o in outcomes.items() if o is True],
            [seed for seed, o in outcomes.items() if o is False], len(seeds))


def seeds_split(decision: Decision, test: Test) -> str | None:
    """Where a comparison, decided on each seed's record alone (its own held-out interval),
    holds on some seeds and fails on others: how many of each, and which. None where the seeds
    do not split so (they agree, or some are open and the others agree)."""
    held, failed, n = seed_outcomes(decision, test)
    if not held or not failed:
        return None
    return (f"{len(held)} of {n} holding (seed{'s' * (len(held) > 1)} "
            f"{', '.join(map(str, held))}) and {len(failed)} failing "
            f"({', '.join(map(str, failed))}) on their own held-out intervals")


def decided(test: Test, samples: dict[str, Sample]) -> Test:
    """The comparison `test` decided again, on other samples of its quantities."""
    return Rule(test.text, test.names, test.text).decide(samples)[1][0]


def so_far(decision: Decision, test: Test) -> tuple[str, float] | None:
    """What more steps have done for a failed comparison, and the factor of steps at which,
    going on at that rate a doubling, its difference would reach 0 (inf: it got no closer).
    The rate is read from its models' values at the largest budget below theirs that the
    records have (Decision.budgets) and at theirs; where they have none, from their training
    curves (halfway). None where neither says, or the comparison is not an order (== or !=)."""
    quantities = _quantities(decision)
    op = re.search(r" (<=|>=|<|>) ", test.text)
    trained = [n for n in test.names if not is_reference(quantities[n])]
    steps = {quantities[n].config.trainer.max_steps for n in trained}
    if op is None or len(steps) != 1:
        return None
    now = steps.pop()
    earlier = set.intersection(*({s for s in decision.budgets.get(n, {}) if s < now}
                                 for n in trained))
    if earlier:
        then = max(earlier)
        values = {n: decision.budgets.get(n, {}).get(then, decision.values[n].value)
                  for n in test.names}
        said = ", ".join(f"`{n}` {decision.budgets[n][then]:.4g} at {then:,} → "
                         f"{decision.values[n].value:.4g} at {now:,} steps" for n in trained)
    elif (found := halfway(decision, quantities, trained)) is not None:
        then, (values, said) = now // 2, found
    else:
        return None
    before = decided(test, {n: Sample({}, Interval.point(v)) for n, v in values.items()}
                     ).difference
    sign = 1.0 if op.group(1) in ("<", "<=") else -1.0  # the way the difference must go
    gained = sign * (before - test.difference) / math.log2(now / then)  # a doubling of steps
    # capped: 2^64 is as good as any larger number of steps, and a float power of 2 overflows
    factor = 2 ** min(sign * test.difference / gained, 64.0) if gained > 0 else math.inf
    return said, factor


def halfway(decision: Decision, quantities, trained: list[str]
            ) -> tuple[dict[str, float], str] | None:
    """Each quantity's value at half its steps, estimated from its runs' training curves: its
    value now plus what its training loss fell from halfway to the end (the mean over its
    seeds of final_train_loss at ½ less at the end), and what that reading says; a reference
    keeps its value. None unless every trained quantity reads a metric in the training loss's
    units (TRAIN_LOSS_UNITS) and every one of its runs logged a curve."""
    values = {n: m.value for n, m in decision.values.items()}
    said = []
    for name in trained:
        measured = decision.values[name]
        pairs = [(h, e) for h, e in zip(measured.train_halfway, measured.train_ended)
                 if h is not None and e is not None]
        if quantities[name].metric not in TRAIN_LOSS_UNITS or not pairs \
                or len(pairs) != len(measured.seeds):
            return None
        at_half, at_end = (sum(p[i] for p in pairs) / len(pairs) for i in (0, 1))
        values[name] = measured.value + at_half - at_end
        steps = quantities[name].config.trainer.max_steps
        said.append(f"`{name}`'s training loss {at_half:.4g} at {steps // 2:,} → "
                    f"{at_end:.4g} at {steps:,} steps")
    return values, ", ".join(said)


def _not_reached(decision: Decision, need: Need) -> Need:
    """The control's models did not train, or the model did not reach the level: more steps,
    priced at STEPS_FACTOR times the steps of the runs of its failed comparisons' models
    (references aside), or at the factor that the rate so far asks (so_far) up to
    MAX_STEPS_FACTOR; beyond it, or where more steps got it no closer, not more steps."""
    quantities = _quantities(decision)
    failed = [t for t in decision.tests if t.outcome is False]
    need.tests = [t.text for t in failed]
    # a per-seed claim keeps no tests: then every model it reads
    named = {n for t in failed for n in t.names} or set(decision.values)
    names = sorted({n for n in named if not is_reference(quantities[n])} or named)
    runs: dict[str, float | None] = {}  # run id -> its wall time; quantities share records
    for name in names:
        measured = decision.values[name]
        runs.update(dict.fromkeys(measured.runs, measured.wall_time_s))
    seen = [found for t in failed if (found := so_far(decision, t)) is not None]
    factor = max([STEPS_FACTOR] + [f for _, f in seen])
    history = "; so far " + "; ".join(said for said, _ in seen) if seen else ""
    what = "the model did not reach it" if decision.control is True \
        else "its control's models did not train"
    if factor > MAX_STEPS_FACTOR:
        need.why = (f"not more steps ({what} at this budget{history}: at that rate "
                    + ("never, as it got no closer" if not math.isfinite(factor) else
                       f"about {factor:,.0f}× the steps" if factor < 1000 else
                       "over 1,000× the steps")
                    + "): another protocol (learning rate, width, initialisation)")
        return need
    factor = math.ceil(factor)
    need.other_s = None if None in runs.values() else \
        factor * sum(runs.values())  # type: ignore[arg-type]
    need.why = (f"more steps ({what} at this budget{history}): {plural(len(runs), 'run')} of "
                f"{', '.join(names) or 'its models'} at {factor}× their steps")
    return need


def absent_corpora(configs) -> list[str]:
    """The text corpora of these runs whose folder (task.data_dir) holds no file here, each
    named with its folder: a GPU alone does not run them where no hub is reachable (as on the
    machines this suite is built on). A corpus with no folder (a hub's alone) is not judged."""
    absent = []
    for config in configs:
        corpus, folder = (getattr(config.task, key, "") for key in ("corpus", "data_dir"))
        if corpus and folder and not (Path(folder).is_dir() and any(Path(folder).iterdir())):
            absent.append(f"{corpus} ({folder}/)")
    return list(dict.fromkeys(absent))


def _not_measured(decision: Decision, need: Need) -> Need:
    claim, quantities = decision.claim, _quantities(decision)
    if claim.needs:
        need.why = f"a protocol the code lacks: {claim.needs}"
        return need
    if claim.gpu and decision.missing:
        absent = absent_corpora(quantities[name].config for name in decision.missing)
        one = len(absent) == 1
        need.why = "a GPU (its command runs on one)" + (
            f", and {' and '.join(absent)}, which {'is' if one else 'are'} not on this machine "
            f"({'its' if one else 'their'} files in that folder, or a reachable hub: "
            "docs/reference.md, 'Getting a corpus onto a machine')" if absent else "")
        return need
    lacking = set(decision.missing) & set(decision.values)  # records of older code
    for name in decision.missing:
        quantity = quantities[name]
        selector = tuple(quantity.where)
        if name in lacking:
            measured = decision.values[name]
            for seed in measured.seeds:
                need.runs.setdefault((selector, seed), measured.wall_time_s)
            continue
        rate = decision.step_s.get(name)
        steps = quantity.config.trainer.max_steps
        for seed in range(FIRST_SPREAD):
            need.runs.setdefault((selector, seed), rate * steps if rate is not None else None)
    need.seeds = FIRST_SPREAD
    need.tests = [f"no records: {', '.join(decision.missing)}"]
    return need


def need_of(decision: Decision) -> Need:
    seeds_now = min((len(m.seeds) for m in decision.values.values()), default=0)
    need = Need(decision.claim.id, decision.verdict, [], seeds_now, None)
    if decision.verdict == "not reached at reduced scale":
        return _not_reached(decision, need)
    if decision.verdict == "not measured":
        return _not_measured(decision, need)
    return _undecided(decision, need)


def make_plan(decisions: list[Decision]) -> list[Need]:
    """Every open claim's need, those seeds decide first, the cheapest first."""
    needs = [need_of(d) for d in decisions if d.verdict in OPEN]
    return sorted(needs, key=lambda n: (n.seeds is None, n.cpu_s is None, n.cpu_s or 0.0,
                                        n.claim))


def plan_table(needs: list[Need], budget_s: float | None
               ) -> tuple[list[str], list[Need], float]:
    """The plan as markdown lines, the needs whose runs fit the budget (cheapest first) and their
    CPU seconds, a run shared by several claims counted once."""
    lines = ["| claim | verdict | open comparisons | seeds now → to decide | runs to add | "
             "CPU time |", "|---|---|---|---|---|---|"]
    chosen, spent, planned = [], 0.0, set()
    for need in needs:
        tests = "<br>".join(f"`{t}`" for t in need.tests) or "—"
        if need.seeds is None:
            price = duration(need.other_s) if need.other_s is not None else "—"
            lines.append(f"| {need.claim} | {need.verdict} | {tests} | {need.seeds_now} → not "
                         f"by seeds: {need.why} | — | {price} |")
            continue
        keys = {run: (same_run_key(run[0]), run[1]) for run in need.runs}
        extra = sum(c or 0.0 for r, c in need.runs.items() if keys[r] not in planned)
        fits = budget_s is None or (need.cpu_s is not None and spent + extra <= budget_s)
        if fits:
            chosen.append(need)
            planned.update(keys.values())
            spent += extra
        mark = "" if fits else " (over the budget)"
        lines.append(f"| {need.claim} | {need.verdict} | {tests} | {need.seeds_now} → "
                     f"{need.seeds} | {len(need.runs)} | {duration(need.cpu_s)}{mark} |")
    return lines, chosen, spent


def same_run_key(selector: tuple[str, ...]) -> str:
    """run_key of what a selector composes to."""
    return run_key(composed(tuple(selector)))


def unique_runs(needs: list[Need]) -> list[Run]:
    """The needs' runs in their order, each once: two claims' selectors may order or spell the
    same config differently (a suite refuses a run listed twice)."""
    seen, unique = set(), []
    for selector, seed in dict.fromkeys(run for need in needs for run in sorted(need.runs)):
        key = (same_run_key(selector), seed)
        if key not in seen:
            seen.add(key)
            unique.append((selector, seed))
    return unique


def suite_yaml(needs: list[Need], command: str) -> str:
    """A suite file of the needs' runs, each once, in the needs' order (cheapest claim first:
    an interrupted suite has decided what it could)."""
    runs = unique_runs(needs)
    claims = ", ".join(n.claim for n in needs)
    lines = [f"# Made by `{command}`: the runs that would decide (the seeds a power estimate "
             f"asks for, the records a claim lacks) {claims or 'nothing'}.", "runs:"]
    lines += [f"  - [{', '.join([*selector, f'seed={seed}'])}]" for selector, seed in runs]
    return "\n".join(lines) + "\n" if runs else "\n".join(lines) + " []\n"


def power_plan(decisions: list[Decision], budget_s: float | None, out: Path | None,
               command: str, out_dir: str) -> str:
    """The plan's report: its table, a summary line, and (out) the suite file it wrote."""
    needs = make_plan(decisions)
    lines, chosen, spent = plan_table(needs, budget_s)
    runs = unique_runs(chosen)
    by_runs = [n for n in needs if n.seeds is not None]
    other = [n for n in needs if n.seeds is None and n.other_s is not None]
    budget = f" within {budget_s / 3600:g} h" if budget_s is not None else ""
    counts = ", ".join(f"{sum(n.verdict == v for n in needs)} {v}" for v in OPEN)
    lines.append(f"{plural(len(needs), 'open claim')} ({counts}): {len(by_runs)} that runs of "
                 f"their configs would decide (a power estimate for the undecided); "
                 f"{plural(len(chosen), 'claim')} chosen{budget}: {plural(len(runs), 'run')}, "
                 f"{duration(spent)} of CPU here (from the records' wall times); "
                 f"{len(other)} more at {duration(sum(n.other_s for n in other))} "
                 "by more steps; the rest by what their row says")
    if out is not None:
        text = suite_yaml(chosen, command)
        write_atomic(out, lambda tmp: Path(tmp).write_text(text))
        lines.append(f"{out}: {plural(len(runs), 'run')}; run them with python -m bench suite "
                     f"name={out} out_dir={out_dir}")
    return "\n".join(lines)
