"""README's numbers that come from the published records (results/) are the records' numbers:
each sentence below is read from README.md and its values recomputed from results/ as the
leaderboard pools them, so a README left behind by new records fails here."""
import re
from pathlib import Path

import pytest

from bench.reports.selection import select_runs

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


@pytest.fixture(scope="module")
def boards(tmp_path_factory):
    """{task name: {model name: mean gap over the current row's seeds}} of results/, and the
    first record of each task (its reference gaps), for the tasks the sentences below quote:
    their records and the identity index, linked into a folder of their own (a task's rows pool
    its records alone; all of results/ is 180 MB of JSON)."""
    folder = tmp_path_factory.mktemp("results")
    for path in [*(ROOT / "results").glob("lgssm_colored*--*.json"),
                 ROOT / "results" / "identities.json"]:
        (folder / path.name).symlink_to(path)
    selection = select_runs(str(folder))
    gaps, first = {}, {}
    for section in selection.sections:
        for records in section.rows.values():
            record = records[0]
            model = record["model"]["name"]
            task = record["task"]["name"]
            if record["trainer"]["config"].get("max_steps") != 800 or model in gaps.get(task, {}):
                continue
            gaps.setdefault(task, {})[model] = sum(
                r["metrics"]["bayes_gap"] for r in records) / len(records)
            first.setdefault(task, record)
    return gaps, first


def sentence(start: str) -> str:
    found = re.search(re.escape(start) + r"[^.]*(?:\.\d[^.]*)*\.", " ".join(README.split()))
    assert found, f"README no longer says '{start}'"
    return found.group(0)


def test_the_room_task_paragraph_has_the_boards_gaps(boards):
    gaps, _ = boards
    room = gaps["lgssm_colored_room"]
    text = sentence("At 800 steps (a minute each), three seeds each")
    for model, value in (("mamba", "0.020"), ("transformer", "0.062"),
                         ("selective_ssm", "0.062"), ("nonselective_ssm", "0.093"),
                         ("linear_transformer", "0.056")):
        assert f"{room[model]:.3f}" == value and value in text, (model, room[model])


def test_the_paper_tasks_room_is_the_records(boards):
    _, first = boards
    clairvoyant = -first["lgssm_colored"]["metrics"]["gap"]["clairvoyant"]
    written = f"{clairvoyant:.1e}".replace("e-05", "e-5")  # README writes 5.3e-5
    assert f"within {written} of the clairvoyant Kalman filter" in " ".join(README.split())
