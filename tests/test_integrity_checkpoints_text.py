"""Never trust what is on disk, and never score less than was asked (issue 32):

- every checkpoint and weights file the suite writes carries the sha256 of its bytes beside it
  (<file>.sha256), checked before the file is unpickled: a byte flipped in its largest tensor
  resumed (and evaluated) into an `ok` record; now it, a missing or unreadable digest, and a
  file that is not a regular file are one line and exit 2 before anything is written;
- a text task's evaluation split shorter than one window, or with fewer windows than
  task.eval_windows asks for, is refused before training (a 3-token validation.txt gave an `ok`
  perplexity of 2 tokens); trainer.eval_sequences, which does not size a text task's held-out
  set, is said to do nothing;
- a .jsonl row whose text field is not a string, or missing (a parquet column of numbers too),
  is one line naming the file, the row and the field (an ArrowNotImplementedError, a
  DatasetGenerationError naming every file, or the number read as text)."""
import hashlib
import json
import os
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from bench.cli.main import main

MARKOV = ["task=markov", "task.seq_len=16", "model.d_model=16", "trainer.warmup_steps=1",
          "trainer.eval_sequences=16", "trainer.bootstrap=50", "trainer.progress=false",
          "trainer.logger=none", "trainer.threads=1"]
TRAINED = [*MARKOV, "trainer.max_steps=3", "trainer.checkpoint_every=2"]


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def sign(path: Path) -> Path:
    """A digest of path's bytes beside it, as `sha256sum path > path.sha256` writes it."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    Path(f"{path}.sha256").write_text(f"{digest}  {path.name}\n")
    return path


def flip_a_byte_of_the_largest_tensor(path: Path) -> None:
    """One bit flipped in the middle of the largest tensor's bytes (a torch file is a zip of
    stored, uncompressed records): the file still loads, with one wrong weight."""
    with zipfile.ZipFile(path) as archive:
        largest = max((i for i in archive.infolist() if "/data/" in i.filename),
                      key=lambda i: i.file_size)
    with open(path, "r+b") as file:
        file.seek(largest.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", file.read(4))
        at = largest.header_offset + 30 + name_length + extra_length + largest.file_size // 2
        file.seek(at)
        byte = file.read(1)[0]
        file.seek(at)
        file.write(bytes([byte ^ 0x40]))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 3-step run checkpointed at step 2 (and last.ckpt), with its weights: out_dir."""
    out = tmp_path_factory.mktemp("trained")
    assert main(["run", f"out_dir={out}", *TRAINED]) == 0
    return out


def checkpoint_at_step_2(out: Path) -> Path:
    return next(out.glob("checkpoints/*/*step=2.ckpt"))


# --- checkpoints and weights carry a digest ----------------------------------------------------

def test_every_checkpoint_and_weights_file_has_the_digest_of_its_bytes(trained):
    files = [*trained.glob("checkpoints/*/*.ckpt"), *trained.glob("weights/*.pt")]
    assert len(files) == 3  # step 2, last (overwritten at every save), and the weights
    for path in files:
        digest, name = Path(f"{path}.sha256").read_text().split()
        assert digest == hashlib.sha256(path.read_bytes()).hexdigest() and name == path.name
    assert not list(trained.rglob(".tmp-*"))


def planted(case: str, good: Path, folder: Path) -> Path:
    """A copy of `good` damaged as `case` says (its digest copied beside it unless said)."""
    path = folder / f"{case}{good.suffix}"
    digest = Path(f"{path}.sha256")
    if case == "fifo":
        os.mkfifo(path)  # a read would block forever
        return path
    shutil.copyfile(good, path)
    shutil.copyfile(f"{good}.sha256", digest)
    if case == "flipped byte":
        flip_a_byte_of_the_largest_tensor(path)
    elif case == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    elif case == "no digest":
        digest.unlink()
    elif case == "digest not a sha256":
        digest.write_text("not a digest\n")
    elif case == "digest a directory":
        digest.unlink()
        digest.mkdir()
    return path


DAMAGED = {  # case: the fragment of the one error line
    "flipped byte": "does not match its digest",
    "truncated": "does not match its digest",
    "no digest": "has no digest",
    "digest not a sha256": "holds no sha256",
    "digest a directory": "is a directory, not a regular file",
    "fifo": "it is a FIFO, not a regular file",
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_checkpoint_is_refused_before_anything_runs(case, trained, tmp_path, capsys):
    path = planted(case, checkpoint_at_step_2(trained), tmp_path)
    out = tmp_path / "out"
    code = main(["run", f"out_dir={out}", *TRAINED, f"resume={path}"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("error: resume: ") and DAMAGED[case] in line, line
    assert str(path) in line
    if case == "no digest":  # a checkpoint from before digests: what to do if it is trusted
        assert f"sha256sum {path} > {path}.sha256" in line
    assert not out.exists()  # no record, no checkpoint folder


@pytest.mark.parametrize("case", list(DAMAGED))
def test_damaged_weights_are_refused_before_anything_runs(case, trained, tmp_path, capsys):
    path = planted(case, next(trained.glob("weights/*.pt")), tmp_path)
    out = tmp_path / "out"
    code = main(["eval", f"weights={path}", f"out_dir={out}"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("error: eval: ") and DAMAGED[case] in line, line
    assert not out.exists()


def test_a_checkpoint_vouched_for_by_sha256sum_resumes(trained, tmp_path, capsys):
    """What the refusal of a digest-less checkpoint advises works: the file with a digest
    written by hand resumes into an `ok` record of the whole run."""
    path = tmp_path / "old.ckpt"
    shutil.copyfile(checkpoint_at_step_2(trained), path)
    sign(path)
    out = tmp_path / "out"
    assert main(["run", f"out_dir={out}", *MARKOV, "trainer.max_steps=3", f"resume={path}"]) == 0
    (record,) = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert record["status"] == "ok" and record["train"]["steps"] == 3
    assert record["resumed_from"] == str(path)


def test_lightning_loads_a_checkpoint_only_through_its_digest(trained, tmp_path):
    """The Trainer's CheckpointIO checks the digest again where Lightning reads the file (a
    file replaced after the checks), and removes the digest with the checkpoint."""
    from bench.training.train import DigestCheckpointIO
    from tasks.files import DamagedFile
    io = DigestCheckpointIO()
    good = checkpoint_at_step_2(trained)
    assert io.load_checkpoint(good)["global_step"] == 2
    with pytest.raises(DamagedFile, match="does not match its digest"):
        io.load_checkpoint(planted("flipped byte", good, tmp_path))
    io.save_checkpoint({"step": torch.arange(3)}, tmp_path / "new" / "a.ckpt")
    assert torch.equal(io.load_checkpoint(tmp_path / "new" / "a.ckpt")["step"], torch.arange(3))
    io.remove_checkpoint(tmp_path / "new" / "a.ckpt")
    assert list((tmp_path / "new").iterdir()) == []


# --- text splits too small to score what was asked ---------------------------------------------

WORDS = "the cat sat on the mat while a dog ran after the ball in the park".split()


def words(n: int, seed: int = 0) -> str:
    generator = torch.Generator().manual_seed(seed)
    return " ".join(WORDS[i] for i in torch.randint(len(WORDS), (n,), generator=generator))


@pytest.fixture
def offline_hf(tmp_path, monkeypatch):
    """HF's hub off and its datasets cache private to the test."""
    import datasets.config
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")


def corpus(folder: Path, suffix: str = ".txt", **replace: str | bytes) -> Path:
    """train/validation/test files of plain words (~3 KB of training text, ~1.3 KB held out),
    `replace` giving some of them other content."""
    folder.mkdir()
    for split, n in (("train", 600), ("validation", 250), ("test", 250)):
        content = replace.get(split, words(n, seed=len(split)))
        path = folder / f"{split}{suffix}"
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return folder


TEXT = ["task=text", "task.tokenizer=byte", "task.seq_len=32", "model.d_model=16",
        "trainer.batch_size=8", "trainer.max_steps=2", "trainer.warmup_steps=1",
        "trainer.bootstrap=50", "trainer.progress=false", "trainer.logger=none",
        "trainer.threads=1"]


def text_run(*overrides: str) -> list[str]:
    """`run` with TEXT, `overrides` replacing the keys they name."""
    keys = {o.split("=", 1)[0] for o in overrides}
    return ["run", *(a for a in TEXT if a.split("=", 1)[0] not in keys), *overrides]

SHORT_SPLITS = {  # case: (split contents, overrides, fragment of the one error line)
    "3-token validation, 16 sequences asked": (
        dict(validation="abc"), ["trainer.eval_sequences=16"],
        "the validation split of local folder {data} has 3 tokens, fewer than one evaluation "
        "window of task.seq_len + 1 = 33 tokens"),
    "validation one token short of a window": (
        dict(validation="x" * 32), [],
        "the validation split of local folder {data} has 32 tokens, fewer than one evaluation "
        "window"),
    "short test split, eval_split=test": (
        dict(test="a few words"), ["task.eval_split=test"],
        "the test split of local folder {data} has 11 tokens, fewer than one evaluation window"),
    "fewer windows than task.eval_windows": (
        dict(validation="y" * 1000), ["task.eval_windows=40"],
        "the validation split of local folder {data} has 1,000 tokens: 32 evaluation window(s) "
        "of task.seq_len=32, fewer than task.eval_windows=40"),
    "fewer strided windows than task.eval_windows": (
        dict(validation="y" * 1000), ["task.eval_windows=100", "task.eval_stride=16"],
        "62 evaluation window(s) of task.seq_len=32, stride 16, fewer than "
        "task.eval_windows=100"),
}


@pytest.mark.parametrize("case", list(SHORT_SPLITS))
def test_a_split_too_small_to_score_what_was_asked_is_refused_before_training(
        case, offline_hf, tmp_path, capsys):
    contents, extra, needle = SHORT_SPLITS[case]
    data = corpus(tmp_path / "data", **contents)
    out = tmp_path / "out"
    code = main(["run", *TEXT, f"task.data_dir={data}", f"out_dir={out}", *extra])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and needle.format(data=data) in line, line
    assert not out.exists()


@pytest.mark.parametrize("windows, refused", [(32, False), (33, True)])
def test_task_eval_windows_may_ask_for_every_window_and_no_more(windows, refused, offline_hf,
                                                                 tmp_path):
    """1,000 byte tokens in windows of 32 + 1: 31 whole windows and the tail's, 32 in all."""
    from bench.training.checks import compose_checked
    from bench.config import ConfigError
    data = corpus(tmp_path / "data", validation="y" * 1000)
    args = [*TEXT, f"task.data_dir={data}", f"task.eval_windows={windows}",
            f"out_dir={tmp_path / 'out'}"]
    if refused:
        with pytest.raises(ConfigError, match="32 evaluation window"):
            compose_checked(args)
    else:
        compose_checked(args)


def test_a_split_only_the_trained_tokenizer_shows_too_short_fails_before_the_first_step(
        offline_hf, tmp_path, capsys):
    """A bpe tokenizer still to be trained leaves the checks a bound (the split's bytes): 69
    bytes of validation pass it, and the trained tokenizer makes them fewer than 33 tokens. The
    run stops before its first step in a failed record (exit 1), never an `ok` one."""
    data = corpus(tmp_path / "data", validation="the cat sat on the mat " * 3)
    out = tmp_path / "out"
    code = main(text_run(f"task.data_dir={data}", f"out_dir={out}", "task.tokenizer=bpe",
                         "task.bpe_vocab_size=300"))
    line = one_error_line(capsys.readouterr().err)
    assert code == 1 and "fewer than one evaluation window" in line, line
    (record,) = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert record["status"] == "failed" and record["train"]["steps"] == 0
    assert record["reason"].startswith("CorpusError: the validation split of local folder")


def test_trainer_eval_sequences_on_a_text_task_is_said_to_do_nothing(offline_hf, tmp_path,
                                                                     capsys):
    data = corpus(tmp_path / "data")
    out = tmp_path / "out"
    assert main(["run", *TEXT, f"task.data_dir={data}", f"out_dir={out}",
                 "trainer.eval_sequences=16"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("warning: trainer.eval_sequences")]
    assert len(warnings) == 1 and "task.eval_windows" in warnings[0]
    from tasks.corpora import evaluation_window_count
    windows = evaluation_window_count(len((data / "validation.txt").read_bytes()), 32)
    (record,) = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert record["status"] == "ok" and record["metrics"]["sequences"] == windows != 16


# --- a text field that is not a string -----------------------------------------------------------

def jsonl(rows: list) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def documents(n: int) -> list[dict]:
    return [{"text": words(60, seed=i)} for i in range(n)]


def with_row(at: int, row, n: int = 10) -> str:
    rows = documents(n)
    rows.insert(at, row)
    return jsonl(rows)


BAD_FIELDS = {  # case: (split, its .jsonl content, extra overrides, fragment of the line)
    "a number": ("train", with_row(3, {"text": 123}), [],
                 "train.jsonl:4: the field 'text' is a number (123), not a string"),
    "a number on the first row": ("train", with_row(0, {"text": 123}), [],
                                  "train.jsonl:1: the field 'text' is a number (123)"),
    "every row a number": ("train", jsonl([{"text": i} for i in range(50)]), [],
                           "train.jsonl:1: the field 'text' is a number (0)"),
    "a float": ("train", with_row(3, {"text": 1.5}), [], "train.jsonl:4: the field 'text' is a "
                                                         "number (1.5)"),
    "a boolean": ("train", with_row(3, {"text": True}), [], "train.jsonl:4: the field 'text' "
                                                            "is a boolean (true)"),
    "null": ("train", with_row(3, {"text": None}), [], "train.jsonl:4: the field 'text' is "
                                                       "null, not a string"),
    "an array": ("train", with_row(3, {"text": ["a", "b"]}), [],
                 "train.jsonl:4: the field 'text' is an array"),
    "an object": ("train", with_row(3, {"text": {"a": 1}}), [],
                  "train.jsonl:4: the field 'text' is an object"),
    "missing": ("train", with_row(5, {"body": "words"}), [],
                "train.jsonl:6: no field 'text' (its fields: 'body')"),
    "missing in validation": ("validation", with_row(0, {"body": "words"}, n=3), [],
                              "validation.jsonl:1: no field 'text'"),
    "a number in validation": ("validation", with_row(2, {"text": 7}, n=3), [],
                               "validation.jsonl:3: the field 'text' is a number (7)"),
    "another text_field": ("train", with_row(3, {"text": "words"}), ["task.text_field=body"],
                           "test.jsonl:1: no field 'body' (its fields: 'text')"),  # read first
}


@pytest.mark.parametrize("case", list(BAD_FIELDS))
def test_a_jsonl_text_field_that_is_not_a_string_is_one_line_naming_the_file(
        case, offline_hf, tmp_path, capsys):
    split, content, extra, needle = BAD_FIELDS[case]
    data = tmp_path / "data"
    data.mkdir()
    for name in ("train", "validation", "test"):
        (data / f"{name}.jsonl").write_text(
            content if name == split else jsonl(documents(10 if name == "train" else 3)))
    out = tmp_path / "out"
    code = main(["run", *TEXT, f"task.data_dir={data}", f"out_dir={out}", *extra])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and f"{data / needle.split(':')[0]}:" in line and needle in line, line
    assert not out.exists()


def test_a_parquet_text_column_of_numbers_is_one_line_naming_the_file(offline_hf, tmp_path,
                                                                       capsys):
    """datasets cast the column to the other files' strings: the numbers were trained on."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    data = tmp_path / "data"
    data.mkdir()
    for name in ("train", "validation", "test"):
        column = list(range(500)) if name == "train" else [words(250, seed=1)] * 2
        pq.write_table(pa.table({"text": column}), data / f"{name}.parquet")
    out = tmp_path / "out"
    code = main(["run", *TEXT, f"task.data_dir={data}", f"out_dir={out}"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and f"{data / 'train.parquet'}: the column 'text' holds int64" in line, line
    assert not out.exists()
