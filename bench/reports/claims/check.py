"""`python -m bench claims check=true`: the research checks of the committed records, apart from
the unit tests (which use synthetic records). It fails (exit 1, one line per problem) when:
- a claim a CPU can run is left `not measured` (its records are missing: run its command);
- a `holds` or `fails` of a claim about trained models rests on a control that did not hold —
  i.e. on a model at its no-learning baseline (the verdict logic forbids it; this guards the
  rules files and the records together);
- a claim the records say holds still carries evidence against its paper (`contradicts_paper`):
  the evidence is stale (claims.md shows it only beside `fails` and `not measured`);
- a verdict on a mean over seeds hides a run that would turn it: an attainment not reached (or
  failed) while a seed reaches the level on its own held-out interval, or a claim that a model
  does not reach a level holding while a seed's model did. One run shows the first and refutes
  the second, so such a claim is judged on the run that trained best (`judge_seed`)."""
from __future__ import annotations

from bench.reports.claims.spec import compares_with_references, is_reference
from bench.reports.claims.verdicts import Decision

DECIDED = ("holds", "holds at reduced scale", "fails", "fails at reduced scale")


def problems(decisions: list[Decision]) -> list[str]:
    found = []
    for d in decisions:
        claim = d.claim
        if d.verdict == "not measured" and not claim.gpu and not claim.needs:
            found.append(f"{claim.id}: not measured on records a CPU can make "
                         f"({', '.join(d.missing)}); run {claim.commands[0]}")
        if d.verdict in DECIDED and claim.kind == "trained" and d.control is not True:
            found.append(f"{claim.id}: {d.verdict} although its control did not hold")
        if d.verdict in ("holds", "holds at reduced scale") and claim.contradicts:
            found.append(f"{claim.id}: {d.verdict}, yet its rules name evidence against the "
                         "paper (contradicts_paper): revise or drop it")
        if (hidden := hidden_run(d)) is not None:
            found.append(f"{claim.id}: {d.verdict} on the mean over seeds, yet {hidden} on their "
                         "own held-out intervals: judge it on the run that trained best "
                         "(judge_seed)")
    return found


def hidden_run(d: Decision) -> str | None:
    """Which seeds a mean over seeds outvoted where one of them decides the claim the other way:
    an attainment not reached or failed while those seeds reach it, or a claim that models stay
    short of a level (compares_with_references) holding while those seeds' models got there.
    None where no such seed exists, or the claim is judged seed by seed or on one seed."""
    claim = d.claim
    if claim.per_seed or claim.judge_seed or not d.values:
        return None
    models = [n for n in claim.rule.used if not is_reference(claim.quantities[n])]
    if claim.kind == "attainment" and d.verdict in ("not reached at reduced scale", "fails",
                                                     "fails at reduced scale"):
        turns, says = True, "{} reach it"  # the rule holds on them
    elif claim.kind == "trained" and d.verdict in ("holds", "holds at reduced scale") \
            and models and compares_with_references(claim.rule, models, claim.quantities):
        turns, says = False, "{} left the level"  # the rule fails on them
    else:
        return None
    used = claim.rule.used
    seeds = sorted(set.intersection(*(set(d.values[n].seeds) for n in used)))
    against = [seed for seed in seeds
               if claim.rule.decide({n: d.values[n].seed_sample(seed) for n in used})[0] is turns]
    if not against:
        return None
    return says.format(f"seed{'s' * (len(against) != 1)} {', '.join(map(str, against))}")
