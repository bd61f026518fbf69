"""GPT-2 text pipeline (offline tokenizer files, local .txt, streamed HF loaders) and the offline cache."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from pope.data import offline, text


@pytest.mark.data
def test_gpt2_ids_offline(monkeypatch):
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    encoding = text.gpt2_encoding()
    assert encoding.encode("Hello world") == [15496, 995]
    # ids from GPT-2's encoder.json: The, Ġquick, Ġbrown, Ġfox, Ġjumps, Ġover, Ġthe, Ġlazy, Ġdog, .
    assert encoding.encode("The quick brown fox jumps over the lazy dog.") == [
        464,
        2068,
        7586,
        21831,
        18045,
        625,
        262,
        16931,
        3290,
        13,
    ]
    documents = text.encode_documents(encoding, ["Hello world", "<|endoftext|>"])
    assert documents[0].tolist() == [15496, 995, text.EOT_ID]
    assert text.EOT_ID not in documents[1][:-1].tolist()  # special-token text in data stays plain text


@pytest.mark.data
def test_prepare_offline_prose(tmp_path):
    """The default text set: the prose files (split by file, as before the leads were added) and the
    Wikipedia leads (one document per article, split on their own), every document ending in EOT."""
    dataset = text.prepare_text(tmp_path / "prose", progress=False)
    assert dataset.vocab_size == 50257 and dataset.pad_id is None and dataset.seq_len == 1024
    stats = dataset.manifest["stats"]
    files, leads = stats["files_per_split"], stats["wiki_leads_per_split"]
    assert files == {"train": 210, "valid": 12, "test": 12}
    assert leads == {"train": 9029, "valid": 502, "test": 502}
    encoding = text.gpt2_encoding()
    for split in ("train", "valid", "test"):
        tokens = dataset.split(split)
        assert tokens.n_docs == files[split] + leads[split]
        for index in (0, -1):  # a prose file, a lead
            document = np.asarray(tokens.document(index))
            assert document[-1] == text.EOT_ID and text.EOT_ID not in document[:-1]
    total = sum(len(dataset.split(s)) for s in ("train", "valid", "test"))
    assert 3_300_000 < total < 3_600_000  # ~12 MB of prose (2.39M tokens) + 4.9 MB of leads (1.04M tokens)
    first = encoding.decode(np.asarray(dataset.split("train").document(0)[:-1]).tolist())
    _, files_on_disk = text.default_prose_files()
    assert first in {f.read_text(encoding="utf-8") for f in files_on_disk}  # BPE decodes back to a whole file
    last = encoding.decode(np.asarray(dataset.split("test").document(-1)[:-1]).tolist())
    assert last in set(text.read_wiki_leads(text.wiki_leads_file()).values())


def test_wiki_leads_file_errors(tmp_path):
    bad = tmp_path / "summaries_en-us.json"
    bad.write_text('["not", "a", "mapping"]')
    with pytest.raises(ValueError, match="not the wiki-leads JSON.*fetch --only wiki-leads"):
        text.read_wiki_leads(bad)
    bad.write_text('{"A": {"title": "A"}}')
    with pytest.raises(ValueError, match="not the wiki-leads JSON"):
        text.read_wiki_leads(bad)
    bad.write_text('{"B": {"extract": "b."}, "A": {"extract": "a."}}')
    assert text.read_wiki_leads(bad) == {"A": "a.", "B": "b."}


def test_local_text_directory_and_bad_files(tmp_path, monkeypatch):
    pytest.importorskip("tiktoken")
    monkeypatch.setattr(text, "gpt2_encoding", _byte_encoding)
    corpus = tmp_path / "corpus"
    (corpus / "nested").mkdir(parents=True)
    for i in range(5):
        (corpus / f"{i}.txt").write_text(f"text {i}")
    (corpus / "nested" / "deep.txt").write_text("deep")
    (corpus / "empty.txt").write_text("  \n")
    (corpus / "ignored.md").write_text("not a .txt file")
    dataset = text.prepare_text(tmp_path / "out", source=corpus, progress=False)
    assert [s["file"] for s in dataset.manifest["stats"]["skipped_files"]] == ["empty.txt"]
    docs = sum(dataset.split(s).n_docs for s in ("train", "valid", "test"))
    assert docs == 6 and dataset.split("valid").n_docs >= 1 and dataset.split("test").n_docs >= 1
    (corpus / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt: not UTF-8 text \(invalid byte at offset 3\)"):
        text.prepare_text(tmp_path / "out2", source=corpus, progress=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        text.prepare_text(tmp_path / "out3", source=tmp_path / "missing")


class _ByteEncoding:
    """Stand-in tokenizer (byte values) so the plumbing tests need no tokenizer files."""

    n_vocab, eot_token = 50257, 50256

    def encode_ordinary_batch(self, texts, num_threads=1):
        return [list(t.encode()) for t in texts]


def _byte_encoding():
    return _ByteEncoding()


def test_openwebtext_and_pg19_streaming_plumbing(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(text, "gpt2_encoding", _byte_encoding)
    pages = [f"page {i}" for i in range(5000)]
    books = {"test": ["book one " * 50, "book two"], "validation": ["a valid book"]}
    calls = []

    def fake_load_dataset(name, config=None, split=None, streaming=False):
        calls.append((name, split, streaming))
        rows = pages if name == text.OPENWEBTEXT_ID else books[split]
        return iter({"text": row} for row in rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(datasets, "get_dataset_split_names", lambda name: ["validation", "test"])
    owt = text.prepare_openwebtext(tmp_path / "owt", progress=False, max_docs=4000, valid_fraction=0.01)
    assert calls[0] == (text.OPENWEBTEXT_ID, "train", True)
    assert owt.split_names == ("train", "valid")
    n_valid = owt.split("valid").n_docs
    assert owt.split("train").n_docs + n_valid == 4000 and 20 <= n_valid <= 60  # ~1 % by sha256 of the index
    assert owt.manifest["stats"]["documents"] == 4000

    pg19 = text.prepare_pg19(tmp_path / "pg19", progress=False)
    assert pg19.split_names == ("valid", "test")
    test_split = pg19.split("test")
    assert test_split.n_docs == 2  # book boundaries kept
    assert bytes(np.asarray(test_split.document(1)[:-1]).astype(np.uint8)).decode() == "book two"
    assert test_split.document(0)[-1] == text.EOT_ID

    def offline_hub(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline_hub)
    with pytest.raises(RuntimeError, match="needs internet access to the HF hub"):
        text.prepare_openwebtext(tmp_path / "owt2", progress=False)
    assert not (tmp_path / "owt2").exists()


@pytest.mark.data
def test_offline_cache_is_verified_and_never_refetched(tmp_path, monkeypatch):
    for name in offline.SOURCES:
        assert offline.is_cached(name), f"run `make data` first: {name} is missing"

    def no_network(*args, **kwargs):
        raise AssertionError("a good cache must not be fetched again")

    monkeypatch.setattr(offline, "_run", no_network)
    offline.fetch(list(offline.SOURCES))  # all cached: no client is run

    # a damaged copy is detected and the error says how to fix it
    copy_root = tmp_path / "cache"
    shutil.copytree(offline.SOURCES["gpt2-tokenizer"].path, copy_root / "sources" / "tiktoken")
    monkeypatch.setenv("POPE_CACHE", str(copy_root))
    monkeypatch.setattr(offline, "_verified", set())
    assert offline.is_cached("gpt2-tokenizer")
    victim = copy_root / "sources" / "tiktoken" / offline.TIKTOKEN_VOCAB_BPE_NAME
    victim.write_bytes(victim.read_bytes()[:-10])
    monkeypatch.setattr(offline, "_verified", set())
    with pytest.raises(ValueError, match="was modified or corrupted.*fetch --only gpt2-tokenizer"):
        offline.source_path("gpt2-tokenizer")
    with pytest.raises(FileNotFoundError, match="is not fetched"):
        offline.source_path("chrx")
