"""tasks/corpora/: finding text corpora offline, tokenizers, the token cache, windows, metrics
and n-gram baselines. No network: the hub is switched off for every test, and HF's caches point
into tmp_path."""
import json
import math
import os
import time

import numpy as np
import pytest
import torch
from scipy import stats

from tasks import corpora as C
from tasks.corpora import sources, tokenizers

TRAIN = ["The first document.\nIt has two lines.\n",
         "Zweites Dokument: Grüße, naïve café ✓\n"]
VALID = ["A validation text 😀.\n"]
TEST = ["Test one.\n", "Test two, the last.\n"]
DOCS = {"train": TRAIN, "validation": VALID, "test": TEST}


@pytest.fixture(autouse=True)
def no_hub(monkeypatch, tmp_path_factory):
    """Hub off (the probe answers False at once) and HF's caches empty and private."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_cache = tmp_path_factory.mktemp("hf_hub")
    import datasets.config
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", hub_cache / "datasets")


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message and message.strip() == message
    return message


def rows(corpus, split):
    return list(corpus[split]["text"])


# ------------------------------------------------------------------------------ finding data

def write_txt_documents(root):  # PG-19's own layout: one book per file, a folder per split
    for split, docs in DOCS.items():
        (root / split).mkdir(parents=True)
        for i, doc in enumerate(docs):
            (root / split / f"book{i}.txt").write_text(doc, encoding="utf-8")


def write_txt_lines(root):
    for split, name in [("train", "train.txt"), ("validation", "valid.txt"), ("test", "test.txt")]:
        (root / name).write_text("".join(DOCS[split]), encoding="utf-8")


def write_wikitext_raw(root):
    for split, name in [("train", "train"), ("validation", "valid"), ("test", "test")]:
        (root / f"wiki.{name}.raw").write_text("".join(DOCS[split]), encoding="utf-8")


def write_parquet(root):
    import pyarrow as pa
    import pyarrow.parquet as pq
    for split, name in [("train", "train-00000-of-00001.parquet"),
                        ("validation", "validation.parquet"), ("test", "test.parquet")]:
        docs = DOCS[split]
        pq.write_table(pa.table({"title": [f"t{i}" for i in range(len(docs))], "text": docs}),
                       root / name)


def write_jsonl(root, suffix=".jsonl"):
    (root / "data").mkdir()
    for split, name in [("train", "train"), ("validation", "dev"), ("test", "test")]:
        with open(root / "data" / f"{name}{suffix}", "w", encoding="utf-8") as f:
            for doc in DOCS[split]:
                f.write(json.dumps({"content": doc, "id": 1}) + "\n")


def write_save_to_disk(root):
    import datasets
    datasets.DatasetDict({s: datasets.Dataset.from_dict({"text": d}) for s, d in DOCS.items()}
                         ).save_to_disk(str(root / "saved"))
    return root / "saved"


def write_save_to_disk_per_split(root):
    import datasets
    for split, docs in DOCS.items():
        datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(root / split))


@pytest.mark.parametrize("layout", ["txt_documents", "txt_lines", "wikitext_raw", "parquet",
                                    "jsonl", "json", "save_to_disk", "save_to_disk_per_split"])
def test_local_layouts_give_the_three_splits(tmp_path, layout):
    data = tmp_path / "data"
    data.mkdir()
    options = dict(hf_cache_dir=tmp_path / "hf", hub=False)
    source = "mine"
    if layout == "txt_documents":
        write_txt_documents(data)
        options["sample_by"] = "document"
    elif layout == "txt_lines":
        write_txt_lines(data)
        options["sample_by"] = "line"
    elif layout == "wikitext_raw":
        write_wikitext_raw(data)
        source = "wikitext-103"  # rows are lines by default
    elif layout == "parquet":
        write_parquet(data)
    elif layout in ("jsonl", "json"):
        write_jsonl(data, "." + layout)
        options["text_field"] = "content"
    elif layout == "save_to_disk":
        data = write_save_to_disk(data)
    else:
        write_save_to_disk_per_split(data)
    corpus = C.load_splits(source, data_dir=data, **options)
    assert set(corpus.splits) == {"train", "validation", "test"}
    for split, docs in DOCS.items():
        assert corpus[split].column_names == ["text"]
        if corpus.sample_by == "line":  # one row per line, line breaks kept
            assert rows(corpus, split) == "".join(docs).splitlines(keepends=True)
        else:
            assert rows(corpus, split) == docs
    assert corpus.identity == C.load_splits(source, data_dir=data, **options).identity


def test_explicit_data_files_and_a_single_file(tmp_path):
    write_txt_lines(tmp_path)
    files = {"train": tmp_path / "train.txt", "validation": [tmp_path / "valid.txt"],
             "test": str(tmp_path / "test.txt")}
    corpus = C.load_splits("x", data_files=files, sample_by="document", hub=False,
                           hf_cache_dir=tmp_path / "hf")
    assert rows(corpus, "validation") == ["".join(VALID)]
    single = C.load_splits("x", data_dir=tmp_path / "train.txt", sample_by="document",
                           splits=("train",), hub=False, hf_cache_dir=tmp_path / "hf")
    assert list(single.splits) == ["train"] and rows(single, "train") == ["".join(TRAIN)]


def test_split_keywords_need_delimiters():
    from pathlib import PurePosixPath as P
    assert sources._split_of(P("wiki.valid.raw")) == "validation"
    assert sources._split_of(P("train-00003-of-00023.parquet")) == "train"
    assert sources._split_of(P("pg19/test/12345.txt")) == "test"
    assert sources._split_of(P("latest.txt")) is None
    assert sources._split_of(P("interval.txt")) is None
    with pytest.raises(C.CorpusError):
        sources._split_of(P("train_test.txt"))


def test_missing_split_is_one_line_naming_the_splits_found(tmp_path):
    write_txt_lines(tmp_path)
    (tmp_path / "test.txt").unlink()
    with pytest.raises(C.MissingSplit) as error:
        C.load_splits("mine", data_dir=tmp_path, hub=False, hf_cache_dir=tmp_path / "hf")
    message = one_line(error)
    assert "no test split" in message and "found train, validation" in message


def test_no_data_and_no_hub_fails_fast_with_one_line_naming_files_and_folder(tmp_path):
    empty = tmp_path / "wikitext"
    empty.mkdir()
    start = time.perf_counter()
    with pytest.raises(C.CorpusNotFound) as error:  # hub=None probes: HF_HUB_OFFLINE says no
        C.load_splits("wikitext-103", data_dir=empty, hf_cache_dir=tmp_path / "hf")
    assert time.perf_counter() - start < 5
    message = one_line(error)
    for name in ("wiki.train.raw", "wiki.valid.raw", "wiki.test.raw", str(empty.resolve()),
                 "Salesforce/wikitext"):
        assert name in message
    assert isinstance(error.value, ValueError)
    with pytest.raises(C.CorpusNotFound) as error:
        C.load_splits("pg19", hub=False, hf_cache_dir=tmp_path / "hf")
    assert "train/*.txt" in one_line(error) and "data_dir" in one_line(error)
    with pytest.raises(C.CorpusNotFound) as error:  # a label with neither data nor hub name
        C.load_splits("mystery", data_dir=tmp_path / "absent", hub=False)
    assert "mystery" in one_line(error) and "reachable" not in one_line(error)


def test_hub_copy_is_loaded_online_and_reduced_to_its_text_column(tmp_path, monkeypatch):
    """The hub path, with datasets.load_dataset standing in for the hub (no network here)."""
    import datasets
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    calls = []

    def fake_hub(name, config=None, cache_dir=None):
        calls.append((name, config, huggingface_hub.constants.HF_HUB_OFFLINE))
        return datasets.DatasetDict({s: datasets.Dataset.from_dict(
            {"short_book_title": ["b"] * len(d), "text": d}) for s, d in DOCS.items()})
    monkeypatch.setattr(datasets, "load_dataset", fake_hub)
    corpus = C.load_splits("pg19", data_dir=tmp_path / "absent", hub=True)
    assert calls == [("emozilla/pg19", None, False)]  # online inside
    assert corpus.sample_by == "document" and corpus["test"].column_names == ["text"]
    assert rows(corpus, "test") == TEST and "emozilla/pg19" in corpus.description

    def unreachable(name, config=None, cache_dir=None):
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub (LocalEntryNotFoundError)\nmore")
    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(C.CorpusNotFound) as error:
        C.load_splits("wikitext-103", data_dir=tmp_path, hub=True)
    message = one_line(error)
    assert "Salesforce/wikitext, config wikitext-103-raw-v1" in message
    assert "Couldn't reach" in message and "wiki.train.raw" in message
    monkeypatch.setattr(datasets, "load_dataset", fake_hub)
    C.load_splits("pg19", hub=False)  # offline: only HF's local cache, and the flag comes back
    assert calls[-1] == ("emozilla/pg19", None, True)
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False


def test_hub_probe_honours_offline_variable(monkeypatch):
    start = time.perf_counter()
    assert C.hub_reachable() is False
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: refused at once
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert C.hub_reachable(timeout=1.0) is False
    assert time.perf_counter() - start < 0.5  # a refused connection ends the probe at once


# ------------------------------------------------------------------------------ pydoc corpus

@pytest.fixture(scope="module")
def pydoc(tmp_path_factory):
    """Python's own help texts (real English, ~465 kB) as a corpus of documents: one topic per
    file, every 10th topic in validation, the next in test, the rest training."""
    from pydoc_data.topics import topics
    root = tmp_path_factory.mktemp("pydoc")
    docs = {"train": [], "validation": [], "test": []}
    for i, name in enumerate(sorted(topics)):
        split = "validation" if i % 10 == 0 else "test" if i % 10 == 1 else "train"
        (root / split).mkdir(exist_ok=True)
        (root / split / f"{name}.txt").write_text(topics[name], encoding="utf-8")
        docs[split].append(topics[name])
    corpus = C.load_splits("pydoc-topics", data_dir=root, sample_by="document", hub=False,
                           hf_cache_dir=root.parent / "hf-pydoc")
    return corpus, {s: sorted(d) for s, d in docs.items()}, root


# ------------------------------------------------------------------------------ tokenizers

def test_byte_tokenizer_is_utf8():
    tok = C.make_tokenizer("byte")
    text = "Grüße ✓ 😀\n"
    ids = tok.encode(text)
    assert tok.vocab_size == 256 and tok.eod_id is None
    assert list(ids) == list(text.encode("utf-8")) and tok.decode(ids) == text
    assert tok.bytes_encoded == len(text.encode("utf-8")) and tok.texts_encoded == 1


def test_bpe_is_trained_once_saved_beside_the_cache_and_round_trips(pydoc, tmp_path, monkeypatch):
    corpus, docs, _ = pydoc
    tok = C.make_tokenizer("bpe", vocab_size=1000, corpus=corpus, cache_dir=tmp_path,
                           progress=False)
    path = tmp_path / corpus.key / "bpe-1000" / "tokenizer.json"
    assert path.is_file() and tok.path == str(path)
    assert 257 < tok.vocab_size <= 1000 and tok.eod_id is not None
    for text in docs["validation"][:3] + ["naïve café ✓ 😀 <|endoftext|>"]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert tok.eod_id not in ids  # literal "<|endoftext|>" in a text is just text
    assert len(tok.encode(docs["test"][0])) < 0.5 * len(docs["test"][0].encode())  # it compresses

    def no_training(*args, **kwargs):
        raise AssertionError("retrained")
    monkeypatch.setattr(tokenizers, "document_texts", no_training)  # looked up there
    mtime = path.stat().st_mtime_ns
    again = C.make_tokenizer("bpe", vocab_size=1000, corpus=corpus, cache_dir=tmp_path)
    assert again.identity == tok.identity and path.stat().st_mtime_ns == mtime
    with pytest.raises(ValueError):
        C.make_tokenizer("bpe", vocab_size=100, corpus=corpus, cache_dir=tmp_path)


def tiny_byte_level_bpe(path):
    """A tokenizer.json in GPT-2's format (byte-level BPE, <|endoftext|> special), standing in
    for GPT-2's own file."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[C.EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAIN * 20 + TEST * 20, trainer=trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return tok


def test_gpt2_loads_a_local_tokenizer_json(tmp_path):
    reference = tiny_byte_level_bpe(tmp_path / "gpt2" / "tokenizer.json")
    tok = C.make_tokenizer("gpt2", path=tmp_path / "gpt2" / "tokenizer.json", hub=False)
    assert tok.name == "gpt2" and tok.vocab_size == reference.get_vocab_size()
    assert tok.eod_id == reference.token_to_id(C.EOT)
    text = "Grüße, the first document ✓"
    assert list(tok.encode(text)) == reference.encode(text).ids
    assert tok.decode(tok.encode(text)) == text


def test_gpt2_without_file_or_hub_is_one_line(tmp_path):
    missing = tmp_path / "nowhere" / "tokenizer.json"
    start = time.perf_counter()
    with pytest.raises(C.TokenizerNotFound) as error:  # hub=None: the probe says offline
        C.make_tokenizer("gpt2", path=missing)
    assert time.perf_counter() - start < 5
    message = one_line(error)
    assert str(missing.resolve()) in message and "tokenizer.json" in message and "hub" in message
    with pytest.raises(C.TokenizerNotFound) as error:
        C.make_tokenizer("gpt2", hub=False)
    assert "none given" in one_line(error)
    with pytest.raises(ValueError, match="byte, gpt2 or bpe"):
        C.make_tokenizer("word")


# ------------------------------------------------------------------------------ token cache

class Refusing(C.ByteTokenizer):
    """Byte tokenizer that fails when asked to encode (after `allowed` batches)."""

    def __init__(self, allowed=0):
        super().__init__()
        self.allowed = allowed

    def encode_batch(self, texts):
        if self.allowed <= 0:
            raise RuntimeError("tokenized")
        self.allowed -= 1
        return super().encode_batch(texts)


def cache_files(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_byte_cache_is_built_once_then_reused(pydoc, tmp_path):
    corpus, docs, _ = pydoc
    tok = C.make_tokenizer("byte")
    tokens, meta = C.cached_tokens(corpus, "train", tok, tmp_path, progress=False)
    text = "".join(rows(corpus, "train"))
    assert isinstance(tokens, np.memmap) and not tokens.flags.writeable
    assert tokens.dtype == np.uint16
    assert tok.decode(tokens) == text and sorted(rows(corpus, "train")) == docs["train"]
    assert meta["n_tokens"] == meta["n_bytes"] == len(text.encode("utf-8")) == len(tokens)
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 256 and meta["tokenizer"] == "byte"
    bin_path, meta_path = C.cache_paths(corpus, "train", tok, tmp_path)
    assert json.loads(meta_path.read_text()) == meta and (tmp_path / C.CACHEDIR_TAG).is_file()
    encoded = tok.texts_encoded
    start = time.perf_counter()
    again, meta_again = C.cached_tokens(corpus, "train", Refusing(), tmp_path, progress=False)
    assert time.perf_counter() - start < 2
    assert tok.texts_encoded == encoded and meta_again == meta and np.array_equal(again, tokens)
    assert not [p for p in cache_files(tmp_path) if p.endswith(".tmp")]


def test_bpe_cache_puts_end_of_document_between_documents(pydoc, tmp_path):
    corpus, _, _ = pydoc
    tok = C.make_tokenizer("bpe", vocab_size=1000, corpus=corpus, cache_dir=tmp_path,
                           progress=False)
    tokens, meta = C.cached_tokens(corpus, "validation", tok, tmp_path, progress=False,
                                   batch_bytes=5000)  # several batches
    documents = rows(corpus, "validation")
    expected = []
    for i, doc in enumerate(documents):
        expected += ([tok.eod_id] if i else []) + list(tok.encode(doc))
    assert tokens.dtype == np.uint16 and list(tokens) == expected
    assert meta["n_documents"] == len(documents) and meta["eod_id"] == tok.eod_id
    assert meta["n_bytes"] == sum(len(d.encode("utf-8")) for d in documents)
    pieces = np.split(np.asarray(tokens), np.flatnonzero(np.asarray(tokens) == tok.eod_id))
    assert [tok.decode(p[1:] if i else p) for i, p in enumerate(pieces)] == documents
    encoded = tok.texts_encoded
    C.cached_tokens(corpus, "validation", tok, tmp_path, progress=False)
    assert tok.texts_encoded == encoded  # reused, nothing tokenized


def test_a_failed_build_leaves_no_files_and_a_damaged_cache_is_rebuilt(pydoc, tmp_path):
    corpus, _, _ = pydoc
    with pytest.raises(RuntimeError, match="tokenized"):
        C.cached_tokens(corpus, "train", Refusing(allowed=2), tmp_path, progress=False,
                        batch_bytes=10000)
    assert cache_files(tmp_path) == [C.CACHEDIR_TAG]
    tok = C.ByteTokenizer()
    tokens, meta = C.cached_tokens(corpus, "test", tok, tmp_path, progress=False)
    bin_path, _ = C.cache_paths(corpus, "test", tok, tmp_path)
    del tokens
    with open(bin_path, "r+b") as f:  # a truncated file no longer matches its sidecar
        f.truncate(10)
    rebuilt = C.ByteTokenizer()
    tokens, meta_again = C.cached_tokens(corpus, "test", rebuilt, tmp_path, progress=False)
    assert rebuilt.texts_encoded > 0 and len(tokens) == meta["n_tokens"]


def test_large_vocabulary_is_stored_as_uint32(pydoc, tmp_path):
    corpus, _, _ = pydoc

    class Wide(C.ByteTokenizer):
        vocab_size = 70000
        identity = "byte-in-a-wide-vocabulary"

    tokens, meta = C.cached_tokens(corpus, "test", Wide(), tmp_path, progress=False)
    narrow, _ = C.cached_tokens(corpus, "test", C.ByteTokenizer(), tmp_path, progress=False)
    assert tokens.dtype == np.uint32 and meta["dtype"] == "uint32"
    assert np.array_equal(tokens, narrow)


def test_line_corpus_tokenizes_back_to_the_file_and_cache_in_data_dir_is_not_data(tmp_path):
    write_wikitext_raw(tmp_path)
    corpus = C.load_splits("wikitext-103", data_dir=tmp_path, hub=False,
                           hf_cache_dir=tmp_path / "_hf")
    tokens, _ = C.cached_tokens(corpus, "train", C.ByteTokenizer(), tmp_path / "cache",
                                progress=False)
    assert C.ByteTokenizer().decode(tokens) == (tmp_path / "wiki.train.raw").read_text()
    again = C.load_splits("wikitext-103", data_dir=tmp_path, hub=False,
                          hf_cache_dir=tmp_path / "_hf")  # the cache's .json files are skipped
    assert again.identity == corpus.identity and rows(again, "test") == rows(corpus, "test")
    # hub-style rows: lines without their line break, empty rows for blank lines
    hub_rows = [" = Title =", "", " Text ."]
    assert "".join(t for b in C.document_texts(hub_rows, "line") for t in b) == \
        " = Title =\n\n Text .\n"
    assert "".join(t for b in C.document_texts(["a", "b"], "paragraph") for t in b) == "a\n\nb"


# ------------------------------------------------------------------------------ windows

def memmap_of(tmp_path, values, dtype=np.uint16):
    path = tmp_path / "tokens.bin"
    np.asarray(values, dtype=dtype).tofile(path)
    return np.memmap(path, dtype=dtype, mode="r")


def test_training_windows_are_uniform_reproducible_and_in_bounds(tmp_path):
    tokens = memmap_of(tmp_path, np.arange(60))  # a token's value is its position
    seq_len, n = 9, 20400
    windows = C.training_windows(tokens, n, seq_len, torch.Generator().manual_seed(5))
    assert windows.shape == (n, seq_len + 1) and windows.dtype == torch.long
    starts = windows[:, 0]
    assert torch.equal(windows, starts[:, None] + torch.arange(seq_len + 1))  # contiguous slices
    positions = len(tokens) - seq_len  # starts 0..50
    counts = np.bincount(starts.numpy(), minlength=positions)
    assert len(counts) == positions and counts.min() > 0  # both ends reached, nothing beyond
    chi2 = ((counts - n / positions) ** 2 / (n / positions)).sum()
    assert stats.chi2.sf(chi2, positions - 1) > 1e-4  # uniform (false alarm rate 1e-4)
    again = C.training_windows(tokens, n, seq_len, torch.Generator().manual_seed(5))
    other = C.training_windows(tokens, n, seq_len, torch.Generator().manual_seed(6))
    assert torch.equal(again, windows) and not torch.equal(other, windows)
    with pytest.raises(ValueError):
        C.training_windows(tokens, 1, 60, torch.Generator())


@pytest.mark.parametrize("seq_len", [1, 4, 10])
@pytest.mark.parametrize("n_tokens", [2, 5, 11, 12, 37, 100])
def test_evaluation_windows_score_every_target_exactly_once(tmp_path, n_tokens, seq_len):
    tokens = memmap_of(tmp_path, np.arange(n_tokens))
    for stride in sorted({None, 1, max(1, seq_len // 3), seq_len}, key=lambda s: s or seq_len):
        inputs, targets, mask = C.evaluation_windows(tokens, seq_len, stride)
        assert inputs.shape == targets.shape == mask.shape and inputs.shape[1] == seq_len
        scored = targets[mask].numpy()
        assert np.array_equal(np.sort(scored), np.arange(1, n_tokens))  # each target once
        assert torch.equal(targets[mask], inputs[mask] + 1)  # input = the token before
        if n_tokens - 1 >= seq_len:
            assert int(targets.max()) == n_tokens - 1 and bool((inputs >= 0).all())
        if stride in (None, seq_len):
            assert len(inputs) == math.ceil((n_tokens - 1) / seq_len)
        elif n_tokens - 1 > seq_len:  # later windows score only their last `stride` targets
            assert not mask[1:-1, : seq_len - stride].any()
    if n_tokens > 12:
        _, targets, mask = C.evaluation_windows(tokens, seq_len, max(1, seq_len // 2),
                                                max_windows=3)
        scored = targets[mask].numpy()
        assert len(targets) <= 3 and len(np.unique(scored)) == len(scored)


def test_short_split_gives_one_padded_window(tmp_path):
    tokens = memmap_of(tmp_path, [7, 8, 9])
    inputs, targets, mask = C.evaluation_windows(tokens, 5)
    assert inputs.tolist() == [[7, 8, 9, 0, 0]] and targets.tolist() == [[8, 9, 0, 0, 0]]
    assert mask.tolist() == [[True, True, False, False, False]]


# ------------------------------------------------------------------------------ metrics

def test_perplexity_and_bits_per_byte_by_definition():
    generator = torch.Generator().manual_seed(0)
    probs = torch.rand(1000, generator=generator, dtype=torch.float64) * 0.9 + 0.05
    nll = -probs.log()
    assert C.perplexity(nll.sum().item(), 1000) == pytest.approx(
        torch.exp(nll.mean()).item(), rel=1e-12)
    assert C.perplexity(nll.sum().item(), 1000) == pytest.approx(
        float(np.prod(probs.numpy() ** (-1 / 1000))), rel=1e-9)  # geometric mean of 1/p
    assert C.nats_per_token(nll.sum().item(), 1000) == pytest.approx(nll.mean().item())
    n_bytes = 2500  # e.g. 1000 BPE tokens covering 2500 bytes of text
    bits = -torch.log2(probs).sum().item()
    assert C.bits_per_byte(nll.sum().item(), n_bytes) == pytest.approx(bits / n_bytes, rel=1e-12)


# ------------------------------------------------------------------------------ baselines

V = 7  # token 6 never occurs in training


@pytest.fixture
def train_tokens(tmp_path):
    generator = np.random.default_rng(0)
    values = generator.choice(6, size=400, p=[0.4, 0.2, 0.15, 0.1, 0.1, 0.05])
    values[100:110] = 5  # a run, so some pairs are frequent and others absent
    return memmap_of(tmp_path, values)


@pytest.fixture
def windows():
    generator = np.random.default_rng(1)
    inputs = torch.from_numpy(generator.integers(0, V, size=(5, 12)))
    targets = torch.from_numpy(generator.integers(0, V, size=(5, 12)))
    mask = torch.from_numpy(generator.random((5, 12)) < 0.8)
    return inputs, targets, mask


def test_unigram_matches_add_delta_by_hand(train_tokens, windows):
    model = C.fit_unigram(train_tokens, V, delta=0.5, chunk=7)
    counts = {v: 0 for v in range(V)}
    for t in train_tokens.tolist():
        counts[t] += 1
    inputs, targets, mask = windows
    nll = model.nll(inputs, targets, mask)
    for b in range(5):
        for t in range(12):
            p = (counts[int(targets[b, t])] + 0.5) / (len(train_tokens) + 0.5 * V)
            assert nll[b, t].item() == pytest.approx(-math.log(p) if mask[b, t] else 0.0,
                                                     rel=1e-12)
    assert model.probs().sum() == pytest.approx(1.0, rel=1e-12)
    assert model.nll([[0]], [[6]]).isfinite().all()


def test_bigram_matches_absolute_discounting_by_hand(train_tokens, windows):
    D = 0.6
    model = C.fit_bigram(train_tokens, V, discount=D, unigram=C.fit_unigram(train_tokens, V),
                         chunk=9)  # many chunks: the merge of partial counts is exercised
    whole = C.fit_bigram(train_tokens, V, discount=D)
    assert np.array_equal(model.keys, whole.keys) and np.array_equal(model.counts, whole.counts)
    seq = train_tokens.tolist()
    pairs: dict[tuple[int, int], int] = {}
    for a, b in zip(seq[:-1], seq[1:]):
        pairs[a, b] = pairs.get((a, b), 0) + 1
    p_uni = [(seq.count(v) + 1) / (len(seq) + V) for v in range(V)]

    def p(prev, nxt):
        c_v = sum(c for (a, _), c in pairs.items() if a == prev)
        if c_v == 0:
            return p_uni[nxt]
        n_v = sum(1 for (a, _) in pairs if a == prev)
        return max(pairs.get((prev, nxt), 0) - D, 0) / c_v + D * n_v / c_v * p_uni[nxt]

    inputs, targets, mask = windows
    nll = model.nll(inputs, targets, mask)
    for b in range(5):
        for t in range(12):
            expected = -math.log(p(int(inputs[b, t]), int(targets[b, t]))) if mask[b, t] else 0.0
            assert nll[b, t].item() == pytest.approx(expected, rel=1e-12)
    for prev in range(V):  # including 6, never seen as a context
        dist = model.probs(prev)
        assert dist.sum() == pytest.approx(1.0, rel=1e-12) and (dist > 0).all()
        assert np.allclose(dist, [p(prev, w) for w in range(V)], rtol=1e-12)
    assert model.nll([[5, 6]], [[6, 6]]).isfinite().all()


def test_bigram_is_sparse_for_a_gpt2_sized_vocabulary(tmp_path):
    values = np.random.default_rng(2).integers(0, 50257, size=5000)
    model = C.fit_bigram(memmap_of(tmp_path, values), 50257, chunk=1000)
    assert model.keys.dtype == np.int64 and len(model.keys) <= 4999 and model.counts.sum() == 4999
    assert model.probs(int(values[0])).sum() == pytest.approx(1.0, rel=1e-9)
    assert model.nll([[1, 2]], [[3, 4]]).isfinite().all()


def test_in_context_cache_matches_its_definition(train_tokens, windows):
    lam = 0.3
    unigram = C.fit_unigram(train_tokens, V)
    model = C.CacheModel(unigram, lam)
    inputs, targets, mask = windows
    nll = model.nll(inputs, targets, mask)
    p_uni = unigram.probs()
    for b in range(5):
        for t in range(12):
            seen = sum(int(inputs[b, s]) == int(targets[b, t]) for s in range(t + 1))
            p = (1 - lam) * p_uni[int(targets[b, t])] + lam * seen / (t + 1)
            assert nll[b, t].item() == pytest.approx(-math.log(p) if mask[b, t] else 0.0,
                                                     rel=1e-12)
            dist = model.probs(inputs[b, : t + 1])
            assert dist.sum() == pytest.approx(1.0, rel=1e-12)
            assert -math.log(dist[int(targets[b, t])]) == pytest.approx(
                model.nll(inputs, targets)[b, t].item(), rel=1e-12)
    # causal: changing what comes after t leaves the NLL at t unchanged
    changed = inputs.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % V
    assert torch.equal(model.nll(changed, targets)[:, :6], model.nll(inputs, targets)[:, :6])
    assert model.nll([[0, 0]], [[6, 6]]).isfinite().all()


def test_occurrence_counts_match_loops():
    generator = np.random.default_rng(3)
    inputs = generator.integers(0, 4, size=(6, 15))
    targets = generator.integers(0, 4, size=(6, 15))
    counts = C.occurrences_so_far(inputs, targets)
    for b in range(6):
        for t in range(15):
            assert counts[b, t] == (inputs[b, : t + 1] == targets[b, t]).sum()


def test_baselines_on_a_token_cache(pydoc, tmp_path):
    corpus, _, _ = pydoc
    train, _ = C.cached_tokens(corpus, "train", C.ByteTokenizer(), tmp_path, progress=False)
    test, meta = C.cached_tokens(corpus, "test", C.ByteTokenizer(), tmp_path, progress=False)
    models = C.fit_baselines(train, 256)
    inputs, targets, mask = C.evaluation_windows(test, 128)
    losses = {name: m.nll(inputs, targets, mask).sum().item() / mask.sum().item()
              for name, m in models.items()}
    # English bytes: the unigram is near 4.5 bits, context helps, everything beats uniform
    assert losses["bigram"] < losses["unigram"] < math.log(256)
    assert losses["unigram_cache"] < losses["unigram"]
    assert 3.5 < losses["unigram"] / math.log(2) < 5.5
    assert int(mask.sum()) == meta["n_tokens"] - 1


def test_an_edit_that_keeps_size_and_mtime_is_seen(tmp_path):
    """cp -p, rsync -t, touch -r keep a file's size and modification time: the corpus's identity
    (the key of the token and baseline caches) and datasets' own copy must follow the content."""
    data = tmp_path / "data"
    data.mkdir()
    write_txt_lines(data)
    options = dict(hf_cache_dir=tmp_path / "hf", hub=False, sample_by="line")
    before = C.load_splits("mine", data_dir=data, **options)
    train = data / "train.txt"
    text, times = train.read_text(encoding="utf-8"), os.stat(train)
    edited = text.replace(text[0], "X" if text[0] != "X" else "Y", 1)
    assert len(edited.encode()) == len(text.encode()) and edited != text
    train.write_text(edited, encoding="utf-8")
    os.utime(train, ns=(times.st_atime_ns, times.st_mtime_ns))
    after = C.load_splits("mine", data_dir=data, **options)
    assert after.identity != before.identity
    assert "".join(rows(after, "train")) == edited


@pytest.mark.parametrize("case,needle", [
    ("binary", "train.txt: a NUL byte at offset"),
    ("latin1", "train.txt: not UTF-8 at byte"),
    ("bad-jsonl", "train.jsonl:2: not JSON"),
    ("list-jsonl", "train.jsonl:1: a JSON list, not an object"),
    ("whitespace-validation", "the validation split of local folder"),
    ("empty-train", "the train split of local folder"),
])
def test_unreadable_or_empty_data_is_one_line_naming_the_file(tmp_path, case, needle):
    """datasets says only 'An error occurred while generating the dataset': the file, the place
    and the fix are named instead; a split of whitespace would score a handful of tokens."""
    data = tmp_path / "data"
    data.mkdir()
    suffix = ".jsonl" if "jsonl" in case else ".txt"
    text = {".txt": "hello world\n" * 50, ".jsonl": '{"text": "hello world"}\n' * 50}[suffix]
    for split in ("train", "validation", "test"):
        (data / f"{split}{suffix}").write_text(text, encoding="utf-8")
    train = data / f"train{suffix}"
    if case == "binary":
        train.write_bytes(b"text then \x00\x01\x02 bytes" * 10)
    elif case == "latin1":
        train.write_bytes("caf\xe9 au lait\n".encode("latin-1") * 10)
    elif case == "bad-jsonl":
        train.write_text('{"text": "fine"}\n{not json\n', encoding="utf-8")
    elif case == "list-jsonl":
        train.write_text('["text", "in a list"]\n', encoding="utf-8")
    elif case == "whitespace-validation":
        (data / "validation.txt").write_text("   \n\t\n", encoding="utf-8")
    else:
        train.write_text("", encoding="utf-8")
    with pytest.raises(C.CorpusError) as caught:
        C.load_splits("mine", data_dir=data, hf_cache_dir=tmp_path / "hf", hub=False,
                      sample_by="line")
    assert needle in one_line(caught)


def test_a_damaged_cached_bpe_is_trained_again_and_a_damaged_given_file_is_named(pydoc, tmp_path):
    corpus, _, _ = pydoc
    tok = C.make_tokenizer("bpe", vocab_size=1000, corpus=corpus, cache_dir=tmp_path,
                           progress=False)
    path = tmp_path / corpus.key / "bpe-1000" / "tokenizer.json"
    path.write_text(path.read_text()[:100])  # cut short, as a full disk or a kill leaves it
    again = C.make_tokenizer("bpe", vocab_size=1000, corpus=corpus, cache_dir=tmp_path,
                             progress=False)
    assert again.identity == tok.identity  # trained again, the same, and the file replaced
    assert C.make_tokenizer("bpe", vocab_size=1000, corpus=corpus, cache_dir=tmp_path).identity \
        == tok.identity
    given = tmp_path / "given.json"
    given.write_text("garbage{")
    for name in ("bpe", "gpt2"):
        with pytest.raises(C.TokenizerNotFound) as caught:
            C.make_tokenizer(name, path=given, vocab_size=1000, corpus=corpus, hub=False)
        assert one_line(caught).startswith(f"{given}: not a tokenizer.json")


def test_a_flipped_byte_in_cached_tokens_is_caught_and_the_cache_rebuilt(pydoc, tmp_path):
    """Same size, same sidecar: only the digest of the tokens tells a wrong token from a right
    one."""
    corpus, _, _ = pydoc
    tokens, meta = C.cached_tokens(corpus, "test", C.ByteTokenizer(), tmp_path, progress=False)
    expected = np.array(tokens)
    del tokens
    bin_path, _ = C.cache_paths(corpus, "test", C.ByteTokenizer(), tmp_path)
    with open(bin_path, "r+b") as f:
        f.seek(meta["n_tokens"] // 2)
        byte = f.read(1)
        f.seek(meta["n_tokens"] // 2)
        f.write(bytes([byte[0] ^ 0x20]))
    rebuilt = C.ByteTokenizer()
    tokens, _ = C.cached_tokens(corpus, "test", rebuilt, tmp_path, progress=False)
    assert rebuilt.texts_encoded > 0 and np.array_equal(np.array(tokens), expected)


@pytest.mark.parametrize("text", ["word " * 1000, "x" * 5003, "", "short"])
def test_bpe_trains_on_long_texts_in_pieces_that_join_back(text):
    pieces = list(C.training_pieces(text, size=64))
    assert "".join(pieces) == text
    assert all(len(piece) <= 64 for piece in pieces)
    if " " in text:
        assert all(piece.endswith(" ") for piece in pieces[:-1])  # cut at whitespace
