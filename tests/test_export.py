"""`python -m bench export`: the records the boards read as one table (CSV or parquet), a row per
record with its numbers and the version it pools by; bad arguments are one line and exit 2."""
import csv

import pytest

from bench.cli.main import main
from test_claims import MAMBA, NOCONV, put, record


def test_every_record_is_a_row_with_its_numbers(tmp_path, capsys):
    out = tmp_path / "r"
    put(out, record(MAMBA, seed=0, gap=0.001), record(MAMBA, seed=1, gap=0.002),
        record(NOCONV, seed=0, gap=0.06))
    table = tmp_path / "records.csv"
    assert main(["export", f"out_dir={out}", f"out={table}"]) == 0
    assert "a row per record of 3 runs" in capsys.readouterr().out
    rows = list(csv.DictReader(table.open()))
    assert len(rows) == 3
    first = next(r for r in rows if r["seed"] == "1")
    assert (first["task"], first["model"], float(first["bayes_gap"])) == ("markov", "mamba", 0.002)
    assert float(first["loss.unigram"]) == pytest.approx(0.58)
    assert float(first["bayes_gap_lo"]) == pytest.approx(0.0016)
    assert first["version"] and first["superseded"] == "False"


def test_a_parquet_table_holds_the_same_rows(tmp_path):
    pyarrow_parquet = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "r"
    put(out, record(MAMBA, seed=0, gap=0.001), record(NOCONV, seed=0, gap=0.06))
    table = tmp_path / "records.parquet"
    assert main(["export", f"out_dir={out}", f"out={table}"]) == 0
    data = pyarrow_parquet.read_table(table).to_pydict()
    assert sorted(data["bayes_gap"]) == [0.001, 0.06]


@pytest.mark.parametrize("args, message", [
    ([], "export needs out=<file>.csv or out=<file>.parquet"),
    (["out=records.txt"], "must end in .csv or .parquet"),
    (["out=r.csv", "bogus=1"], "unknown argument 'bogus=1'"),
])
def test_bad_export_arguments_are_one_line(tmp_path, capsys, args, message):
    put(tmp_path / "r", record(MAMBA))
    assert main(["export", f"out_dir={tmp_path / 'r'}", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
