"""DNA: 6-mer tokenisation with single-nucleotide fallback, FASTA validation, region splits."""
from __future__ import annotations

import gzip
import itertools

import numpy as np
import pytest

from pope.data import genome
from pope.data.genome import (KMER_OFFSET, SINGLE_OFFSET, VOCAB_SIZE, detokenize, read_fasta_regions, tokenize,
                              vocabulary)


def reference_tokenize(sequence: str) -> list[int]:
    """Plain-loop statement of the rule: a 6-mer when the next 6 bases are all ACGT, else one base."""
    ids = {token: index for index, token in enumerate(vocabulary())}
    out, i = [], 0
    while i < len(sequence):
        window = sequence[i:i + 6]
        if len(window) == 6 and "N" not in window:
            out.append(ids[window])
            i += 6
        else:
            out.append(ids[sequence[i]])
            i += 1
    return out


def test_vocabulary_is_4107_with_specials():
    vocab = vocabulary()
    assert len(vocab) == VOCAB_SIZE == 4107 == 4096 + 5 + 6
    assert vocab[:6] == ["<unk>", "<pad>", "<mask>", "<cls>", "<eos>", "<bos>"]
    assert vocab[SINGLE_OFFSET:KMER_OFFSET] == list("ACGTN")
    assert vocab[KMER_OFFSET] == "AAAAAA" and vocab[-1] == "TTTTTT" and len(set(vocab)) == 4107
    assert sorted(vocab[KMER_OFFSET:]) == ["".join(p) for p in itertools.product("ACGT", repeat=6)]


def test_fallback_rules():
    ids = {token: index for index, token in enumerate(vocabulary())}
    # 8 bases then N: one 6-mer, two singles, N; then a 6-mer; a tail of fewer than 6 bases is single
    assert tokenize("ACGTACGTNAAAAAATTG").tolist() == [
        ids["ACGTAC"], ids["G"], ids["T"], ids["N"], ids["AAAAAA"], ids["T"], ids["T"], ids["G"]]
    assert tokenize("NNN").tolist() == [ids["N"]] * 3
    assert tokenize("").tolist() == []
    assert tokenize("acgtacgt").tolist() == tokenize("ACGTACGT").tolist()  # soft-masked = upper case
    with pytest.raises(ValueError, match="letter 'R' at position 3"):
        tokenize("ACGRT")
    with pytest.raises(ValueError, match="not a nucleotide or 6-mer"):
        detokenize([1, 11])
    rng = np.random.default_rng(0)
    for _ in range(50):  # random sequences with N runs: vectorised == plain loop, and exact inverse
        sequence = "".join(rng.choice(list("ACGTN"), p=[0.23, 0.23, 0.23, 0.23, 0.08], size=rng.integers(0, 200)))
        assert tokenize(sequence).tolist() == reference_tokenize(sequence)
        assert detokenize(tokenize(sequence)) == sequence


@pytest.mark.data
def test_real_chrx_region_roundtrips_exactly():
    from pope.data.offline import source_path

    fasta = source_path("chrx") / "hs37chrXtrunc.fa.gz"
    sequence = b"".join(b for _, _, b in read_fasta_regions(fasta, region_bases=100_000, max_bases=300_000))
    region = sequence[50_000:300_000].decode()  # N gap [0, 60000), sequence, N gap [94821, 144821), ...
    assert region.count("N") > 50_000  # N runs included, entered and left mid-region:
    assert region[9_999] == "N" and region[10_000] != "N" and region[44_820] != "N" and region[44_821] == "N"
    tokens = tokenize(region)
    assert detokenize(tokens) == region
    assert tokens.tolist() == reference_tokenize(region)
    n_tokens = int((tokens == SINGLE_OFFSET + 4).sum())
    assert n_tokens == region.count("N")  # every N is its own token
    runs = [len(run) for run in region.replace("N", " ").split()]
    assert int((tokens >= KMER_OFFSET).sum()) == sum(length // 6 for length in runs)


def _write_fasta(path, records, gz=False, line=60):
    text = "".join(f">{name} test record\n" + "".join(seq[i:i + line] + "\n" for i in range(0, len(seq), line))
                   for name, seq in records)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("content, message", [
    (">\nACGT\n", r"line 1: FASTA header b'>' has no sequence name"),
    (">   \nACGT\n", r"line 1: FASTA header .* has no sequence name"),
    ("ACGT\n>chr1\nACGT\n", r"line 1: sequence data before the first '>' header"),
    (">chr1\nACGTACGT\nACGTRCGT\n", r"line 3, column 5: letter 'R' in record 'chr1' is not A, C, G, T or N"),
    (">chr1\nACGT\n>chr1\nACGT\n", r"line 3: record name 'chr1' appears twice"),
    ("", r"no FASTA record found"),
])
def test_bad_fasta_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.fa"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        list(read_fasta_regions(path))
    assert str(path) in str(info.value)


def test_truncated_gzip_and_missing_file(tmp_path):
    rng = np.random.default_rng(1)
    sequence = "".join(rng.choice(list("ACGT"), size=200_000))
    good = _write_fasta(tmp_path / "good.fa.gz", [("chr1", sequence)], gz=True)
    assert b"".join(b for _, _, b in read_fasta_regions(good)).decode() == sequence  # gzip detected by magic
    truncated = tmp_path / "truncated.fa.gz"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"truncated.fa.gz: the gzip stream is truncated or corrupt after line \d+"):
        list(read_fasta_regions(truncated))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list(read_fasta_regions(tmp_path / "missing.fa"))
    with pytest.raises(FileNotFoundError, match="FASTA source .* does not exist"):
        genome.prepare_genome(tmp_path / "out", source=tmp_path / "missing.fa")


def test_prepare_splits_by_region_without_overlap(tmp_path):
    rng = np.random.default_rng(2)
    chr1 = "".join(rng.choice(list("ACGT"), size=230_000))
    chr1 = chr1[:50_000] + "N" * 9_000 + chr1[59_000:]  # region 50000-60000 is 90 % N: skipped
    chr2 = "".join(rng.choice(list("ACGTN"), p=[0.24] * 4 + [0.04], size=95_000))
    path = _write_fasta(tmp_path / "two.fa", [("chr1", chr1), ("chr2", chr2)])
    dataset = genome.prepare_genome(tmp_path / "out", source=path, region_bases=10_000, progress=False)
    stats = dataset.manifest["stats"]
    assert [s["region"] for s in stats["regions_skipped_for_n"]] == ["chr1:50000-60000"]
    regions = stats["regions"]
    # 22 + 10 usable regions: blocks of 20 give 18/1/1, the remaining 12 give 10/1/1 (sha256-ranked)
    assert {k: len(v) for k, v in regions.items()} == {"train": 28, "valid": 2, "test": 2}
    all_ids = regions["train"] + regions["valid"] + regions["test"]
    assert len(set(all_ids)) == len(all_ids) == 32  # each region in exactly one split
    records = {"chr1": chr1, "chr2": chr2}

    def bases(region_id):
        name, span = region_id.split(":")
        start, stop = map(int, span.split("-"))
        return records[name][start:stop]

    for split, ids in regions.items():
        tokens = dataset.split(split)
        assert detokenize(np.asarray(tokens.tokens)) == "".join(bases(r) for r in ids)
        assert tokens.document_lengths().max() <= 1000  # 1000-token windows
    assert dataset.vocab_size == 4107 and dataset.pad_id is None and dataset.seq_len == 1000
    assert dataset.manifest["vocab"]["pad_token_id"] == 1
    # explicit cap: recorded, never silent
    capped = genome.prepare_genome(tmp_path / "capped", source=path, region_bases=10_000, max_bases=200_000,
                                   progress=False)
    assert capped.manifest["stats"]["bases_read"] == 200_000 == capped.manifest["stats"]["max_bases_cap"]


@pytest.mark.data
def test_offline_chrx_prepare_and_reuse(tmp_path):
    dataset = genome.prepare_genome(tmp_path / "chrx", max_bases=5_000_000, progress=False)
    stats = dataset.manifest["stats"]
    assert stats["bases_read"] == 5_000_000
    assert {k: len(v) for k, v in stats["regions"].items()} == {"train": 3, "valid": 1, "test": 1}
    again = genome.prepare_genome(tmp_path / "chrx", max_bases=5_000_000, progress=False)
    assert again.reused and again.manifest["created_utc"] == dataset.manifest["created_utc"]


def test_hf_loader_plumbing(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    rows = {"train": ["ACGTACGTAC" * 700, "NNNNACGT"], "validation": ["GGGGGGA"], "test": ["TTTTTTTTTTTT"]}
    calls = []

    def fake_load_dataset(name, config, split, streaming, trust_remote_code):
        calls.append((name, config, split, streaming))
        return iter({"sequence": s, "chromosome": "1"} for s in rows[split])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    dataset = genome.prepare_genome_hf(tmp_path / "hf", progress=False)
    assert calls[0] == ("InstaDeepAI/human_reference_genome", "6kbp", "train", True)
    train = dataset.split("train")
    assert detokenize(np.asarray(train.tokens)) == "".join(rows["train"])
    assert train.document_lengths().tolist() == [1000, 170, 8]  # 7000 bases = 1166 six-mers + 4 singles; 4 N + 4
    assert detokenize(np.asarray(dataset.split("valid").tokens)) == "GGGGGGA"


def test_ambiguity_codes_only_as_n_when_asked(tmp_path):
    path = tmp_path / "iupac.fa"
    path.write_text(">chr3\nACGTACGTRYACGT\nacgtnM\n")
    with pytest.raises(ValueError, match=r"line 2, column 9: letter 'R'.*--ambiguous-as-n"):
        list(read_fasta_regions(path))
    counts = {}
    sequence = b"".join(b for _, _, b in read_fasta_regions(path, ambiguous_as_n=True, counts=counts))
    assert sequence == b"ACGTACGTNNACGTACGTNN" and counts["ambiguous_as_n"] == 3
