"""The held-out set and reference scores are computed once per task configuration and reused:
a cached evaluation gives exactly the scores a fresh one gives, and never a stale one."""
import json

import pytest
import torch

from bench.training import reference_cache
from bench.cli.main import main
from bench.training.checks import compose_checked
from bench.training.evaluate import score_predictions
from bench.training.train import build

TINY = ["task.seq_len=16", "trainer.max_steps=3", "trainer.warmup_steps=1",
        "trainer.eval_sequences=24", "trainer.bootstrap=100", "trainer.progress=false",
        "trainer.logger=none"]


@pytest.mark.parametrize("task", ["markov", "hmm", "linreg", "lgssm_colored"])
def test_cached_scores_equal_fresh_ones(tmp_path, task):
    config = compose_checked([f"task={task}", f"out_dir={tmp_path}", *TINY])
    fresh_task, model = build(config)
    batch, cached = reference_cache.held_out_set(config, fresh_task)
    assert cached is None  # nothing cached yet
    references = reference_cache.complete(config, fresh_task, batch, None)
    model_prediction = model.predict(batch.inputs).detach().double()
    fresh = score_predictions(fresh_task, batch, model_prediction, 100, references)

    again_task, _ = build(config)
    again_batch, again = reference_cache.held_out_set(config, again_task)
    assert again is not None and again_task.held_out_batch is again_batch
    assert again_batch.latent == {}  # latent parameters are not stored: only the references use them
    for field in ("inputs", "targets", "loss_mask"):
        assert torch.equal(getattr(again_batch, field), getattr(batch, field))
    reused = score_predictions(again_task, again_batch, model_prediction, 100, again)
    assert reused == fresh  # every metric and curve, exactly


def test_the_key_is_the_task_configuration_and_the_held_out_size(tmp_path):
    def key(*overrides):
        task, _ = build(compose_checked([f"out_dir={tmp_path}", *overrides]))
        return reference_cache.cache_key(task, 64)
    assert key() == key("model=transformer", "seed=3", "trainer.lr=0.01")  # not the model's
    assert key() != key("task.beta=0.5")
    assert key() != key("task=hmm")
    task, _ = build(compose_checked([]))
    assert reference_cache.cache_key(task, 64) != reference_cache.cache_key(task, 65)


def test_a_change_of_the_task_code_invalidates_the_cache(tmp_path, monkeypatch):
    config = compose_checked([f"out_dir={tmp_path}", *TINY])
    task, _ = build(config)
    batch, _ = reference_cache.held_out_set(config, task)
    reference_cache.complete(config, task, batch, None)
    assert reference_cache.load(str(tmp_path), task, 24) is not None
    monkeypatch.setattr(reference_cache, "_source_digest", lambda: "edited")
    assert reference_cache.load(str(tmp_path), task, 24) is None


def test_a_damaged_cache_file_is_recomputed_and_replaced(tmp_path):
    config = compose_checked([f"out_dir={tmp_path}", *TINY])
    task, _ = build(config)
    path = reference_cache.cache_path(str(tmp_path), task, 24)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a torch file")
    batch, cached = reference_cache.held_out_set(config, task)
    assert cached is None
    reference_cache.complete(config, task, batch, None)
    assert reference_cache.load(str(tmp_path), task, 24) is not None
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_runs_reuse_the_cache_and_report_it(tmp_path, capsys):
    for _ in range(2):
        assert main(["run", f"out_dir={tmp_path}", *TINY]) == 0
    first, second = sorted((json.loads(p.read_text()) for p in tmp_path.glob("*.json")),
                           key=lambda r: r["eval"]["references_cached"])
    assert not first["eval"]["references_cached"] and second["eval"]["references_cached"]
    # the default task and model: markov with a Mamba, whose decay probe is timed too
    assert set(second["eval"]["time_s"]) == {"held_out", "model", "references", "scoring", "probe"}
    assert second["metrics"] == first["metrics"] and second["per_position"] == first["per_position"]
    assert len(list((tmp_path / "cache" / "references").iterdir())) == 1
    # off: nothing read, nothing written
    other = tmp_path / "off"
    assert main(["run", f"out_dir={other}", "trainer.reference_cache=false", *TINY]) == 0
    assert not (other / "cache").exists()


def test_a_cache_whose_content_does_not_match_its_digest_is_recomputed(tmp_path):
    """A flipped byte in a cached score (or input) must not become a Bayes loss: the file's
    content is checked against the digest it was written with."""
    config = compose_checked([f"out_dir={tmp_path}", *TINY])
    task, _ = build(config)
    batch, _ = reference_cache.held_out_set(config, task)
    fresh = reference_cache.complete(config, task, batch, None)
    path = reference_cache.cache_path(str(tmp_path), task, 24)
    for damage in ("scores", "inputs"):
        data = torch.load(path, weights_only=True)
        holder, key = data["content"], "inputs"
        if damage == "scores":
            holder = next(iter(data["content"]["scores"].values()))
            key = next(iter(holder))
        tensor = holder[key].contiguous().clone()
        flat = tensor.view(-1).view(torch.uint8)
        flat[flat.numel() // 2] ^= 0x40  # one bit, as a disk or a copy would flip it
        holder[key] = tensor
        damaged = tmp_path / "damaged.pt"
        torch.save(data, damaged)
        damaged.replace(path)
        assert reference_cache.load(str(tmp_path), task, 24) is None, damage
        # the next run recomputes and replaces it: the same scores as before the damage
        batch, cached = reference_cache.held_out_set(config, task)
        assert cached is None
        again = reference_cache.complete(config, task, batch, None)
        assert reference_cache.content_digest(again.scores) == \
            reference_cache.content_digest(fresh.scores)
        assert reference_cache.load(str(tmp_path), task, 24) is not None


def test_a_cache_that_cannot_be_written_costs_no_result(tmp_path, capsys):
    (tmp_path / "cache").write_text("a file where the cache folder would go")
    assert main(["run", f"out_dir={tmp_path}", *TINY]) == 0
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert record["status"] == "ok" and not record["eval"]["references_cached"]
    assert "warning: the reference cache was not written" in capsys.readouterr().err


def test_references_being_computed_say_so_and_cached_ones_say_nothing(tmp_path, capsys):
    """A first run of lgssm spends about 2 minutes on its references after its progress bars
    have ended: with progress on, two lines say what it is doing and how long it took."""
    config = compose_checked(["task=markov", f"out_dir={tmp_path}",
                              *[o for o in TINY if o != "trainer.progress=false"]])
    task, _ = build(config)
    batch, cached = reference_cache.held_out_set(config, task)
    reference_cache.complete(config, task, batch, cached)
    said = capsys.readouterr().err.splitlines()
    assert said[0] == (f"references: computing {len(task.references())} references on 24 "
                       f"held-out sequences (none cached yet; cached under {tmp_path}/cache/"
                       "references for the next run)")
    assert said[1].startswith("references: computed in ") and said[1].endswith(" s")
    task, _ = build(config)
    batch, cached = reference_cache.held_out_set(config, task)
    assert cached is not None
    reference_cache.complete(config, task, batch, cached)
    assert "references:" not in capsys.readouterr().err
