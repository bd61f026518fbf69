"""DNA: 6-mer tokenisation with single-nucleotide fallback, FASTA validation, region splits."""

from __future__ import annotations

import gzip
import itertools
import json

import numpy as np
import pytest

from pope.data import genome
from pope.data.genome import (
    KMER_OFFSET,
    SINGLE_OFFSET,
    VOCAB_SIZE,
    detokenize,
    read_fasta_regions,
    tokenize,
    vocabulary,
)


def reference_tokenize(sequence: str) -> list[int]:
    """Plain-loop statement of the rule: a 6-mer when the next 6 bases are all ACGT, else one base."""
    ids = {token: index for index, token in enumerate(vocabulary())}
    out, i = [], 0
    while i < len(sequence):
        window = sequence[i : i + 6]
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
        ids["ACGTAC"],
        ids["G"],
        ids["T"],
        ids["N"],
        ids["AAAAAA"],
        ids["T"],
        ids["T"],
        ids["G"],
    ]
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
    text = "".join(
        f">{name} test record\n" + "".join(seq[i : i + line] + "\n" for i in range(0, len(seq), line))
        for name, seq in records
    )
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize(
    "content, message",
    [
        (">\nACGT\n", r"line 1: FASTA header b'>' has no sequence name"),
        (">   \nACGT\n", r"line 1: FASTA header .* has no sequence name"),
        ("ACGT\n>chr1\nACGT\n", r"line 1: sequence data before the first '>' header"),
        (">chr1\nACGTACGT\nACGTRCGT\n", r"line 3, column 5: letter 'R' in record 'chr1' is not A, C, G, T or N"),
        (">chr1\nACGT\n>chr1\nACGT\n", r"line 3: record name 'chr1' appears twice"),
        ("", r"no FASTA record found"),
    ],
)
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


# sha256 of the .bin files that the former layout (every region cut into documents of <= 1000 tokens)
# wrote for _two_records_fasta at region_bases=10_000
LAYOUT_1_SHA256 = {
    "train": "f450a40309ea376b4d249082c140e36855afc5e3c73337f3308834bcc52882ca",
    "valid": "842ea538aa29b9a418420cf3be6bb25de5d593c5618f7f5655cbc22b9dacc7ab",
    "test": "614c3dca7733c57cb68acba2afb574b13e568e85a81265e4c7f6e54cc2ec9729",
}


def _two_records_fasta(tmp_path):
    """(FASTA path, {record: sequence}): 230 kb + 95 kb, region chr1:50000-60000 90 % N."""
    rng = np.random.default_rng(2)
    chr1 = "".join(rng.choice(list("ACGT"), size=230_000))
    chr1 = chr1[:50_000] + "N" * 9_000 + chr1[59_000:]  # region 50000-60000 is 90 % N: skipped
    chr2 = "".join(rng.choice(list("ACGTN"), p=[0.24] * 4 + [0.04], size=95_000))
    return _write_fasta(tmp_path / "two.fa", [("chr1", chr1), ("chr2", chr2)]), {"chr1": chr1, "chr2": chr2}


def test_prepare_splits_by_region_without_overlap(tmp_path):
    path, records = _two_records_fasta(tmp_path)
    dataset = genome.prepare_genome(tmp_path / "out", source=path, region_bases=10_000, progress=False)
    stats = dataset.manifest["stats"]
    assert [s["region"] for s in stats["regions_skipped_for_n"]] == ["chr1:50000-60000"]
    regions = stats["regions"]
    # 22 + 10 usable regions: blocks of 20 give 18/1/1, the remaining 12 give 10/1/1 (sha256-ranked)
    assert {k: len(v) for k, v in regions.items()} == {"train": 28, "valid": 2, "test": 2}
    all_ids = regions["train"] + regions["valid"] + regions["test"]
    assert len(set(all_ids)) == len(all_ids) == 32  # each region in exactly one split

    def bases(region_id):
        name, span = region_id.split(":")
        start, stop = map(int, span.split("-"))
        return records[name][start:stop]

    for split, ids in regions.items():
        tokens = dataset.split(split)
        assert detokenize(np.asarray(tokens.tokens)) == "".join(bases(r) for r in ids)
        # one document per region, in split order: the whole region, tokenised on its own
        assert tokens.n_docs == len(ids)
        for index, region_id in enumerate(ids):
            assert np.array_equal(tokens.document(index), tokenize(bases(region_id)))
    assert dataset.split("train").document_lengths().max() > 1000  # a 10 kb region is ~1,667 tokens
    # The token streams are byte for byte those of the former layout (documents of <= 1000 tokens, at
    # 664e90d): the trainer's windows and evaluations of this pad-free data read the streams only.
    assert {
        split: info["sha256"][f"{split}.bin"] for split, info in dataset.manifest["splits"].items()
    } == LAYOUT_1_SHA256
    assert dataset.vocab_size == 4107 and dataset.pad_id is None and dataset.seq_len == 1000
    assert dataset.manifest["vocab"]["pad_token_id"] == 1
    # explicit cap: recorded, never silent
    capped = genome.prepare_genome(
        tmp_path / "capped", source=path, region_bases=10_000, max_bases=200_000, progress=False
    )
    assert capped.manifest["stats"]["bases_read"] == 200_000 == capped.manifest["stats"]["max_bases_cap"]


@pytest.mark.data
def test_offline_chrx_prepare_and_reuse(tmp_path):
    dataset = genome.prepare_genome(tmp_path / "chrx", max_bases=5_000_000, progress=False)
    stats = dataset.manifest["stats"]
    assert stats["bases_read"] == 5_000_000
    assert {k: len(v) for k, v in stats["regions"].items()} == {"train": 3, "valid": 1, "test": 1}
    assert {split: dataset.split(split).n_docs for split in dataset.split_names} == {"train": 3, "valid": 1, "test": 1}
    # the token streams of the former layout (documents of <= 1000 tokens, at 664e90d), byte for byte
    assert {split: info["sha256"][f"{split}.bin"][:16] for split, info in dataset.manifest["splits"].items()} == {
        "train": "f8f958c615495433",
        "valid": "073772fbd44f63d2",
        "test": "f37400a3e39ff57e",
    }
    again = genome.prepare_genome(tmp_path / "chrx", max_bases=5_000_000, progress=False)
    assert again.reused and again.manifest["created_utc"] == dataset.manifest["created_utc"]


def _layout_1_copy(dataset, out_dir):
    """``dataset`` as the former layout wrote it: every region cut into documents of <= 1000 tokens, and a
    request without layout_version."""
    from pope.data.writer import PreparedWriter

    fields = {key: dataset.manifest[key] for key in ("name", "seq_len", "source", "train_transform", "stats")}
    fields["vocab"] = {key: value for key, value in dataset.manifest["vocab"].items() if key != "size"}
    fields["request"] = {key: value for key, value in dataset.manifest["request"].items() if key != "layout_version"}
    fields["stats"] = {**fields["stats"], "documents_are": "consecutive windows of at most 1000 tokens of one region"}
    with PreparedWriter(out_dir, dataset.vocab_size) as writer:
        for split in dataset.split_names:
            token_split = dataset.split(split)
            for index in range(token_split.n_docs):
                region = np.asarray(token_split.document(index))
                for begin in range(0, len(region), 1000):
                    writer.add_document(split, region[begin : begin + 1000])
        return writer.finish(fields)


def test_a_dataset_of_the_former_layout_is_rebuilt_with_the_same_token_streams(tmp_path, capsys):
    path, _ = _two_records_fasta(tmp_path)
    current = genome.prepare_genome(tmp_path / "current", source=path, region_bases=10_000, progress=False)
    old = _layout_1_copy(current, tmp_path / "old")
    assert old.split("train").document_lengths().max() == 1000
    assert old.split("train").n_docs > current.split("train").n_docs
    capsys.readouterr()
    rebuilt = genome.prepare_genome(tmp_path / "old", source=path, region_bases=10_000, progress=False)
    assert "prepared in an older layout (layout_version unset -> 2); rebuilding it" in capsys.readouterr().err
    assert not rebuilt.reused and rebuilt.manifest["request"] == current.manifest["request"]
    for split in current.split_names:
        assert rebuilt.manifest["splits"][split]["sha256"] == current.manifest["splits"][split]["sha256"]
        assert (
            old.manifest["splits"][split]["sha256"][f"{split}.bin"]
            == rebuilt.manifest["splits"][split]["sha256"][f"{split}.bin"]
        )  # the same token stream
    assert genome.prepare_genome(tmp_path / "old", source=path, region_bases=10_000, progress=False).reused


def test_length_evaluation_reaches_the_region_length(tmp_path, capsys):
    """`pope eval length` needs documents of L + 1 tokens: whole regions allow windows far past the
    training length (1000), up to a region's length."""
    import torch

    from pope.checkpoint import save_checkpoint
    from pope.cli import main
    from pope.eval.windows import plan_windows
    from pope.model import GPT, GPTConfig

    rng = np.random.default_rng(3)
    path = _write_fasta(tmp_path / "one.fa", [("chr9", "".join(rng.choice(list("ACGT"), size=90_000)))])
    dataset = genome.prepare_genome(tmp_path / "data", source=path, region_bases=30_000, progress=False)
    test = dataset.split("test")
    assert test.document_lengths().tolist() == [5_000]  # one 30 kb region = 5,000 six-mers
    assert plan_windows(test.doc_offsets, 4_999).n_targets_scored == 4_999
    with pytest.raises(ValueError, match="no document is long enough for windows of 5,000 tokens"):
        plan_windows(test.doc_offsets, 5_000)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=VOCAB_SIZE, n_layer=1, n_head=2, d_model=16, max_seq_len=1000, pe="pope")
    run = tmp_path / "run"
    save_checkpoint(
        run / "checkpoints" / "last",
        model_state=GPT(config).state_dict(),
        model_config=config.to_dict(),
        trainer_state={"step": 0},
    )
    out = tmp_path / "length"
    assert (
        main(
            [
                "eval",
                "length",
                str(run),
                "--data",
                str(dataset.path),
                "--lengths",
                "1000,2000,4000",
                "--batch-size",
                "1",
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    results = json.loads((out / "length.json").read_text())["runs"][0]["results"]
    assert [(r["length"], r["n_targets"], r["n_docs_used"]) for r in results] == [
        (1000, 4_999, 1),
        (2000, 4_999, 1),
        (4000, 4_999, 1),
    ]
    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                "length",
                str(run),
                "--data",
                str(dataset.path),
                "--lengths",
                "5000",
                "--out",
                str(tmp_path / "too-long"),
                "--device",
                "cpu",
            ]
        )
        != 0
    )
    error = capsys.readouterr().err
    assert "the longest has 5,000 tokens" in error and "one whole region each" in error


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
    assert train.document_lengths().tolist() == [1170, 8]  # one per chunk: 1166 six-mers + 4 singles; 4 N + 4
    assert detokenize(np.asarray(dataset.split("valid").tokens)) == "GGGGGGA"


def test_ambiguity_codes_only_as_n_when_asked(tmp_path):
    path = tmp_path / "iupac.fa"
    path.write_text(">chr3\nACGTACGTRYACGT\nacgtnM\n")
    with pytest.raises(ValueError, match=r"line 2, column 9: letter 'R'.*--ambiguous-as-n"):
        list(read_fasta_regions(path))
    counts = {}
    sequence = b"".join(b for _, _, b in read_fasta_regions(path, ambiguous_as_n=True, counts=counts))
    assert sequence == b"ACGTACGTNNACGTACGTNN" and counts["ambiguous_as_n"] == 3
