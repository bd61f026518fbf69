"""Bookkeeping the benchmark scripts share: the provenance columns of every result row (GPU, torch and Triton
versions, commit, date), append_csv (rows appended to a result CSV, its header widened when a benchmark gains a
column), read_csv_rows (a result CSV read back with its numeric columns as numbers) and printed_to (for benchmarks
whose result is what they print: stdout also written to a file under --out).

Imported, from this directory, by attention.py, launch_overhead.py, launcher_host_time.py, train_step_owt.py and
scaling.py; not a script of its own.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import os
import sys


def provenance() -> dict:
    """The benchmark CSVs' provenance columns (commit from git, or POPE_GIT_COMMIT on a copy without .git). The
    "gpu" column names the CUDA device, or the CPU where there is none (benchmarks of host time run there)."""
    import torch

    from pope.provenance import commit_label, device_name, library_versions

    versions = library_versions()
    return {
        "gpu": device_name("cuda" if torch.cuda.is_available() else "cpu"),
        "torch": versions["torch"],
        "triton": versions["triton"],
        "commit": commit_label() or "unknown",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def append_csv(path, rows, meta):
    """Append rows (each with the provenance columns ``meta``) to the CSV at path. A file whose header lacks a
    column of the new rows is rewritten first with the union of the columns (earlier rows keep their values and
    leave the new columns empty), so a benchmark that gains a column never writes rows under the wrong header."""
    fields = list(meta) + [key for key in rows[0] if key not in meta]
    if os.path.exists(path):
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header, earlier = list(reader.fieldnames or []), list(reader)
        missing = [field for field in fields if field not in header]
        if missing:
            header += missing
            with open(path + ".partial", "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=header)
                writer.writeheader()
                writer.writerows(earlier)
            os.replace(path + ".partial", path)  # the earlier rows are never half-written
        fields = header
    else:
        with open(path, "w", newline="") as f:
            csv.DictWriter(f, fieldnames=fields).writeheader()
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        for row in rows:
            writer.writerow({**meta, **row})


class _Tee:
    """A text stream that writes to several (the terminal and a file)."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self):
        for stream in self.streams:
            stream.flush()


@contextlib.contextmanager
def printed_to(out_dir, name):
    """For benchmarks whose result is what they print: inside the block, stdout also goes to OUT_DIR/NAME (the
    file is rewritten) with the provenance columns on its first line; out_dir None prints only."""
    if out_dir is None:
        yield
        return
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        f.write("# " + ", ".join(f"{k}={v}" for k, v in provenance().items()) + "\n")
        with contextlib.redirect_stdout(_Tee(sys.stdout, f)):
            yield
    print(f"wrote {path}")


def read_csv_rows(path: str) -> list[dict]:
    """A benchmark CSV's rows with its numeric columns as floats (what targets() and the summaries read)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key, value in row.items():
            if key in ("head_dim", "tokens", "sequences"):
                row[key] = int(value)
            elif key.endswith(("_ms", "_mb", "_tflops", "_per_s")):
                row[key] = float(value)
    return rows
