"""Terminal output of a run: a short table of the model and the references."""
from __future__ import annotations

from bench.config.formats import fmt, fmt_loss, fmt_sig, is_suspicious, loss_resolution
from bench.reports.plot import run_groups, section_of, section_title
from tasks.stats import across_seeds


def print_perplexity_metrics(metrics: dict) -> None:
    print(f"{'predictor':<22}{'role':<10}{'nats/token':>11}{'perplexity':>12}"
          f"{'95% CI':>20}{'bits/byte':>11}{'top-1':>8}")
    names = (["model"] if "model" in metrics["loss"] else []) + sorted(
        (n for n in metrics["loss"] if n != "model"), key=lambda n: metrics["loss"][n])
    for name in names:
        lo, hi = metrics["perplexity_ci"][name]
        print(f"{name:<22}{metrics['roles'].get(name, 'trained'):<10}"
              f"{fmt(metrics['loss'][name]):>11}{metrics['perplexity'][name]:>12.2f}"
              f"{f'[{lo:.2f}, {hi:.2f}]':>20}{fmt(metrics['bits_per_byte'][name], 3):>11}"
              f"{fmt(metrics['accuracy'].get(name), 3):>8}")
    print("(no Bayes predictor for text: the references are baselines fit on the training split)")


def print_metrics(metrics: dict, details: bool = True) -> None:
    """The predictors' table; `details`: and the task's own metrics (probes, per-length tables),
    else one line naming them (a run's output leads with its table and headline)."""
    if metrics.get("scoring") == "perplexity":
        return print_perplexity_metrics(metrics)
    reference = metrics["gap_reference"]
    tokens = "accuracy" in metrics
    header = f"{'predictor':<22}{'role':<10}{'loss':>13}{'gap':>11}{'95% CI of gap':>24}"
    if tokens:
        header += f"{'top-1':>8}{'L1 to ref':>11}"
    print(header)
    names = (["model"] if "model" in metrics["loss"] else []) + sorted(
        (n for n in metrics["loss"] if n != "model"), key=lambda n: metrics["loss"][n])
    resolution = loss_resolution(metrics["gap"])
    for name in names:
        lo, hi = metrics["gap_ci"][name]
        line = (f"{name:<22}{metrics['roles'].get(name, 'trained'):<10}"
                f"{fmt_loss(metrics['loss'][name], resolution):>13}"
                f"{fmt_sig(metrics['gap'][name]):>11}"
                f"{'[' + fmt_sig(lo) + ', ' + fmt_sig(hi) + ']':>24}")
        if tokens:
            line += (f"{fmt(metrics['accuracy'][name], 3):>8}"
                     f"{fmt(metrics['l1_to_reference'][name], 3):>11}")
        print(line)
    print(f"(gap = loss − loss of '{reference}', the {metrics['gap_reference_role']} reference; "
          f"{'nats/token' if tokens else 'squared error per coordinate'})")
    extra = [k for k in metrics.get("task", {})
             if k != "context_lengths" and not k.endswith("_stderr")]
    if details:
        print_task_metrics(metrics.get("task", {}))
    elif extra:
        print(f"({len(extra)} more metrics of the task in the record's metrics.task; "
              "details=true prints them)")


def _num(x) -> str:
    return "-" if x is None else fmt_sig(x, 4) if isinstance(x, float) else str(x)


def print_task_metrics(extra: dict) -> None:
    """A task's own metrics: scalars, {name: scalar} lines, and {name: [per context length]}
    tables (standard errors are left to the record)."""
    lengths = extra.get("context_lengths")
    for key, value in extra.items():
        if key == "context_lengths" or key.endswith("_stderr"):
            continue
        if isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values()):
            print(f"{key}" + (f" at context length {' '.join(map(str, lengths))}" if lengths else "")
                  + ":")
            for name, row in value.items():
                print(f"  {name:<20} {' '.join(_num(v) for v in row)}")
        elif isinstance(value, dict):
            print(f"{key}: " + ", ".join(f"{n} {_num(v)}" for n, v in value.items()))
        elif not isinstance(value, list):
            print(f"{key}: {_num(value)}")


def headline(metrics: dict) -> str:
    """The run's result in one phrase: its Bayes gap, or (text) its perplexity, with the CI."""
    if metrics.get("scoring") == "perplexity":
        lo, hi = metrics["perplexity_ci"]["model"]
        return f"perplexity {metrics['perplexity']['model']:.2f} [{lo:.2f}, {hi:.2f}]"
    lo, hi = metrics["bayes_gap_ci"]
    return f"gap {fmt_sig(metrics['bayes_gap'])} [{fmt_sig(lo)}, {fmt_sig(hi)}]"


def gap_verdict(metrics: dict) -> str:
    """Whether the gap's interval excludes 0, in words."""
    lo, hi = metrics["bayes_gap_ci"]
    reference = ("Bayes" if metrics["gap_reference_role"] == "bayes" else
                 f"the {metrics['gap_reference_role']} '{metrics['gap_reference']}'")
    if lo > 0:
        return f"gap > 0: the model is measurably worse than {reference}"
    if hi < 0:
        return f"gap < 0: the model is measurably better than {reference} on this held-out set"
    return (f"interval includes 0: not distinguishable from {reference} at "
            f"{metrics['sequences']} sequences")


def gap_closed_line(closed: dict | None) -> str:
    """The share of the best baseline's gap the model closed (metrics.gap_closed), in words."""
    if closed is None:
        return "gap closed: the task has no baseline reference"
    baseline = f"the best baseline, {closed['baseline']} (gap {fmt_sig(closed['gap'])})"
    if closed["fraction"] is None:
        return f"gap closed: undefined, {baseline} has no gap to close"
    fraction = closed["fraction"]
    if fraction < 0:  # a negative share reads badly: say how many times the baseline's gap
        return f"gap closed: none; the model's gap is {fmt_sig(1 - fraction)}× that of {baseline}"
    # decimals enough to show what remains open (99.59%, not 100.0%)
    share = fmt_sig(100 * fraction, 2, resolution=100 * abs(1 - fraction) or 1)
    return f"gap closed: {share}% of the gap of {baseline}"


def print_run(record: dict, path: str, details: bool = False) -> None:
    m = record["metrics"]
    if record.get("weights_run_id"):  # python -m bench eval: no training in this record
        print(f"\nevaluation of the weights of {record['weights_run_id']} "
              f"({record.get('evaluated_weights')})", end="")
    print(f"\n{record['model']['name']} on {record['task']['name']}: {record['train']['steps']} "
          f"steps in {record['train']['wall_time_s']:.1f} s ({record['train']['device']}), "
          f"{record['params']} parameters, state {record['state_size']} floats")
    print_metrics(m, details)
    if m.get("scoring") == "perplexity":
        print(f"{headline(m)} on {m['scored_positions']:,} tokens; total wall "
              f"{record['wall_time_s']:.1f} s")
        beats = [name for name, role in m["roles"].items() if role == "baseline"
                 and m["perplexity_ci"]["model"][1] < m["perplexity_ci"][name][0]]
        best = min((n for n, r in m["roles"].items() if r == "baseline"),
                   key=lambda n: m["perplexity"][n], default=None)
        if best is not None:  # what a text run has to beat: its best baseline, intervals apart
            print(f"the best baseline, {best}: " + (
                "beaten (the intervals are apart)" if best in beats else
                "not beaten at this budget (the intervals overlap or the model is worse)"))
        print_weights_and_record(record, path)
        return
    print(f"Bayes {headline(m)}  (relative {fmt_sig(100 * m['relative_gap'])}%); "
          f"total wall {record['wall_time_s']:.1f} s")
    if "gap_excludes_zero" in m:  # records written before these fields lack them
        print(gap_verdict(m))
        print(gap_closed_line(m["gap_closed"]))
    if m.get("gap_by_band"):  # where in the sequence the gap is: short contexts often differ
        print("gap by position: " + ", ".join(
            f"{b['positions'][0]}–{b['positions'][1]} "
            + ("–" if b["gap"] is None else fmt_sig(b["gap"])) for b in m["gap_by_band"]))
    if is_suspicious(m):
        print("warning: the model beats the exact Bayes predictor beyond its interval — a bug "
              "signal (leaking future tokens?), not a result")
    print_weights_and_record(record, path)


def print_weights_and_record(record: dict, path: str) -> None:
    if record.get("weights"):
        print(f"weights: {record['weights']} (in out_dir)")
    print(f"record: {path}")


def config_table(records: list[dict]) -> list[str]:
    """What a sweep is for, per config (its seeds pooled): the mean headline — the Bayes gap, or
    perplexity for text — its 95% t-interval across seeds (one seed: its bootstrap interval),
    the seeds, and the mean share of the best baseline's gap closed; a block per task config,
    configs labelled by what differs between them (bench.reports.plot.run_groups)."""
    sections: dict[tuple, list[dict]] = {}
    for record in records:
        sections.setdefault(section_of(record), []).append(record)
    lines = []
    for runs in sections.values():
        text = runs[0]["metrics"].get("scoring") == "perplexity"
        headline = "perplexity" if text else f"gap to {runs[0]['metrics']['gap_reference']}"
        rows = []
        for label, group in run_groups(runs):
            values = [r["metrics"]["perplexity"]["model"] if text else r["metrics"]["bayes_gap"]
                      for r in group]
            mean, half = across_seeds(values)
            if half is not None:
                lo, hi = mean - half, mean + half
            else:
                lo, hi = (group[0]["metrics"]["perplexity_ci"]["model"] if text
                          else group[0]["metrics"]["bayes_gap_ci"])
            closed = [c["fraction"] for r in group
                      if isinstance(c := r["metrics"].get("gap_closed"), dict)
                      and isinstance(c.get("fraction"), (int, float))]
            rows.append([label, str(len(group)), fmt_sig(mean),
                         f"[{fmt_sig(lo)}, {fmt_sig(hi)}]" + (" across seeds" if half else ""),
                         f"{100 * sum(closed) / len(closed):.1f}%" if closed else "-"])
        header = ["config", "seeds", headline, "95% interval", "gap closed"]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(5)]
        lines.append(section_title(runs))
        for row in [header, *rows]:
            lines.append("  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                                          for i, (cell, w) in enumerate(zip(row, widths))))
    return lines
