"""`python -m bench claims check=true`: the research checks of the committed records, apart from
the unit tests (which use synthetic records). It fails (exit 1, one line per problem) when:
- a claim a CPU can run is left `not measured` (its records are missing: run its command);
- a `holds` or `fails` of a claim about trained models rests on a control that did not hold —
  i.e. on a model at its no-learning baseline (the verdict logic forbids it; this guards the
  rules files and the records together);
- a claim the records say holds still carries evidence against its paper (`contradicts_paper`):
  the evidence is stale (claims.md shows it only beside `fails` and `not measured`)."""
from __future__ import annotations

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
    return found
