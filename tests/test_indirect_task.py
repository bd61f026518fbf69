"""The indirect-indexing task generator, file format and splits (pope.data.indirect_indexing)."""

import numpy as np
import pytest

from pope.data import indirect_indexing as task


@pytest.fixture(scope="module")
def lines():
    return task.generate_examples(5000, np.random.default_rng(1))


def test_examples_follow_every_rule(lines):
    shifts, lengths = [], []
    for line in lines:
        example = task.parse_example(line)  # raises on any broken rule
        letters = example.string
        assert len(set(letters)) == len(letters) and 20 <= len(letters) <= 40
        src = letters.index(example.source)
        assert example.shift != 0 and -15 <= example.shift <= 15
        assert example.target == letters[src + example.shift]
        assert example.to_line() == line  # format parses back to the same text
        shifts.append(example.shift)
        lengths.append(len(letters))
    # the whole ranges are used: every non-zero shift and every string length appear
    assert set(shifts) == set(range(-15, 16)) - {0}
    assert set(lengths) == set(range(20, 41))
    assert all(line.split(",")[2][0] in "+-" for line in lines)  # positive shifts carry '+'
    assert max(len(line) for line in lines) <= task.MAX_EXAMPLE_CHARS == 48


@pytest.mark.parametrize(
    "bad, rule",
    [
        ("ABCDEFGHIJKLMNOPQRST,A,+0,A", "not 0"),
        ("ABCDEFGHIJKLMNOPQRST,A,-1,T", "outside"),
        ("ABCDEFGHIJKLMNOPQRST,A,+2,D", "target"),
        ("ABCDEFGHIJKLMNOPQRSA,A,+2,C", "distinct"),
        ("ABCDEFGHIJKLMNOPQRST,A,2,C", "signed"),
        ("ABCDEFGHIJKLMNOPQRST,A,+16,Q", "[-15, +15]"),
        ("ABCDEFGHIJKLMNOPQRS,A,+2,C", "20..40"),
    ],
)
def test_parse_rejects_broken_examples(bad, rule):
    with pytest.raises(ValueError, match=rule.replace("[", r"\[").replace("+", r"\+")):
        task.parse_example(bad)


def test_splits_deterministic_disjoint_and_stable(tmp_path):
    sizes = {"train": 3000, "valid": 300, "test": 300}
    first = task.make_splits(7, sizes)
    assert first == task.make_splits(7, sizes)  # same seed, same data
    assert first["test"] != task.make_splits(8, sizes)["test"]
    strings = {name: {line.split(",")[0] for line in split} for name, split in first.items()}
    assert {name: len(s) for name, s in strings.items()} == sizes  # no string repeats inside a split
    assert not strings["train"] & strings["valid"] and not strings["train"] & strings["test"]
    assert not strings["valid"] & strings["test"]
    # held-out sets do not depend on the training-set size
    assert task.make_splits(7, {"train": 10, "valid": 300, "test": 300})["test"] == first["test"]


def test_files_round_trip_and_encoding(tmp_path):
    directory = task.write_splits(tmp_path / "ii", seed=3, sizes={"train": 500, "valid": 50, "test": 50})
    lines = (directory / "test.txt").read_text().splitlines()
    assert task.validate_file(directory / "test.txt") == 50
    encoded = task.load_split(directory, "test")
    assert encoded.inputs.shape == (50, task.SEQ_LEN) == encoded.targets.shape
    for row, line in enumerate(lines):
        ids = [task.CHARACTERS.index(c) for c in line]
        scored = np.flatnonzero(encoded.targets[row] != -100)
        assert list(scored) == [len(line) - 2]  # one scored position: the final ','
        assert encoded.targets[row, len(line) - 2] == ids[-1]  # predicting the target letter
        assert list(encoded.inputs[row, : len(line) - 1]) == ids[:-1]
        assert (encoded.inputs[row, len(line) - 1 :] == task.PAD_ID).all()
    # ensure_splits refuses to reuse a directory made with other settings
    with pytest.raises(ValueError, match="seed"):
        task.ensure_splits(directory, seed=4, sizes={"train": 500, "valid": 50, "test": 50})
    # a corrupted split is detected by its checksum
    (directory / "valid.txt").write_text((directory / "valid.txt").read_text().replace("A", "B", 1))
    with pytest.raises(ValueError, match="checksum"):
        task.load_split(directory, "valid")


def test_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="write_splits"):
        task.load_file(tmp_path / "missing.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("ABCDEFGHIJKLMNOPQRST,A,+2,C\nABCDEFGHIJKLMNOPQRST;A,+2,C\n")
    with pytest.raises(ValueError, match="line 2"):
        task.load_file(bad)
    bad.write_text("too short\n")
    with pytest.raises(ValueError, match="line 1"):
        task.load_file(bad)


def test_paper_task_is_unchanged_bit_for_bit():
    """The generator with default options draws exactly what it drew before the task variants existed
    (hash of the splits recorded from the generator without options)."""
    import hashlib

    splits = task.make_splits(3, {"train": 3000, "valid": 200, "test": 200})
    assert (
        hashlib.sha256(repr(sorted(splits.items())).encode()).hexdigest()
        == "0c0f83ce853c672e8b70bac9c449e847a3a2e024266e83e7a1ad923195458349"
    )
    assert splits == task.make_splits(3, {"train": 3000, "valid": 200, "test": 200}, task.TaskOptions())
    assert task.default_data_dir(0).name == "indirect-indexing-seed0"


def test_task_variants_follow_their_rules(tmp_path):
    options = task.parse_task_spec("indirect-indexing:min_len=20,max_len=32,zero_shift=true")
    assert options == task.TaskOptions(min_len=20, max_len=32, zero_shift=True)
    lines = task.generate_examples(5000, np.random.default_rng(1), options=options)
    examples = [task.parse_example(line, options) for line in lines]
    assert {len(e.string) for e in examples} == set(range(20, 33))
    assert {e.shift for e in examples} == set(range(-15, 16))  # 0 included
    zero = [e for e in examples if e.shift == 0]
    assert zero and all(e.target == e.source for e in zero) and zero[0].to_line().split(",")[2] == "+0"
    with pytest.raises(ValueError, match="not 0"):  # the paper's rules refuse shift 0
        task.parse_example(zero[0].to_line())
    # the variant's splits live in their own directory and its manifest says which variant they are
    assert task.default_data_dir(0, options).name == "indirect-indexing-seed0-len20-32-shift0"
    assert (
        task.default_data_dir(0, task.parse_task_spec("indirect-indexing:fresh=true")).name == "indirect-indexing-seed0"
    )  # fresh draws training examples differently, not other splits
    sizes = {"train": 300, "valid": 50, "test": 50}
    directory = task.ensure_splits(tmp_path / "v", seed=0, sizes=sizes, options=options)
    assert task.validate_file(directory / "test.txt", options) == 50
    with pytest.raises(ValueError, match="task"):
        task.ensure_splits(directory, seed=0, sizes=sizes)  # the paper's task asked of a variant's directory
    encoded = task.load_split(directory, "test")
    assert ((encoded.targets != -100).sum(axis=1) == 1).all()


def test_query_first_variant_reorders_the_same_draws(tmp_path):
    """query_first=true writes <source>,<shift>,<string>,<target>: the same draws as the paper's order (the same
    examples, fields reordered), its own splits, parsed only as that order; shifts_of_file reads both orders."""
    options = task.parse_task_spec("indirect-indexing:query_first=true")
    assert options == task.TaskOptions(query_first=True)
    paper = task.generate_examples(2000, np.random.default_rng(4))
    query_first = task.generate_examples(2000, np.random.default_rng(4), options=options)
    reordered = [",".join((f[1], f[2], f[0], f[3])) for f in (line.split(",") for line in paper)]
    assert query_first == reordered
    examples = [task.parse_example(line, options) for line in query_first]
    assert [e.to_line() for e in examples] == paper and [e.to_line(options) for e in examples] == query_first
    with pytest.raises(ValueError, match="query-first .* but the task asks for the paper order"):
        task.parse_example(query_first[0])
    with pytest.raises(ValueError, match="paper's order, but the task asks for query_first=true"):
        task.parse_example(paper[0], options)
    assert task.default_data_dir(0, options).name == "indirect-indexing-seed0-query-first"
    sizes = {"train": 300, "valid": 50, "test": 50}
    directory = task.ensure_splits(tmp_path / "q", seed=0, sizes=sizes, options=options)
    assert task.validate_file(directory / "test.txt", options) == 50
    assert task.split_task_options(__import__("json").loads((directory / "manifest.json").read_text())) == options
    with pytest.raises(ValueError, match="task"):
        task.ensure_splits(directory, seed=0, sizes=sizes)  # the paper's task asked of the variant's directory
    lines = (directory / "test.txt").read_text().splitlines()
    assert task.shifts_of_file(directory / "test.txt").tolist() == [int(line.split(",")[1]) for line in lines]
    encoded = task.load_split(directory, "test")  # the target is still the last character, after the last ','
    assert [task.CHARACTERS[int(t[t != -100][0])] for t in encoded.targets] == [line[-1] for line in lines]
    # strings are told apart in either order: no held-out string comes back among fresh examples
    held_out = {line.split(",")[2] for line in query_first[:100]}
    fresh = task.fresh_examples(200, np.random.default_rng(4), options, held_out)
    strings = {"".join(task.CHARACTERS[i] for i in row if i != task.PAD_ID).split(",")[2] for row in fresh.inputs}
    assert len(fresh) == 200 and len(strings) == 200 and not strings & held_out


@pytest.mark.parametrize(
    "spec, message",
    [
        ("indirect-indexing:max_len=41", "max_len <= 40"),
        ("indirect-indexing:min_len=33,max_len=32", "min_len <= max_len"),
        ("indirect-indexing:fresh=maybe", "true or false"),
        ("indirect-indexing:shift0=true", "OPTION one of"),
        ("indirect-indexing:min_len=x", "integer"),
        ("jsb:fresh=true", "not an indirect-indexing"),
    ],
)
def test_bad_task_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        task.parse_task_spec(spec)


def test_fresh_examples_avoid_held_out_strings():
    options = task.TaskOptions(fresh=True)
    first = task.fresh_examples(200, np.random.default_rng(5), options)
    lines = task.generate_examples(200, np.random.default_rng(5), options=options)
    held_out = {line.split(",", 1)[0] for line in lines[:100]}
    again = task.fresh_examples(200, np.random.default_rng(5), options, held_out)
    assert np.array_equal(first.inputs[100:], again.inputs[:100])  # the held-out ones were redrawn
    letters = {
        "".join(task.CHARACTERS[i] for i in row[: row.tolist().index(task.CHARACTERS.index(","))])
        for row in again.inputs
    }
    assert not letters & held_out
