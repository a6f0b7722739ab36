"""The paper layer: claims.md from run records. One row per claim of the three source papers,
each decided by the rule and control written next to it in conf/papers/<paper>/claims.yaml (the
paper's suites beside it, in suites/). It only reads records (and the suite lists that make
them); nothing in the core imports it.

- `spec`: the claims files (quantities: record selectors + metric paths; rule; control; scale);
- `rules`: the rule language, evaluated on 95% intervals in three-valued logic;
- `verdicts`: records → quantities → verdicts (holds, holds at reduced scale, fails, not reached
  at reduced scale, undecided, not measured);
- `render`: claims.md.

Why an expression language rather than Python predicates: a claim's rule, control, quantities
and the paper's words sit in one YAML entry that a reader of the paper can check line by line,
and the language is small enough (names, numbers, comparisons, and/or/not, + - * /, abs/min/max)
that evaluating it on intervals — deciding a comparison only when the intervals are apart — is
one place of code rather than a convention every predicate would have to follow."""
from bench.reports.claims.render import write_claims
from bench.reports.claims.rules import Interval, Rule
from bench.reports.claims.spec import load_claims
from bench.reports.claims.verdicts import VERDICTS, decide_all

__all__ = ["VERDICTS", "Interval", "Rule", "decide_all", "load_claims", "write_claims"]
