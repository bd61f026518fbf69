"""`pope data prepare NAME [--source PATH] [--out DIR]`, `pope data info DIR|NAME`, `pope data offline ...`."""

from __future__ import annotations

import argparse
import json
import sys
import time

from pope.cli.arguments import positive_int


def register(subparsers) -> None:
    from pope.data.registry import ALIASES, BUILDERS

    names = sorted(set(BUILDERS) | set(ALIASES))
    data = subparsers.add_parser(
        "data",
        help="prepare and inspect datasets",
        description="Prepare datasets into the on-disk format the trainer reads.",
    )
    commands = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    data.set_defaults(func=lambda args: (data.print_help(), 2)[1])

    prepare = commands.add_parser(
        "prepare",
        help="tokenise a dataset into $POPE_DATA_DIR/NAME (or --out)",
        description="Tokenise a dataset. Without --source the offline source is used "
        "(jsb, maestro, genome, text) or the HF hub (openwebtext, pg19, "
        "genome-hf). A second call verifies the checksums and reuses the data.",
    )
    prepare.add_argument("name", choices=names, metavar="NAME", help=f"one of: {', '.join(names)}")
    prepare.add_argument(
        "--source",
        help="input: JSON file (jsb), MIDI directory (maestro), FASTA file (genome), "
        ".txt directory (text), HF dataset id (openwebtext, pg19, genome-hf)",
    )
    prepare.add_argument("--out", help="output directory (default: $POPE_DATA_DIR/NAME, i.e. ~/.cache/pope/data/NAME)")
    prepare.add_argument("--force", action="store_true", help="rebuild even if a matching dataset exists")
    prepare.add_argument("--no-progress", action="store_true", help="no progress bars")
    genome = prepare.add_argument_group("genome options")
    genome.add_argument(
        "--max-bases", type=positive_int, help="read at most this many bases (default: the whole FASTA)"
    )
    genome.add_argument("--region-bases", type=positive_int, help="region size for the split (default 1,000,000)")
    genome.add_argument("--max-n-fraction", type=float, help="skip regions with more N than this (default 0.5)")
    genome.add_argument(
        "--ambiguous-as-n",
        action="store_true",
        default=None,
        help="read IUPAC ambiguity codes (R, Y, ...) as N instead of failing",
    )
    hub = prepare.add_argument_group("HF hub options (openwebtext, pg19, genome-hf)")
    hub.add_argument("--max-docs", type=positive_int, help="stop after this many documents per split (default: all)")
    prepare.set_defaults(func=_prepare)

    info = commands.add_parser("info", help="print a prepared dataset's manifest summary")
    info.add_argument("path", metavar="DIR|NAME", help="prepared dataset directory or name")
    info.add_argument("--json", action="store_true", help="print the whole manifest as JSON")
    info.add_argument("--verify", action="store_true", help="re-hash every file against the manifest")
    info.set_defaults(func=_info)

    from pope.data.offline import ALL_NAMES

    offline = commands.add_parser(
        "offline",
        help="fetch or check the offline real-data sources ($POPE_CACHE)",
        description="The pinned offline sources the default prepares read "
        "(pope.data.offline): fetch them, or show which are ok, MISSING or "
        "MODIFIED (files differ from their pinned sha256).",
    )
    offline_commands = offline.add_subparsers(dest="offline_command", metavar="ACTION")
    offline.set_defaults(func=lambda args: (offline.print_help(), 2)[1])
    fetch = offline_commands.add_parser("fetch", help="download/extract the sources (a good copy is kept)")
    fetch.add_argument(
        "--only", nargs="+", metavar="NAME", choices=ALL_NAMES, help=f"fetch only these ({', '.join(ALL_NAMES)})"
    )
    fetch.set_defaults(func=lambda args: _offline("fetch", args.only))
    offline_commands.add_parser("status", help="show each source: ok, MISSING or MODIFIED").set_defaults(
        func=lambda args: _offline("status", None)
    )


def _offline(action: str, only: list[str] | None) -> int:
    from pope.data import offline

    if action == "fetch":
        offline.fetch(only)
        return 0
    return offline.status()


def _prepare(args: argparse.Namespace) -> int:
    from pope.data.registry import canonical_name, prepare

    canonical = canonical_name(args.name)
    options = {}
    allowed = {
        "genome": ("max_bases", "region_bases", "max_n_fraction", "ambiguous_as_n"),
        "openwebtext": ("max_docs",),
        "pg19": ("max_docs",),
        "genome-hf": ("max_docs",),
    }.get(canonical, ())
    for option in ("max_bases", "region_bases", "max_n_fraction", "ambiguous_as_n", "max_docs"):
        value = getattr(args, option)
        if value is None:
            continue
        if option not in allowed:
            raise ValueError(f"--{option.replace('_', '-')} does not apply to dataset {canonical!r}")
        options[option] = value
    start = time.perf_counter()
    try:
        dataset = prepare(
            canonical, out_dir=args.out, source=args.source, force=args.force, progress=not args.no_progress, **options
        )
    except ImportError as err:  # a missing optional extra: one clear line naming it
        raise RuntimeError(str(err)) from err
    elapsed = time.perf_counter() - start
    print(_summary(dataset))
    print(f"{'verified and reused' if dataset.reused else 'prepared'} in {elapsed:.1f} s: {dataset.path}")
    return 0


def _summary(dataset) -> str:
    manifest = dataset.manifest
    lines = [
        f"dataset {manifest['name']} at {dataset.path}",
        f"  vocab {dataset.vocab_size} ({manifest['dtype']}), pad_id {dataset.pad_id}, seq_len {dataset.seq_len}",
        f"  source: {manifest['source'].get('description')}",
    ]
    libraries = manifest["source"].get("libraries") or {}
    if libraries:
        lines.append("  libraries: " + ", ".join(f"{k} {v}" for k, v in libraries.items()))
    for split, info in manifest["splits"].items():
        lines.append(f"  {split:6s} {info['n_tokens']:>12,d} tokens  {info['n_docs']:>8,d} documents")
    if manifest.get("train_transform"):
        lines.append(f"  train transform: {manifest['train_transform']}")
    skipped = manifest.get("skipped_files") or (manifest.get("stats") or {}).get("skipped_files") or []
    if skipped:
        lines.append(f"  skipped files: {len(skipped)} (see manifest.json)")
    lines.append(
        f"  created {manifest['created_utc']} by pope {manifest['pope_version']}, complete: {manifest['complete']}"
    )
    return "\n".join(lines)


def _info(args: argparse.Namespace) -> int:
    from pope.data.prepared import resolve_dataset

    dataset = resolve_dataset(args.path)
    if args.verify:
        dataset.verify()
    if args.json:
        json.dump(dataset.manifest, sys.stdout, indent=1)
        print()
    else:
        print(_summary(dataset))
        if args.verify:
            print("  checksums: all files match")
    return 0
