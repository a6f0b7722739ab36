"""`python -m bench claims plan`: the seeds a power estimate says would decide an undecided claim,
their cost, and the suite file that makes them."""
import math

import pytest
import yaml

from bench.cli.main import main
from bench.reports.claims.plan import MAX_SEEDS, seeds_to_decide
from bench.config import load_suite
from test_claims import MAMBA, NOCONV, put, record, rules_file
from tasks.stats import t_quantile


def test_seeds_to_decide_is_the_first_n_whose_interval_clears_the_difference():
    # 3 seeds, per-seed spread 1, mean difference 0.9: half-width t(n-1)/sqrt(n) < 0.9 first at
    n = seeds_to_decide(0.9, (0.9 - t_quantile(2) / math.sqrt(3), 0.9 + t_quantile(2) / math.sqrt(3)),
                        3)
    assert t_quantile(n - 1) / math.sqrt(n) < 0.9 <= t_quantile(n - 2) / math.sqrt(n - 1)
    assert seeds_to_decide(0.0, (-1.0, 1.0), 3) is None  # no effect: no seeds decide it
    assert seeds_to_decide(0.01, (-1.0, 1.0), 3) is None  # more than MAX_SEEDS
    assert seeds_to_decide(0.5, (0.4, 0.6), 1) == 3  # one seed: seeds to estimate a spread
    assert MAX_SEEDS == 30


def test_plan_lists_undecided_claims_and_writes_a_suite_of_their_seeds(tmp_path, capsys):
    """noconv >= 5 x mamba on 3 seeds, paired difference +0.0006 with a spread that leaves it
    open: the plan adds seeds 3.. of both models, priced at their records' wall time, and the
    suite file it writes composes."""
    out = tmp_path / "r"
    mamba = [0.001, 0.002, 0.0015]
    noconv = [5 * m + d for m, d in zip(mamba, (0.0002, 0.0014, 0.0002))]
    put(out, *(record(MAMBA, seed=s, gap=g, wall_time_s=60.0) for s, g in enumerate(mamba)),
        *(record(NOCONV, seed=s, gap=g, wall_time_s=30.0) for s, g in enumerate(noconv)))
    rules = rules_file(tmp_path, rule="noconv >= 5 * mamba", control="mamba <= 0.05")
    suite = tmp_path / "plan.yaml"
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}", f"out={suite}"]) == 0
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if line.startswith("| t-conv"))
    seeds = int(row.split(" | ")[2].split("→")[1])
    assert seeds > 3 and f"| {2 * (seeds - 3)} |" in row
    entries = load_suite(str(suite))
    assert len(entries) == 2 * (seeds - 3)
    assert [*MAMBA, "seed=3"] in entries and [*NOCONV, f"seed={seeds - 1}"] in entries
    assert f"{(seeds - 3) * 90 / 60:.0f} min" in row  # 60 s + 30 s per added seed
    # within a budget too small for it, nothing is chosen and the suite is empty
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}", f"out={suite}",
                 "budget_h=0.001"]) == 0
    assert "(over the budget)" in capsys.readouterr().out
    assert yaml.safe_load(suite.read_text())["runs"] == []


@pytest.mark.parametrize("args, message", [
    (["budget_h=abc"], "budget_h: invalid value 'abc'"),
    (["budget_h=-1"], "budget_h: invalid value '-1'"),
    (["out=plan.txt"], "must be a suite file ending in .yaml"),
    (["bogus=1"], "unknown argument 'bogus=1'"),
])
def test_plan_arguments_are_checked(tmp_path, capsys, args, message):
    put(tmp_path / "r", record(MAMBA))
    assert main(["claims", "plan", f"out_dir={tmp_path / 'r'}", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
