"""The text task: training windows from the (seed, rank, step) generator, the evaluation split
scored once per token, perplexity against its definition, the token and reference caches reused,
and the user's mistakes (no data, no tokenizer file) as one-line configuration errors."""
import json
import math

import pytest
import torch

from bench.cli.main import main
from bench.training.checks import compose_checked
from bench.training.evaluate import score_predictions, token_scores
from bench.training.train import build
from tasks.base import TRAIN_STREAM, make_generator

pytest.importorskip("datasets")
pytest.importorskip("tokenizers")

WORDS = ("the cat sat on the mat while a dog ran after the ball in the park and "
         "birds sang above the old oak tree near the river").split()


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """A small English-like corpus in train/validation/test .txt files."""
    folder = tmp_path_factory.mktemp("corpus")
    generator = torch.Generator().manual_seed(0)
    for split, words in (("train", 6000), ("validation", 900), ("test", 700)):
        index = torch.randint(len(WORDS), (words,), generator=generator)
        (folder / f"{split}.txt").write_text(" ".join(WORDS[i] for i in index))
    return folder


def text_config(corpus_dir, *extra):
    return compose_checked(["task=text", f"task.data_dir={corpus_dir}", "task.tokenizer=byte",
                            "task.seq_len=32", "model.d_model=16",
                            "trainer.batch_size=8", *extra])


def test_training_windows_are_the_generators_and_shift_by_one(corpus_dir):
    task, _ = build(text_config(corpus_dir))
    tokens = torch.from_numpy(task.split_tokens("train").tokens.astype("int64"))
    first = task.sample(8, make_generator(TRAIN_STREAM, 0, 0, 5))
    again = task.sample(8, make_generator(TRAIN_STREAM, 0, 0, 5))  # a resumed step 5
    other_rank = task.sample(8, make_generator(TRAIN_STREAM, 0, 1, 5))
    assert torch.equal(first.inputs, again.inputs) and not torch.equal(first.inputs,
                                                                       other_rank.inputs)
    assert torch.equal(first.inputs[:, 1:], first.targets[:, :-1]) and first.loss_mask.all()
    for row in first.inputs:  # every window is a stretch of the training split
        starts = (tokens[:len(tokens) - 32] == row[0]).nonzero().flatten()
        assert any(torch.equal(tokens[s:s + 32], row) for s in starts)


@pytest.mark.parametrize("stride", [0, 8])
def test_the_evaluation_split_is_scored_once_per_token(corpus_dir, stride):
    task, _ = build(text_config(corpus_dir, f"task.eval_stride={stride}"))
    held_out = task.held_out(0)
    n_tokens = len(task.split_tokens("validation").tokens)
    assert int(held_out.loss_mask.sum()) == n_tokens - 1  # every target, once


def test_perplexity_is_exp_of_the_mean_nll_per_token(corpus_dir):
    task, model = build(text_config(corpus_dir))
    held_out = task.held_out(0)
    with torch.no_grad():
        loss, correct, _ = token_scores(model, held_out, task.output_dim)
        logits = model(held_out.inputs)
    result = score_predictions(task, held_out, None, 200, None,
                               {"loss": loss.double(), "correct": correct})
    metrics, per_sequence = result["metrics"], result["per_sequence"]
    mask = held_out.loss_mask
    nll = torch.nn.functional.cross_entropy(logits[mask].double(), held_out.targets[mask],
                                            reduction="sum")
    mean = float(nll) / int(mask.sum())
    assert metrics["loss"]["model"] == pytest.approx(mean, rel=1e-5)
    assert metrics["perplexity"]["model"] == pytest.approx(math.exp(mean), rel=1e-5)
    lo, hi = metrics["perplexity_ci"]["model"]
    assert lo < metrics["perplexity"]["model"] < hi
    # byte tokens: one token per byte, bits per byte = nats per token / ln 2
    assert metrics["bytes_per_token"] == 1.0
    assert metrics["bits_per_byte"]["model"] == pytest.approx(mean / math.log(2), rel=1e-5)
    # the baselines: the bigram knows more of this text than the unigram
    assert metrics["loss"]["bigram"] < metrics["loss"]["unigram"]
    assert set(metrics["roles"].values()) == {"baseline"}
    # the windows' loss sums and tokens, which claims pair: their ratio is the per-token loss
    tokens = torch.tensor(per_sequence["tokens"], dtype=torch.float64)
    assert per_sequence["tokens"] == mask.sum(1).tolist() and len(tokens) == metrics["sequences"]
    for name in ("model", "bigram", "unigram"):
        sums = torch.tensor(per_sequence["loss_sum"][name], dtype=torch.float64)
        assert float(sums.sum() / tokens.sum()) == pytest.approx(metrics["loss"][name], rel=1e-6)
    assert isinstance(metrics["held_out_digest"], str)


def test_a_run_reports_perplexity_and_reuses_both_caches(corpus_dir, tmp_path, capsys):
    overrides = ["task=text", f"task.data_dir={corpus_dir}", "task.tokenizer=bpe",
                 "task.bpe_vocab_size=300", "task.seq_len=32",                  "model.d_model=16", "trainer.batch_size=8", "trainer.max_steps=3",
                 "trainer.warmup_steps=1", "trainer.progress=false", "trainer.logger=none",
                 "trainer.bootstrap=100", f"out_dir={tmp_path}"]
    assert main(["run", *overrides]) == 0
    bins = sorted((corpus_dir / "cache").rglob("*.bin"))
    stamps = [p.stat().st_mtime_ns for p in bins]
    assert main(["run", *overrides]) == 0
    assert [p.stat().st_mtime_ns for p in bins] == stamps  # tokenized once
    first, second = sorted((json.loads(p.read_text()) for p in tmp_path.glob("*.json")),
                           key=lambda r: r["eval"]["references_cached"])
    assert second["eval"]["references_cached"] and not first["eval"]["references_cached"]
    assert second["metrics"]["loss"] == first["metrics"]["loss"]
    m = first["metrics"]
    assert m["scoring"] == "perplexity" and "bayes_gap" not in m
    assert m["perplexity"]["model"] == pytest.approx(math.exp(m["loss"]["model"]))
    assert "perplexity" in capsys.readouterr().out
    # the record's metrics name the corpus without this machine's directories (the config keeps
    # task.data_dir as the user gave it)
    assert str(corpus_dir.parent) not in json.dumps(m)
    assert m["task"]["corpus"] == f"local folder {corpus_dir.name}"
    assert m["task"]["corpus_key"].endswith(tuple("0123456789abcdef"))


def test_no_corpus_is_one_line_naming_the_files_and_the_folder(tmp_path, capsys):
    empty = tmp_path / "nothing"
    empty.mkdir()
    assert main(["run", "task=wikitext103", f"task.data_dir={empty}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "wiki.train.raw" in err and str(empty) in err
    assert list(empty.iterdir()) == []


def test_an_install_without_the_text_packages_is_one_line_naming_the_install(
        tmp_path, monkeypatch, capsys):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "datasets" else find_spec(name, *a))
    assert main(["run", "task=pydoc", f"out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: task pydoc: text tasks need datasets: pip install datasets"]
    assert not list(tmp_path.iterdir())


def test_the_gpt2_path_loads_a_local_tokenizer_file(tmp_path, corpus_dir, capsys):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([" ".join(WORDS)], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    data = tmp_path / "wt"
    data.mkdir()
    for split, name in (("train", "wiki.train.raw"), ("validation", "wiki.valid.raw"),
                        ("test", "wiki.test.raw")):
        (data / name).write_text((corpus_dir / f"{split}.txt").read_text())
    config = compose_checked(["task=wikitext103", f"task.data_dir={data}",
                              f"task.tokenizer_file={path}", "model.d_model=16"])
    task, model = build(config)
    assert task.tokenizer().name == "gpt2" and task.tokenizer().vocab_size == 300
    assert task.input_dim == 50257  # the model is GPT-2 sized whatever file stands in
    ids = task.tokenizer().encode("the cat sat")
    assert task.tokenizer().decode(ids) == "the cat sat"
    # a tokenizer file that is not there (and no hub): one line, exit 2
    assert main(["run", "task=wikitext103", f"task.data_dir={data}",
                 f"task.tokenizer_file={tmp_path / 'missing.json'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tokenizer.json" in err


def test_a_suite_of_text_runs_reports_perplexity(corpus_dir, tmp_path, monkeypatch, capsys):
    import bench.cli.run_commands
    entry = ["task=text", f"task.data_dir={corpus_dir}", "task.tokenizer=byte",
             "task.seq_len=32", "model.d_model=16",
             "trainer.batch_size=8", "trainer.max_steps=2", "trainer.warmup_steps=1",
             "trainer.progress=false", "trainer.logger=none", "trainer.bootstrap=50"]
    monkeypatch.setattr(bench.cli.run_commands, "load_suite", lambda name: [entry, ["seed=1", *entry]])
    assert main(["suite", "name=text_cpu", f"out_dir={tmp_path}"]) == 0
    assert capsys.readouterr().out.count("    perplexity ") == 2
