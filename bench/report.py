"""Terminal output of a run: a short table of the model and the references."""
from __future__ import annotations

from bench.evaluate import fmt, is_suspicious


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


def print_metrics(metrics: dict) -> None:
    if metrics.get("scoring") == "perplexity":
        return print_perplexity_metrics(metrics)
    reference = metrics["gap_reference"]
    tokens = "accuracy" in metrics
    header = f"{'predictor':<22}{'role':<10}{'loss':>9}{'gap':>9}{'95% CI of gap':>22}"
    if tokens:
        header += f"{'top-1':>8}{'L1 to ref':>11}"
    print(header)
    names = (["model"] if "model" in metrics["loss"] else []) + sorted(
        (n for n in metrics["loss"] if n != "model"), key=lambda n: metrics["loss"][n])
    for name in names:
        lo, hi = metrics["gap_ci"][name]
        line = (f"{name:<22}{metrics['roles'].get(name, 'trained'):<10}"
                f"{fmt(metrics['loss'][name]):>9}{fmt(metrics['gap'][name]):>9}"
                f"{'[' + fmt(lo) + ', ' + fmt(hi) + ']':>22}")
        if tokens:
            line += (f"{fmt(metrics['accuracy'][name], 3):>8}"
                     f"{fmt(metrics['l1_to_reference'][name], 3):>11}")
        print(line)
    print(f"(gap = loss − loss of '{reference}', the {metrics['gap_reference_role']} reference; "
          f"{'nats/token' if tokens else 'squared error per coordinate'})")
    print_task_metrics(metrics.get("task", {}))


def _num(x) -> str:
    return "-" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


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
    return f"gap {metrics['bayes_gap']:.4f} [{lo:.4f}, {hi:.4f}]"


def print_run(record: dict, path: str) -> None:
    m = record["metrics"]
    if record.get("weights_run_id"):  # python -m bench eval: no training in this record
        print(f"\nevaluation of the weights of {record['weights_run_id']} "
              f"({record.get('evaluated_weights')})", end="")
    print(f"\n{record['model']['name']} on {record['task']['name']}: {record['train']['steps']} "
          f"steps in {record['train']['wall_time_s']:.1f} s ({record['train']['device']}), "
          f"{record['params']} parameters, state {record['state_size']} floats")
    print_metrics(m)
    if m.get("scoring") == "perplexity":
        print(f"{headline(m)} on {m['scored_positions']:,} tokens; total wall "
              f"{record['wall_time_s']:.1f} s")
        print(f"record: {path}")
        return
    lo, hi = m["bayes_gap_ci"]
    print(f"Bayes gap {m['bayes_gap']:.4f} [{lo:.4f}, {hi:.4f}]  "
          f"(relative {m['relative_gap']:.2%}); total wall {record['wall_time_s']:.1f} s")
    if is_suspicious(m):
        print("warning: the model beats the exact Bayes predictor beyond its interval — a bug "
              "signal (leaking future tokens?), not a result")
    if record.get("weights"):
        print(f"weights: {record['weights']} (in out_dir)")
    print(f"record: {path}")
