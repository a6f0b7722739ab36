"""The commands that read records: leaderboard, claims (and claims plan), compare, identities,
export, plot. Their modules load only when the command runs (compare's bootstrap loads torch, plot
matplotlib), so that every other command starts without them."""
from __future__ import annotations

import math
import os
import stat
import subprocess
import sys
from pathlib import Path

from bench.cli.options import check_paths, take_flag, take_option
from bench.config import ConfigError
from bench.config.formats import plural
from bench.records.store import output_path, read_record, read_records


def default_report(out_dir: str, name: str) -> str:
    """Where leaderboard and claims write without out=: the published report at the top of the
    repository (leaderboard.md, claims.md) from the published records (out_dir=results), and a
    report of any other records beside them (runs/leaderboard.md), never over the published."""
    return name if Path(out_dir) == Path("results") else str(Path(out_dir) / name)


def previous_text(path: str) -> str | None:
    """The text of the report at `path` before it is rewritten: only a regular file's, never
    through a link, a FIFO or a device (which the writer refuses anyway), and at most 64 MiB."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        with open(path, "rb") as handle:
            return handle.read(64 << 20).decode(errors="replace")
    except OSError:
        return None


def tracked_note(path: Path, before: str | None) -> None:
    """One line when a report rewrote a file that git tracks (a published report)."""
    try:
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", "--", path.name],
                                 cwd=path.resolve().parent, capture_output=True,
                                 timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return
    if tracked:
        after = previous_text(str(path))
        what = ("unchanged" if after == before else "rewritten: `git diff` shows what changed")
        print(f"note: {path} is tracked by git (a published report), {what}")


def cmd_leaderboard(argv: list[str]) -> int:
    argv, out_dir = take_option(argv, "out_dir", "results")
    argv, out = take_option(argv, "out", default_report(out_dir, "leaderboard.md"))
    argv, include = take_option(argv, "include", "suite")  # suite: suite records only
    if argv:
        raise ConfigError(f"unknown argument '{argv[0]}'; leaderboard takes out_dir=<dir>, "
                          "out=<file>, include=suite|all")
    from bench.reports.leaderboard import write_leaderboard
    from bench.reports.selection import check_selection, select_runs
    check_selection(out_dir, include)
    output_path(out)  # refused before the records are read
    selection = select_runs(out_dir, include)
    for line in selection.warnings():  # before a possible error: they may be why it is empty
        print(line, file=sys.stderr)
    before = previous_text(out)
    path = write_leaderboard(selection, out)
    print(f"{path}: {selection.summary()}")
    tracked_note(Path(path), before)
    return 0


def cmd_claims_plan(argv: list[str]) -> int:
    given = [a for a in argv if not a.startswith("out=")]  # named in the suite file it writes
    argv, out_dir = take_option(argv, "out_dir", "results")
    argv, out = take_option(argv, "out", "")
    argv, include = take_option(argv, "include", "suite")
    argv, rules = take_option(argv, "rules", "")
    argv, budget = take_option(argv, "budget_h", "")
    if argv:
        raise ConfigError(f"unknown argument '{argv[0]}'; claims plan takes out_dir=<dir>, "
                          "out=<suite.yaml>, budget_h=<hours>, include=suite|all, "
                          "rules=<file or folder>")
    check_paths(out_dir=out_dir, out=out, rules=rules)
    budget_s = None
    if budget:
        try:
            budget_s = float(budget) * 3600
        except ValueError:
            budget_s = math.nan
        if not (math.isfinite(budget_s) and budget_s > 0):
            raise ConfigError(f"budget_h: invalid value '{budget}'; expected a positive number "
                              "of hours")
    if out and not out.endswith((".yaml", ".yml")):
        raise ConfigError(f"out '{out}' must be a suite file ending in .yaml")
    from bench.reports.selection import check_selection, select_runs
    check_selection(out_dir, include)
    out_path = output_path(out) if out else None
    from bench.reports.claims import decide_all, load_claims
    from bench.reports.claims.plan import power_plan
    claims = load_claims(rules or None)
    selection = select_runs(out_dir, include)
    for line in selection.warnings():
        print(line, file=sys.stderr)
    command = " ".join(["python -m bench claims plan", *given])
    print(power_plan(decide_all(claims, selection), budget_s, out_path, command, out_dir))
    return 0


def cmd_claims(argv: list[str]) -> int:
    if argv[:1] == ["plan"]:
        return cmd_claims_plan(argv[1:])
    argv, out_dir = take_option(argv, "out_dir", "results")
    argv, out = take_option(argv, "out", default_report(out_dir, "claims.md"))
    argv, include = take_option(argv, "include", "suite")
    argv, rules = take_option(argv, "rules", "")
    argv, check = take_flag(argv, "check")
    argv, against = take_option(argv, "against", "")
    if argv:
        raise ConfigError(f"unknown argument '{argv[0]}'; claims takes out_dir=<dir>, "
                          "out=<file>, include=suite|all, rules=<file or folder>, "
                          "check=true|false, against=<claims.md>")
    check_paths(out_dir=out_dir, out=out, rules=rules, against=against)
    from bench.reports.selection import check_selection, select_runs
    check_selection(out_dir, include)  # all refused now, not after the rules and records
    if not check:
        output_path(out)
    from bench.reports.claims import decide_all, load_claims, write_claims
    from bench.reports.claims.check import problems
    from bench.reports.claims.render import verdict_changes, verdict_counts
    before = None if check else previous_text(out)
    earlier = earlier_verdicts(against, out, before)
    claims = load_claims(rules or None)  # bad rules are reported before the records are read
    selection = select_runs(out_dir, include)
    for line in selection.warnings():
        print(line, file=sys.stderr)
    if check:  # the research checks of the records; claims.md is not written
        decisions = decide_all(claims, selection)
        found = problems(decisions)
        if earlier is not None:  # a published report whose verdicts the records do not give
            found += [f"{earlier[0]} is not what the records give: {line} (`python -m bench "
                      "claims` rewrites it)" for line in verdict_changes(earlier[1], decisions)]
        for problem in found:
            print(f"error: {problem}", file=sys.stderr)
        print(f"{plural(len(claims), 'claim')} checked against {selection.summary()}: "
              f"{plural(len(found), 'problem')}")
        return 1 if found else 0
    path, decisions = write_claims(selection, out, rules or None, claims)
    print(f"{path}: {verdict_counts(decisions)} from {selection.summary()}")
    tracked_note(Path(path), before)
    print_changes(earlier, decisions)
    return 0


def earlier_verdicts(against: str, out: str, before: str | None
                     ) -> tuple[str, dict[str, str]] | None:
    """The verdicts a claims run compares its own with: those of the report `against` names
    (refused when it holds none), else those of `before`, the text of the report `out` that it
    is about to rewrite, if any."""
    from bench.reports.claims.render import verdicts_in
    if against:
        text = previous_text(against)
        verdicts = verdicts_in(text) if text is not None else {}
        if not verdicts:
            why = "is not a readable file" if text is None else "holds no claim rows"
            raise ConfigError(f"against '{against}' {why}; give a claims.md that "
                              "`python -m bench claims` wrote")
        return against, verdicts
    verdicts = verdicts_in(before) if before is not None else {}
    return (out, verdicts) if verdicts else None


def print_changes(earlier: tuple[str, dict[str, str]] | None, decisions) -> None:
    """Which verdicts moved against the earlier report: a rerun or new records can change a
    verdict, and a changed verdict is what a reader of claims.md must not miss."""
    if earlier is None:
        return
    from bench.reports.claims.render import verdict_changes
    name, verdicts = earlier
    changes = verdict_changes(verdicts, decisions)
    claims = verdicts.keys() | {d.claim.id for d in decisions}  # of either report
    print(f"verdicts against {name}: {len(changes) or 'none'} of "
          f"{plural(len(claims), 'claim')} changed")
    for line in changes:
        print(f"  {line}")


def cmd_compare(argv: list[str]) -> int:
    from bench.reports import compare as comparison
    options = [arg for arg in argv if "=" in arg and not os.path.exists(arg)]
    if options and len(options) == len(argv):  # by selection: model=mamba,transformer ...
        selection = comparison.select(argv)
        if comparison.by_seeds(selection):
            comparison.print_across_seeds(comparison.compare_across_seeds(selection))
        else:
            comparison.print_comparison(comparison.compare(*comparison.select_pair(selection)))
        return 0
    if options:
        raise ConfigError(f"unknown argument '{options[0]}'; compare takes two record files, "
                          "or settings that select them (model=mamba,transformer ...)")
    if len(argv) != 2:
        raise ConfigError(f"compare needs two run records (A.json B.json), got {len(argv)}; or "
                          "settings that select them: compare task=<task> model=<a>,<b> [seed=N]")
    comparison.print_comparison(comparison.compare(*argv))
    return 0


def cmd_identities(argv: list[str]) -> int:
    argv, out_dir = take_option(argv, "out_dir", "results")
    argv, check = take_flag(argv, "check")
    if argv:
        raise ConfigError(f"unknown argument '{argv[0]}'; identities takes out_dir=<dir>, "
                          "check=true|false")
    if not os.path.isdir(out_dir):
        raise ConfigError(f"out_dir '{out_dir}' is not a directory")
    from bench.records.store import IDENTITY_INDEX
    if not check:  # the index it will write: refused now, not after minutes of probes
        output_path(str(Path(out_dir) / IDENTITY_INDEX), name="the identity index")
    from bench.reports.identities import report_identities
    return report_identities(out_dir, check)


def cmd_plot(argv: list[str]) -> int:
    argv, out = take_option(argv, "out", "")
    options = [arg for arg in argv if "=" in arg and not os.path.exists(arg)]
    if options:
        raise ConfigError(f"unknown argument '{options[0]}'; plot takes record files or "
                          "directories and out=<file.png>")
    if not argv:
        raise ConfigError("plot needs a run record (.json) or a directory of them")
    from bench.reports.plot import plot_runs
    records, bad = [], []
    for arg in argv:
        path = Path(arg)
        if path.is_dir():
            found, skipped = read_records(path)
            records += found
            bad += skipped
        elif path.is_file():
            record, reason = read_record(path)
            (records.append(record) if record else bad.append((arg, reason)))
        else:
            raise ConfigError(f"plot: '{arg}' is neither a record file nor a directory")
    usable = []
    for record in records:
        why = f"status {record.get('status')!r}" if record.get("status") != "ok" else None
        (bad.append((record["_path"], why)) if why else usable.append(record))
    for path, reason in bad:
        print(f"warning: skipped {path}: {reason}", file=sys.stderr)
    if not usable:
        raise ConfigError("plot: no usable `ok` run record among the paths given")
    if not out:
        first = Path(argv[0])
        out = str(first.with_suffix(".png") if first.is_file() and len(usable) == 1
                  else (first / "curves.png" if first.is_dir() else Path("curves.png")))
    print(plot_runs(usable, output_path(out)))
    return 0


def cmd_export(argv: list[str]) -> int:
    argv, out_dir = take_option(argv, "out_dir", "results")
    argv, out = take_option(argv, "out", "")
    argv, include = take_option(argv, "include", "suite")
    if argv:
        raise ConfigError(f"unknown argument '{argv[0]}'; export takes out_dir=<dir>, "
                          "out=<records.csv|records.parquet>, include=suite|all")
    if not out:
        raise ConfigError("export needs out=<file>.csv or out=<file>.parquet")
    check_paths(out_dir=out_dir, out=out)
    from bench.reports.export import check_format, write_table
    from bench.reports.selection import select_runs
    check_format(out)  # refused before the records are read
    out_path = output_path(out)
    selection = select_runs(out_dir, include)
    for line in selection.warnings():
        print(line, file=sys.stderr)
    write_table(selection, out_path)
    print(f"{out_path}: a row per record of {selection.summary()}")
    return 0
