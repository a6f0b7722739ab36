"""Saved weights and `python -m bench eval`: a trained run keeps its model in
out_dir/weights/<run_id>.pt; eval scores it again on another task config of the same family,
deterministically, in a record that boards and claims never pool with trained runs; bad inputs
are refused in one line (exit 2) before anything is written."""
import hashlib
import json
from pathlib import Path

import pytest
import torch

from bench.cli.main import main
from bench.reports.selection import select_runs
from bench.training.weights import WEIGHTS_FORMAT

TINY = ["task=markov", "model=mamba", "task.seq_len=32", "trainer.max_steps=3",
        "trainer.warmup_steps=1", "trainer.eval_sequences=32", "trainer.bootstrap=100",
        "trainer.threads=1", "trainer.progress=false"]


def records(out_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))]


def signed(path: Path) -> Path:
    """`path` with a digest of its bytes beside it, as `sha256sum path > path.sha256` writes it."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    Path(f"{path}.sha256").write_text(f"{digest}  {path.name}\n")
    return path


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained")
    assert main(["run", f"out_dir={out}", *TINY]) == 0
    (record,) = records(out)
    return out, record


def evaluate(out: Path, *args: str) -> dict:
    """Run eval of `trained`'s weights into a fresh folder; its single record."""
    before = {p.name for p in out.glob("*.json")}
    assert main(["eval", *args, f"out_dir={out}"]) == 0
    (new,) = [p for p in out.glob("*.json") if p.name not in before]
    return json.loads(new.read_text())


def test_a_run_saves_its_weights(trained):
    out, record = trained
    assert record["status"] == "ok" and record["trainer"]["config"]["save_weights"] is True
    assert record["weights"] == f"weights/{record['run_id']}.pt"
    path = out / record["weights"]
    assert path.stat().st_size < 200_000  # a tiny model: tens of KB
    saved = torch.load(path, map_location="cpu", weights_only=True)
    assert saved["format"] == WEIGHTS_FORMAT and saved["run_id"] == record["run_id"]
    for key in ("task", "model", "trainer", "seed", "overrides"):
        assert saved[key] == record[key], key
    assert saved["train"]["steps"] == 3
    assert all(isinstance(v, torch.Tensor) for v in saved["state_dict"].values())
    assert not [k for k in saved["state_dict"] if "_orig_mod" in k]  # the eager model's names


def test_eval_at_the_same_config_gives_the_same_scores(trained, tmp_path):
    out, record = trained
    weights = str(out / record["weights"])
    again = evaluate(tmp_path, f"weights={weights}")
    assert again["status"] == "ok" and again["origin"] == "eval"
    assert again["evaluated_weights"] == weights and again["weights_run_id"] == record["run_id"]
    assert again["weights"] is None and again["log_dir"] is None
    assert again["train"] == record["train"]  # the training of the model it scores
    assert again["task"] == record["task"] and again["model"] == record["model"]
    assert again["seed"] == record["seed"]
    # the same held-out set, the same model: the same losses (the evaluation is deterministic)
    assert again["metrics"]["loss"] == record["metrics"]["loss"]
    assert again["metrics"]["bayes_gap"] == record["metrics"]["bayes_gap"]


def test_eval_at_another_seq_len(trained, tmp_path):
    out, record = trained
    other = evaluate(tmp_path, f"weights={out / record['weights']}", "task.seq_len=48")
    assert other["status"] == "ok" and other["origin"] == "eval"
    assert other["task"]["config"]["seq_len"] == 48
    assert "task.seq_len=48" in other["overrides"] and "trainer.max_steps=3" in other["overrides"]
    assert len(other["per_position"]["gap.model"]) != len(record["per_position"]["gap.model"])
    assert other["metrics"]["loss"]["bayes"] != record["metrics"]["loss"]["bayes"]
    # never pooled with the trained run, not even with include=all
    for record_path in tmp_path.glob("*.json"):
        (out / ("copy-" + record_path.name)).write_text(record_path.read_text())
    try:
        selection = select_runs(str(out), "all")
        assert selection.runs == 1 and selection.evaluations == 1
        assert "evaluation" in selection.summary()
    finally:
        for copy in out.glob("copy-*.json"):
            copy.unlink()


@pytest.mark.parametrize("args,says", [
    (["model.d_model=8"], "'model.d_model' cannot change"),
    (["model=lstm"], "'model' cannot change"),
    (["trainer.lr=0.1"], "'trainer.lr' cannot change"),
    (["trainer.max_steps=10"], "'trainer.max_steps' cannot change"),
    (["seed=3"], "'seed' cannot change"),
    (["task=hmm"], "task family must stay the same"),
    (["task.vocab_size=3"], "do not fit the model"),
])
def test_refused_overrides(trained, tmp_path, capsys, args, says):
    out, record = trained
    code = main(["eval", f"weights={out / record['weights']}", *args, f"out_dir={tmp_path}"])
    assert code == 2
    assert says in one_error_line(capsys.readouterr().err)
    assert not list(tmp_path.iterdir())  # nothing written


def test_bad_weights_files(trained, tmp_path, capsys):
    out, record = trained
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file")
    other = tmp_path / "other.pt"
    torch.save({"state_dict": {}}, other)
    for planted in (garbage, other):  # vouched for: the checks after the digest's are reached
        signed(planted)
    results = tmp_path / "results"
    for path, says in ((tmp_path / "missing.pt", "no weights file"),
                       (garbage, "cannot read weights"),
                       (other, "is not a weights file")):
        assert main(["eval", f"weights={path}", f"out_dir={results}"]) == 2
        assert says in one_error_line(capsys.readouterr().err)
    assert main(["eval", f"out_dir={results}"]) == 2
    assert "weights=<file>" in one_error_line(capsys.readouterr().err)
    # a state_dict that lost a tensor
    saved = torch.load(out / record["weights"], map_location="cpu", weights_only=True)
    saved["state_dict"].pop(next(iter(saved["state_dict"])))
    torch.save(saved, other)
    signed(other)
    assert main(["eval", f"weights={other}", f"out_dir={results}"]) == 2
    assert "do not fit the model" in one_error_line(capsys.readouterr().err)
    assert not results.exists()


def test_unwritable_weights_warn_and_the_run_stays_ok(tmp_path, capsys):
    (tmp_path / "weights").write_text("a file where the weights folder would go")
    assert main(["run", f"out_dir={tmp_path}", *TINY]) == 0
    (record,) = records(tmp_path)
    assert record["status"] == "ok" and record["weights"] is None
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if "weights could not be saved" in line]
    assert len(warnings) == 1
    assert not list(tmp_path.rglob(".tmp-*"))


def test_save_weights_false_saves_nothing(tmp_path):
    assert main(["run", f"out_dir={tmp_path}", *TINY, "trainer.save_weights=false"]) == 0
    (record,) = records(tmp_path)
    assert record["status"] == "ok" and record["weights"] is None
    assert not (tmp_path / "weights").exists()


def test_eval_help_and_refusal_before_reading(tmp_path, capsys):
    assert main(["eval", "--help"]) == 0
    assert capsys.readouterr().out.startswith("python -m bench eval")
    # a refused key is refused before the file is looked at
    assert main(["eval", f"weights={tmp_path / 'missing.pt'}", "model.n_layers=2"]) == 2
    assert "'model.n_layers' cannot change" in one_error_line(capsys.readouterr().err)


def test_weights_whose_model_depends_on_seq_len_are_refused(tmp_path, capsys):
    """A transformer's learned positions are seq_len long: at another seq_len they do not fit."""
    out = tmp_path / "t"
    assert main(["run", f"out_dir={out}", *TINY[2:], "task=linreg", "model=transformer"]) == 0
    (weights,) = (out / "weights").glob("*.pt")
    capsys.readouterr()
    assert main(["eval", f"weights={weights}", "task.seq_len=40", f"out_dir={tmp_path / 'e'}"]) == 2
    assert "do not fit the model transformer" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "e").exists()
