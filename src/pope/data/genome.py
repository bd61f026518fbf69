"""DNA: FASTA (plain or gzip) -> Nucleotide-Transformer-style tokens, one document per region, split by region.

Tokenisation (non-overlapping 6-mers with single-nucleotide fallback, as in the Nucleotide
Transformer): the sequence is read left to right; at position i, if the 6 bases i..i+5 are all A/C/G/T
they become one 6-mer token and reading moves on by 6, otherwise base i becomes a single-nucleotide
token (A, C, G, T or N) and reading moves on by 1. So every maximal N-free stretch of length L gives
L // 6 six-mers followed by L % 6 single bases, and every N is its own token. Lower-case (soft-masked)
bases are read as upper case; any other letter (IUPAC codes such as R or Y) is an error naming the
file, line and column.

Vocabulary, 4107 ids (our id layout; the specials are the Nucleotide Transformer's six):
    0..5      <unk> <pad> <mask> <cls> <eos> <bos>        (PAD_TOKEN_ID = 1; none appear in prepared data)
    6..10     single nucleotides A C G T N
    11..4106  the 4096 6-mers, id = 11 + sum_k code(base_k) * 4**(5-k), code A=0 C=1 G=2 T=3
              (so "AAAAAA" = 11, "AAAAAC" = 12, ..., "TTTTTT" = 4106)

Preparation: each FASTA record is cut into regions of `region_bases` (default 1 Mb); every region is
tokenised on its own and written as one document (1 Mb of N-free sequence is 166,670 tokens: 166,666
six-mers and 4 single bases), so `pope eval length`, whose windows never cross a document, can score
windows up to a region's length. Within every run of 20 consecutive regions, the sha256 of the region ids
ranks them: 18 go to train, 1 to valid, 1 to test, so whole regions (never overlapping) make up each split
and valid/test are spread along the genome. Regions whose N fraction exceeds `max_n_fraction` (default
0.5: telomere and centromere gaps) are skipped and listed in the manifest and on stderr.

The manifest's ``pad_id`` is None: the trainer samples random windows of seq_len + 1 tokens from each
split's token stream and evaluates on non-overlapping windows of it (as the paper's genome runs do);
neither reads the document boundaries, so a window may span two regions that follow each other in a split.
The manifest's ``seq_len`` is `window_tokens` (default 1000): the paper's training length, which the genome
presets train at, not a document size. The <pad> id is recorded as ``vocab.pad_token_id``.

The request records ``layout_version`` (LAYOUT_VERSION). Layout 1 (requests without the key) cut every
region into documents of at most `window_tokens` tokens; its split token streams (the .bin files) are the
same bytes as layout 2's, only the document offsets differ. A prepare over a dataset of an older layout
rebuilds it (pope.data.writer.reuse_if_prepared).
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from pope.data.offline import source_path
from pope.data.prepared import PreparedDataset, check_max_docs, file_fingerprint, split_counts, stable_order_key, warn
from pope.data.writer import PreparedWriter, reuse_if_prepared
from pope.optional import require

SPECIAL_TOKENS = ("<unk>", "<pad>", "<mask>", "<cls>", "<eos>", "<bos>")
PAD_TOKEN_ID = SPECIAL_TOKENS.index("<pad>")
SINGLE_BASES = "ACGTN"
SINGLE_OFFSET = len(SPECIAL_TOKENS)  # 6
KMER = 6
N_KMERS = 4**KMER  # 4096
KMER_OFFSET = SINGLE_OFFSET + len(SINGLE_BASES)  # 11
VOCAB_SIZE = KMER_OFFSET + N_KMERS  # 4107
WINDOW_TOKENS = 1000  # the manifest's seq_len: the training window, not a document size
LAYOUT_VERSION = 2  # 1 (no key): documents of <= 1000 tokens; 2: one document per region / HF chunk
DEFAULT_REGION_BASES = 1_000_000
REGIONS_PER_BLOCK = 20  # 18 train + 1 valid + 1 test
SPLIT_FRACTIONS = (0.9, 0.05, 0.05)

# byte -> code: A C G T = 0..3, N = 4 (either case), anything else = 255 (invalid)
_CODE_OF_BYTE = np.full(256, 255, dtype=np.uint8)
for _code, _base in enumerate(SINGLE_BASES):
    _CODE_OF_BYTE[ord(_base)] = _code
    _CODE_OF_BYTE[ord(_base.lower())] = _code
_VALID_LETTERS = b"ACGTNacgtn"
AMBIGUOUS_LETTERS = b"RYKMSWBDHVUrykmswbdhvu"  # IUPAC codes (and U): N only with ambiguous_as_n=True
_AMBIGUOUS_TO_N = bytes.maketrans(AMBIGUOUS_LETTERS, b"N" * len(AMBIGUOUS_LETTERS))


def vocabulary() -> list[str]:
    kmers = ["".join(letters) for letters in itertools.product("ACGT", repeat=KMER)]
    return list(SPECIAL_TOKENS) + list(SINGLE_BASES) + kmers


def sequence_codes(sequence: str | bytes | bytearray) -> np.ndarray:
    """DNA letters -> uint8 codes (A C G T N = 0..4); ValueError naming the first non-ACGTN letter."""
    raw = sequence.encode("ascii", errors="replace") if isinstance(sequence, str) else bytes(sequence)
    codes = _CODE_OF_BYTE[np.frombuffer(raw, dtype=np.uint8)]
    if (codes == 255).any():
        position = int(np.flatnonzero(codes == 255)[0])
        raise ValueError(f"letter {chr(raw[position])!r} at position {position} is not A, C, G, T or N")
    return codes


def tokenize_codes(codes: np.ndarray) -> np.ndarray:
    """(n,) base codes (A C G T N = 0..4) -> (m,) int64 token ids by the greedy 6-mer rule above."""
    codes = np.asarray(codes, dtype=np.uint8)
    n = codes.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    index = np.arange(n)
    acgt = codes < 4
    before = np.concatenate([[False], acgt[:-1]])
    after = np.concatenate([acgt[1:], [False]])
    run_start = acgt & ~before  # first base of each maximal N-free stretch
    run_end = acgt & ~after  # last base of it
    start_of_run = np.maximum.accumulate(np.where(run_start, index, 0))  # (n,) start of the stretch at i
    run_lengths = np.flatnonzero(run_end) - np.flatnonzero(run_start) + 1
    run_id = np.cumsum(run_start) - 1
    length_here = np.where(acgt, run_lengths[np.clip(run_id, 0, None)] if run_lengths.size else 0, 0)
    offset_in_run = index - start_of_run
    covered_by_kmer = acgt & (offset_in_run < (length_here // KMER) * KMER)
    kmer_start = covered_by_kmer & (offset_in_run % KMER == 0)
    emits = kmer_start | ~covered_by_kmer  # one token per 6-mer start and per leftover/N base
    # 6-mer value at every start: sum_k code[i+k] * 4**(5-k) over a zero-padded copy
    padded = np.concatenate([codes, np.zeros(KMER, dtype=np.uint8)]).astype(np.int64)
    starts = np.flatnonzero(kmer_start)
    kmer_value = np.zeros(starts.shape[0], dtype=np.int64)
    for k in range(KMER):
        kmer_value = kmer_value * 4 + padded[starts + k]
    tokens = np.empty(n, dtype=np.int64)
    tokens[starts] = KMER_OFFSET + kmer_value
    singles = ~covered_by_kmer
    tokens[singles] = SINGLE_OFFSET + codes[singles]
    return tokens[emits]


def tokenize(sequence: str | bytes) -> np.ndarray:
    """DNA string -> token ids (see module docstring)."""
    return tokenize_codes(sequence_codes(sequence))


def detokenize(tokens: np.ndarray | list[int]) -> str:
    """Token ids -> DNA string (upper case); ValueError on special tokens or ids out of range."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.size and (tokens.min() < SINGLE_OFFSET or tokens.max() >= VOCAB_SIZE):
        position = int(np.flatnonzero((tokens < SINGLE_OFFSET) | (tokens >= VOCAB_SIZE))[0])
        raise ValueError(f"token {int(tokens[position])} at position {position} is not a nucleotide or 6-mer")
    letters = np.frombuffer(b"ACGTN", dtype=np.uint8)
    is_kmer = tokens >= KMER_OFFSET
    lengths = np.where(is_kmer, KMER, 1)
    out = np.empty(int(lengths.sum()), dtype=np.uint8)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    out[starts[~is_kmer]] = letters[tokens[~is_kmer] - SINGLE_OFFSET]
    kmer_values = tokens[is_kmer] - KMER_OFFSET
    kmer_starts = starts[is_kmer]
    for k in range(KMER):
        out[kmer_starts + k] = letters[(kmer_values >> (2 * (KMER - 1 - k))) & 3]
    return out.tobytes().decode("ascii")


# ---------------------------------------------------------------------------------------------- FASTA
def _open_fasta(path: Path):
    with open(path, "rb") as handle:
        magic = handle.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def read_fasta_regions(
    path: str | os.PathLike,
    region_bases: int = DEFAULT_REGION_BASES,
    max_bases: int | None = None,
    ambiguous_as_n: bool = False,
    counts: dict[str, int] | None = None,
) -> Iterator[tuple[str, int, bytes]]:
    """Yield (record_name, start, upper-case bases) regions of at most region_bases per record.

    Validates as it reads: a clear ValueError names the file and line for a malformed header, data
    before the first header, a non-ACGTN letter (with its column) or a truncated/corrupt gzip stream.
    Stops after `max_bases` bases in all when given (an explicit cap, recorded by the caller).
    With `ambiguous_as_n`, IUPAC ambiguity codes (R, Y, K, M, S, W, B, D, H, V) and U are read as N
    and counted in ``counts["ambiguous_as_n"]`` (GRCh38 has a handful); otherwise they are an error.
    """
    counts = counts if counts is not None else {}
    counts.setdefault("ambiguous_as_n", 0)
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"FASTA file {path} does not exist")
    if region_bases <= 0:
        raise ValueError(f"region_bases must be positive, got {region_bases}")
    record: str | None = None
    buffer = bytearray()
    start = total = 0
    line_number = 0
    seen_records: set[str] = set()
    try:
        with _open_fasta(path) as handle:
            for line_number, line in enumerate(handle, start=1):
                line = line.rstrip(b"\r\n")
                if line.startswith(b">"):
                    if record is not None and buffer:
                        yield record, start, bytes(buffer)
                    header = line[1:].decode("ascii", errors="replace").strip()
                    name = header.split()[0] if header else ""
                    if not name:
                        raise ValueError(f"{path}, line {line_number}: FASTA header {line[:60]!r} has no sequence name")
                    if name in seen_records:
                        raise ValueError(f"{path}, line {line_number}: record name {name!r} appears twice")
                    seen_records.add(name)
                    record, buffer, start = name, bytearray(), 0
                    continue
                if not line or line.startswith(b";"):
                    continue  # blank lines and old-style comments
                if record is None:
                    raise ValueError(
                        f"{path}, line {line_number}: sequence data before the first '>' header (is this a FASTA file?)"
                    )
                if ambiguous_as_n and line.translate(None, _VALID_LETTERS):
                    cleaned = line.translate(_AMBIGUOUS_TO_N)
                    counts["ambiguous_as_n"] += sum(a != b for a, b in zip(line, cleaned))
                    line = cleaned
                if line.translate(None, _VALID_LETTERS):
                    column = next(i for i, byte in enumerate(line) if byte not in _VALID_LETTERS)
                    hint = (
                        " (an IUPAC ambiguity code: pass --ambiguous-as-n to read it as N)"
                        if line[column] in AMBIGUOUS_LETTERS
                        else ""
                    )
                    raise ValueError(
                        f"{path}, line {line_number}, column {column + 1}: letter "
                        f"{chr(line[column])!r} in record {record!r} is not A, C, G, T or N{hint}"
                    )
                if max_bases is not None and total + len(line) > max_bases:
                    line = line[: max_bases - total]
                buffer += line.upper()
                total += len(line)
                while len(buffer) >= region_bases:
                    yield record, start, bytes(buffer[:region_bases])
                    del buffer[:region_bases]
                    start += region_bases
                if max_bases is not None and total >= max_bases:
                    break
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise ValueError(
            f"{path}: the gzip stream is truncated or corrupt after line {line_number} "
            f"({type(err).__name__}: {err}); download the file again"
        ) from err
    if record is None:
        raise ValueError(f"{path}: no FASTA record found (expected a '>' header line)")
    if buffer:
        yield record, start, bytes(buffer)


def _assign_block(region_ids: list[str]) -> dict[str, str]:
    """18/1/1 of a block of 20 regions by sha256 rank; a block of fewer than 3 regions goes to train."""
    ranked = sorted(region_ids, key=stable_order_key)
    if len(ranked) < 3:
        return {region: "train" for region in ranked}
    n_train, n_valid, _ = split_counts(len(ranked), SPLIT_FRACTIONS)
    return {
        region: "train" if rank < n_train else "valid" if rank < n_train + n_valid else "test"
        for rank, region in enumerate(ranked)
    }


def prepare_genome(
    out_dir: str | os.PathLike,
    *,
    source: str | os.PathLike | None = None,
    force: bool = False,
    progress: bool = True,
    region_bases: int = DEFAULT_REGION_BASES,
    max_bases: int | None = None,
    max_n_fraction: float = 0.5,
    window_tokens: int = WINDOW_TOKENS,
    ambiguous_as_n: bool = False,
) -> PreparedDataset:
    """Write the prepared "genome" dataset from a FASTA file (default: the offline human chrX)."""
    if source is None:
        fasta = source_path("chrx") / "hs37chrXtrunc.fa.gz"
        description = "human chrX, GRCh37 (NC_000023.10, first 69,999,930 bp), Debian smalt-examples 0.7.6-12"
    else:
        fasta = Path(source).expanduser().absolute()
        if fasta.is_dir():
            raise ValueError(f"FASTA source {fasta} is a directory; pass the FASTA file itself (plain or gzip)")
        if not fasta.is_file():
            raise FileNotFoundError(f"FASTA source {fasta} does not exist (plain or gzip FASTA expected)")
        description = f"FASTA file {fasta.name}"
    if not 0.0 <= max_n_fraction <= 1.0:
        raise ValueError(f"max_n_fraction must lie in [0, 1], got {max_n_fraction}")
    if max_bases is not None and max_bases <= 0:
        raise ValueError(f"max_bases must be positive (or None for the whole file), got {max_bases}")
    request = {
        "dataset": "genome",
        "path": str(fasta),
        "fingerprint": file_fingerprint([fasta]),
        "region_bases": region_bases,
        "max_bases": max_bases,
        "max_n_fraction": max_n_fraction,
        "window_tokens": window_tokens,
        "ambiguous_as_n": ambiguous_as_n,
        "tokenizer_version": 1,
        "layout_version": LAYOUT_VERSION,
    }
    existing = reuse_if_prepared(out_dir, request, force=force)
    if existing is not None:
        return existing

    reader_counts: dict[str, int] = {}
    skipped: list[dict[str, Any]] = []
    regions_by_split: dict[str, list[str]] = {"train": [], "valid": [], "test": []}
    bases_read = n_bases_in_splits = 0
    block: list[tuple[str, np.ndarray]] = []
    bar = tqdm(desc="genome", unit="bp", unit_scale=True, disable=not progress, total=max_bases)
    with PreparedWriter(out_dir, VOCAB_SIZE, force=force) as writer:

        def flush_block() -> None:
            assignment = _assign_block([region_id for region_id, _ in block])
            for region_id, tokens in block:
                split = assignment[region_id]
                regions_by_split[split].append(region_id)
                writer.add_document(split, tokens)  # the whole region: one document
            block.clear()

        for record, start, bases in read_fasta_regions(fasta, region_bases, max_bases, ambiguous_as_n, reader_counts):
            bar.update(len(bases))
            bases_read += len(bases)
            region_id = f"{record}:{start}-{start + len(bases)}"
            codes = _CODE_OF_BYTE[np.frombuffer(bases, dtype=np.uint8)]  # validated while reading
            n_fraction = float((codes == 4).mean())
            if n_fraction > max_n_fraction:
                skipped.append({"region": region_id, "n_fraction": round(n_fraction, 4)})
                continue
            n_bases_in_splits += len(bases)
            block.append((region_id, tokenize_codes(codes)))
            if len(block) == REGIONS_PER_BLOCK:
                flush_block()
        if block:
            flush_block()
        bar.close()
        if skipped:
            warn(
                f"skipped {len(skipped)} region(s) of {region_bases} bp with more than {max_n_fraction:.0%} N "
                f"(listed in the manifest): {', '.join(s['region'] for s in skipped[:5])}"
                f"{' ...' if len(skipped) > 5 else ''}"
            )
        if writer.n_tokens("valid") == 0 or writer.n_tokens("test") == 0:
            raise ValueError(
                f"{fasta}: too little sequence for train/valid/test regions "
                f"({sum(map(len, regions_by_split.values()))} usable region(s) of {region_bases} bp); "
                "use a smaller --region-bases"
            )
        return writer.finish(
            {
                "name": "genome",
                "vocab": {
                    "tokens": vocabulary(),
                    "pad_id": None,
                    "pad_token_id": PAD_TOKEN_ID,
                    "encoding": "non-overlapping 6-mers (ids 11..4106) with single-nucleotide fallback "
                    "(A C G T N = 6..10) for N and for the < 6 bases before an N or a region end; "
                    "specials 0..5 = <unk> <pad> <mask> <cls> <eos> <bos>",
                },
                "seq_len": window_tokens,
                "request": request,
                "source": {
                    "description": description,
                    "path": str(fasta),
                    "sha256": hashlib.sha256(fasta.read_bytes()).hexdigest(),
                },
                "train_transform": None,
                "stats": {
                    "bases_read": bases_read,
                    "bases_in_splits": n_bases_in_splits,
                    "ambiguous_letters_read_as_n": reader_counts.get("ambiguous_as_n", 0),
                    "max_bases_cap": max_bases,
                    "regions_per_split": {k: len(v) for k, v in regions_by_split.items()},
                    "regions": regions_by_split,
                    "regions_skipped_for_n": skipped,
                    "region_bases": region_bases,
                    "documents_are": "one whole region each (tokenised on its own)",
                },
            }
        )


def prepare_genome_hf(
    out_dir: str | os.PathLike,
    *,
    dataset_id: str = "InstaDeepAI/human_reference_genome",
    config: str = "6kbp",
    force: bool = False,
    progress: bool = True,
    max_docs: int | None = None,
    window_tokens: int = WINDOW_TOKENS,
) -> PreparedDataset:
    """Prepare from the HF human reference genome (needs internet): its train/validation/test chunks are
    tokenised as they stream and each chunk is one document (a chunk of the 6kbp config is about 1,000
    tokens, so `pope eval length` on this data reaches about that length; the FASTA preparation has whole
    regions). The manifest's ``seq_len`` is `window_tokens`, as in :func:`prepare_genome`."""
    check_max_docs(max_docs)
    datasets = require("datasets", purpose="Hugging Face dataset loading")
    request = {
        "dataset": "genome",
        "hf": dataset_id,
        "config": config,
        "max_docs": max_docs,
        "window_tokens": window_tokens,
        "tokenizer_version": 1,
        "layout_version": LAYOUT_VERSION,
    }
    existing = reuse_if_prepared(out_dir, request, force=force)
    if existing is not None:
        return existing
    with PreparedWriter(out_dir, VOCAB_SIZE, force=force) as writer:
        for hf_split, split in (("train", "train"), ("validation", "valid"), ("test", "test")):
            stream = datasets.load_dataset(dataset_id, config, split=hf_split, streaming=True, trust_remote_code=True)
            for index, example in enumerate(tqdm(stream, desc=f"genome {split}", disable=not progress)):
                if max_docs is not None and index >= max_docs:
                    break
                try:
                    tokens = tokenize(example["sequence"])
                except ValueError as err:
                    raise ValueError(f"{dataset_id} {hf_split} example {index}: {err}") from err
                writer.add_document(split, tokens)  # the whole chunk: one document
        return writer.finish(
            {
                "name": "genome",
                "vocab": {"tokens": vocabulary(), "pad_id": None, "pad_token_id": PAD_TOKEN_ID},
                "seq_len": window_tokens,
                "request": request,
                "source": {
                    "description": f"HF dataset {dataset_id} ({config}), its own splits",
                    "libraries": {"datasets": datasets.__version__},
                },
                "train_transform": None,
            }
        )
