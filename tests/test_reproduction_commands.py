"""The commands of results/REPRODUCTION.md for the rows not run, each run on a tiny model on CPU, and the
argument handling of scripts/gpu_reproduce.sh.

Every ```bash block of REPRODUCTION.md is read, and each `pope ...` line run in order through pope.cli.main
with the preset swapped for its `*-tiny` version, two training steps, `--seeds S --out D` as the one seed
`--seed 0 --out D/seed-0` in this process (what a sweep runs per seed), lengths and contexts divided by 64,
and small prepared stand-ins for the data this machine cannot fetch (OpenWebText / PG-19: random tokens of a
512-token vocabulary, the owt models' vocab_size set to match, as GPT-2's 50257-wide output layer made most of
the CPU time; MAESTRO: random documents; indirect indexing: small generated splits). The downstream commands
(a ```text block) are not run: lm-eval's task data come from the HF hub.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pope import cli
from pope.data import indirect_indexing as task
from pope.data.writer import PreparedWriter

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "indirect-indexing": "indirect-indexing-tiny",
    "maestro": "maestro-tiny",
    "owt-124m": "owt-tiny",
    "owt-253m": "owt-tiny",
    "owt-774m": "owt-tiny",
}
SCALE = 64  # lengths and contexts: 1024 -> 16
TEXT_VOCAB = 512  # the OpenWebText / PG-19 stand-in's vocabulary (module docstring)


def reproduction_commands() -> list[list[str]]:
    text = (ROOT / "results" / "REPRODUCTION.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [shlex.split(line) for block in blocks for line in block.splitlines() if line.startswith("pope ")]


def _write(out_dir: Path, vocab: int, docs: dict, pad_id):
    rng = np.random.default_rng(0)
    with PreparedWriter(out_dir, vocab) as writer:
        for split, lengths in docs.items():
            for n in lengths:
                writer.add_document(split, rng.integers(1, vocab, n))
        writer.finish(
            {
                "name": out_dir.name,
                "vocab": {"pad_id": pad_id},
                "seq_len": 16,
                "request": {"dataset": out_dir.name},
                "source": {"description": "test"},
                "train_transform": None,
            }
        )
    return out_dir


def _drop_sets(argv: list[str], keys: set[str]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--set" and argv[i + 1].partition("=")[0] in keys:
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def tiny_command(argv: list[str], data: dict[str, Path]) -> list[str]:
    """The CPU version of one REPRODUCTION.md command (see the module docstring)."""
    argv = argv[1:]
    steps = {
        "recipe.max_steps": "2",
        "recipe.warmup_steps": "1",
        "recipe.eval_interval": "2",
        "recipe.eval_batches": "1",
        "train.device": "cpu",
        "train.tensorboard": "false",
        "train.progress": "false",
        "train.log_interval": "1",
    }
    if argv[0] == "train":
        preset = argv[1]
        argv[1] = TINY[preset]
        if "--seeds" in argv:
            i = argv.index("--seeds")
            out = argv[argv.index("--out") + 1]
            argv[i : i + 2] = ["--seed", "0"]
            argv[argv.index("--out") + 1] = f"{out}/seed-0"
        # owt-124m/253m/774m all become owt-tiny: a layer count each keeps them three settings, as the real presets
        # are (pope report refuses two runs of one setting with one seed)
        layers = {"owt-253m": "2", "owt-774m": "3"}.get(preset, "1")
        sets = {**steps, "recipe.batch_size": "4", "model.n_layer": layers, "model.d_model": "32", "model.n_head": "2"}
        if preset.startswith("owt"):
            sets.update(
                {
                    "train.data_dir": str(data["text"]),
                    "recipe.seq_len": "16",
                    "model.max_seq_len": "16",
                    "model.vocab_size": str(TEXT_VOCAB),
                }
            )
        elif preset == "maestro":
            sets["train.data_dir"] = str(data["maestro"])
        else:
            sets["train.data_dir"] = str(data["indirect"])
        argv = _drop_sets(argv, set(sets)) + [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
    elif argv[0] == "finetune":
        i = argv.index("--context")
        argv[i + 1] = str(int(argv[i + 1]) // SCALE)
        argv[argv.index("--steps") + 1] = "2"
        argv += [
            "--batch-size",
            "4",
            "--warmup",
            "1",
            "--set",
            "train.device=cpu",
            "--set",
            "train.tensorboard=false",
            "--set",
            "train.progress=false",
            "--set",
            "recipe.eval_interval=2",
            "--set",
            "recipe.eval_batches=1",
        ]
    elif argv[:2] == ["eval", "length"]:
        i = argv.index("--lengths")
        argv[i + 1] = ",".join(str(int(n) // SCALE) for n in argv[i + 1].split(","))
        argv[argv.index("--data") + 1] = str(data["text"])
        argv += ["--device", "cpu"]
    elif argv[:2] == ["analyze", "frequencies"]:
        argv[argv.index("--data") + 1] = str(data["text"])
    return argv


@pytest.mark.data
def test_reproduction_commands_run_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    commands = reproduction_commands()
    verbs = {" ".join(c[1:3]) if c[1] in ("eval", "analyze") else c[1] for c in commands}
    assert verbs == {"train", "report", "finetune", "eval length", "analyze frequencies"}
    pes = {c[c.index("--pe") + 1] for c in commands if "--pe" in c}
    assert {
        "rope-half",
        "alibi-half",
        "learned-abs",
        "sinusoidal-abs",
        "pope:magnitude=identity",
        "pope:magnitude=relu",
        "pope:use_delta=false",
    } <= pes
    text_docs = {"train": [300] * 4, "valid": [200], "test": [200] * 2}
    data = {
        "text": _write(tmp_path / "text", TEXT_VOCAB, text_docs, None),
        "maestro": _write(tmp_path / "maestro", 328, {"train": [40] * 8, "valid": [30] * 2, "test": [30] * 2}, 0),
        "indirect": task.write_splits(tmp_path / "ii", seed=0, sizes={"train": 64, "valid": 16, "test": 16}),
    }
    monkeypatch.chdir(tmp_path)
    for command in commands:
        argv = tiny_command(command, data)
        assert cli.main(argv) == 0, f"{' '.join(command)} -> {argv}: {capsys.readouterr().err[-2000:]}"
    assert (tmp_path / "runs/report-ii/report.md").is_file()
    assert (tmp_path / "runs/owt-124m-pope-ft4096/summary.json").is_file()
    assert (tmp_path / "runs/length-pg19/length.json").is_file()
    assert (tmp_path / "runs/owt-124m-pope/seed-0/eval/frequencies/frequency_usage.json").is_file()


def _script(tmp_path, *, extra_path=(), **env):
    """Run scripts/gpu_reproduce.sh; DATA is a folder that does not exist unless given (so the developer's own
    .device-data/ never leaks into a test); ``extra_path`` goes before src on PYTHONPATH."""
    python_path = os.pathsep.join([*map(str, extra_path), str(ROOT / "src")])
    full = {
        **os.environ,
        "PYTHONPATH": python_path,
        "RUNS": str(tmp_path / "runs"),
        "OUT": str(tmp_path / "out"),
        "DATA": str(tmp_path / "no-device-data"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        **env,
    }
    return subprocess.run(
        ["bash", "scripts/gpu_reproduce.sh"], cwd=ROOT, env=full, capture_output=True, text=True, timeout=300
    )


def test_gpu_reproduce_rejects_bad_arguments(tmp_path):
    for env, message in [
        ({}, "STAGE must be jsb, maestro, genome, genome-more, text or text-ablations (got '')"),
        ({"STAGE": "owt"}, "STAGE must be jsb, maestro, genome, genome-more, text or text-ablations (got 'owt')"),
        ({"STAGE": "jsb", "LIMIT": "5m"}, "must be whole numbers"),
        ({"STAGE": "genome-more", "GENOME_MORE_FINETUNE": "no"}, "must be whole numbers"),
        ({"STAGE": "genome-more", "GENOME_MORE_SEED": ""}, "set GENOME_MORE_FINETUNE=0"),
        (
            {"STAGE": "genome-more", "GENOME_MORE_SEED": "", "GENOME_MORE_FINETUNE": "0", "GENOME_MORE_BASELINES": " "},
            "would train nothing",
        ),
        (
            {"STAGE": "genome-more", "GENOME_MORE_THIRD": "rope alibi"},
            "GENOME_MORE_THIRD takes pope, rope and pope-d0, not 'alibi'",
        ),
        ({"STAGE": "genome-more", "GENOME_MORE_THIRD": "pope"}, "set GENOME_MORE_FINETUNE=0"),
        (
            {"STAGE": "genome-more", "GENOME_MORE_THIRD": "", "GENOME_MORE_FINETUNE": "0", "GENOME_MORE_BASELINES": ""},
            "would train nothing",
        ),
        ({"STAGE": "maestro", "MAESTRO_STEPS": "50"}, "MAESTRO_STEPS must be at least 200"),
        (
            {"STAGE": "text-ablations", "ABLATIONS": "relu softmax"},
            "ABLATIONS takes identity, relu, no-delta and wrap, not 'softmax'",
        ),
    ]:
        result = _script(tmp_path, **env)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert not (tmp_path / "runs").exists()


NO_NETWORK = """import socket


def _refuse(*args, **kwargs):
    raise OSError("network disabled by the test (the GPU machine reaches no network)")


socket.socket.connect = socket.socket.connect_ex = _refuse
socket.create_connection = socket.getaddrinfo = _refuse
"""


def _no_network(tmp_path) -> Path:
    """A PYTHONPATH folder whose sitecustomize makes every socket connection and name lookup fail."""
    folder = tmp_path / "no-network"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(NO_NETWORK)
    return folder


def test_gpu_reproduce_refuses_damaged_carried_data(tmp_path):
    """A carried dataset is re-hashed before any training: a flipped byte stops the stage with the file named."""
    data = tmp_path / "device-data"
    _write(data / "maestro", 328, {"train": [40] * 8, "valid": [30] * 2, "test": [30] * 2}, 0)
    tokens = data / "maestro" / "train.bin"
    raw = bytearray(tokens.read_bytes())
    raw[10] ^= 1
    tokens.write_bytes(bytes(raw))
    result = _script(tmp_path, STAGE="maestro", DATA=str(data), POPE_CACHE=str(tmp_path / "empty-cache"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "from the carried folder" in result.stdout and "train.bin was modified or corrupted" in result.stderr
    assert not list((tmp_path / "runs").glob("maestro-*/seed-*"))


TINY_SETS = (
    "train.device=cpu",
    "recipe.max_steps=2",
    "recipe.warmup_steps=1",
    "recipe.eval_interval=2",
    "train.tensorboard=false",
    "model.n_layer=1",
)


def _tiny_stage(tmp_path, stage: str, data: Path, preset: str, sets=TINY_SETS):
    """Run STAGE on CPU with the tiny preset (one seed each, 2 steps) from the carried folder ``data``, with an
    empty $POPE_CACHE and no network; returns the result after checking both sweeps, the report and the one
    archive (small files only, no checkpoints), and that nothing was prepared or downloaded."""
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    env = {
        "STAGE": stage,
        f"{stage.upper()}_PRESET": preset,
        f"{stage.upper()}_SEEDS": "0",
        "EXTRA": " ".join(f"--set {s}" for s in sets),
        "POPE_CACHE": str(cache),
        "DATA": str(data),
        "OMP_NUM_THREADS": "1",
    }
    result = _script(tmp_path, extra_path=[_no_network(tmp_path)], **env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"data: {stage} from the carried folder {data}/{stage}" in result.stdout
    assert "checksums: all files match" in result.stdout
    assert f"sweep {stage}-pope exit status 0" in result.stdout and f"sweep {stage}-rope exit status 0" in result.stdout
    assert not any(cache.iterdir()), "the stage prepared or fetched data instead of reading the carried folder"
    import tarfile

    with tarfile.open(tmp_path / "out" / f"reproduce-{stage}.tar.gz") as archive:
        names = set(archive.getnames())
    for pe in ("pope", "rope"):
        assert {f"./{stage}-{pe}/seed-0/{n}" for n in ("metrics.jsonl", "summary.json", "config.json")} <= names
        summary = json.loads((tmp_path / "runs" / f"{stage}-{pe}/seed-0/summary.json").read_text())
        assert (
            summary["finished"] and summary["best_metric"] == "valid_loss" and "test_loss" in summary["at_best_valid"]
        )
    assert f"./report-{stage}/report.md" in names and not any("checkpoints" in n for n in names)
    report = (tmp_path / "runs" / f"report-{stage}" / "report.md").read_text()
    assert "ours at best-valid checkpoint" in report
    assert "## PoPE vs RoPE" not in report  # one seed a side: nothing to test (pope.eval.report needs >= 2)
    return env


@pytest.mark.data
@pytest.mark.slow
def test_gpu_reproduce_jsb_stage_on_cpu_from_carried_data(tmp_path):
    """scripts/device_data.sh builds the jsb folder; the jsb stage (jsb-tiny) trains, reports and archives from
    it alone; a second call skips the finished seeds."""
    built = subprocess.run(
        ["bash", "scripts/device_data.sh", "jsb"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "DEVICE_DATA": str(tmp_path / "device-data"), "PYTHON": sys.executable},
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert re.search(r"^jsb +0\.6 MiB \(\d+ bytes\)", built.stdout, flags=re.M), built.stdout
    env = _tiny_stage(tmp_path, "jsb", tmp_path / "device-data" / "jsb", "jsb-tiny")
    again = _script(tmp_path, extra_path=[tmp_path / "no-network"], **env)
    assert again.returncode == 0 and "skipped" in (tmp_path / "runs" / "jsb-pope.log").read_text().lower()


@pytest.mark.slow
def test_gpu_reproduce_maestro_stage_on_cpu(tmp_path):
    """The maestro stage (maestro-tiny, random MAESTRO-sized documents as the carried data)."""
    data = tmp_path / "device-data"
    _write(data / "maestro", 328, {"train": [40] * 8, "valid": [30] * 2, "test": [30] * 2}, 0)
    _tiny_stage(tmp_path, "maestro", data, "maestro-tiny", [s for s in TINY_SETS if "eval_interval" not in s])
    recipe = json.loads((tmp_path / "runs" / "maestro-pope/seed-0/config.json").read_text())["recipe"]
    # the stage's budget, except the keys EXTRA sets itself (pope train takes each key once)
    assert (recipe["max_steps"], recipe["warmup_steps"], recipe["eval_interval"]) == (2, 1, 50)


@pytest.mark.slow
def test_gpu_reproduce_genome_stage_on_cpu(tmp_path):
    """The genome stage (genome-tiny at context 16, random 6-mer documents as the carried data): PoPE d=U, RoPE and
    PoPE d=0, each evaluated at 1x..10x its training length on the same test documents, and one report of all three."""
    data = tmp_path / "device-data"
    _write(data / "genome", 4107, {"train": [300] * 4, "valid": [200], "test": [400] * 2}, None)
    sets = [*TINY_SETS, "recipe.seq_len=16", "model.max_seq_len=16", "recipe.batch_size=4", "recipe.eval_batches=1"]
    env = _tiny_stage(tmp_path, "genome", data, "genome-tiny", sets)
    again = _script(tmp_path, extra_path=[tmp_path / "no-network"], **env)  # a second call: every sweep resumes
    assert again.returncode == 0 and "sweep genome-pope-d0 exit status 0" in again.stdout
    runs = tmp_path / "runs"
    assert json.loads((runs / "genome-pope-d0/seed-0/config.json").read_text())["model"]["pe"] == "pope:delta_init=zero"
    evaluated = json.loads((runs / "length-genome/length.json").read_text())["runs"]
    assert len(evaluated) == 3 and all(
        {r["length"] for r in run["results"]} == {16, 32, 64, 128, 160} for run in evaluated
    )
    report = (runs / "report-genome/report.md").read_text()
    assert "pope:delta_init=zero" in report and "## Perplexity vs evaluation length (genome/test" in report


UNITS = {
    "whole": {},
    "alibi-only": {"GENOME_MORE_BASELINES": "alibi", "GENOME_MORE_SEED": "", "GENOME_MORE_FINETUNE": "0"},
    "rope-unit": {"GENOME_MORE_BASELINES": "", "GENOME_MORE_THIRD": "rope"},
}


@pytest.mark.parametrize("unit", list(UNITS))
def test_gpu_reproduce_genome_more_stage_on_cpu(tmp_path, unit):
    """The genome-more stage (genome-tiny at context 16, carried random 6-mer documents): ALiBi and NoPE seed 0, PoPE
    d=U, RoPE and PoPE d=0 seed GENOME_MORE_SEED in the genome stage's sweep directories, YaRN and PoPE+ft fine-tuned
    at 4x from that seed, all seven evaluated at 1x..10x, frequency usage of the three, one report. alibi-only: only
    the baselines named in GENOME_MORE_BASELINES (alibi), no third seed (GENOME_MORE_SEED empty), so no fine-tunes
    (GENOME_MORE_FINETUNE=0); the lengths come from the baseline's training length. rope-unit: no baseline, the
    third seed of RoPE alone (GENOME_MORE_THIRD=rope) and its YaRN fine-tune, nothing else."""
    data = tmp_path / "device-data"
    _write(data / "genome", 4107, {"train": [300] * 4, "valid": [200], "test": [400] * 2}, None)
    sets = [*TINY_SETS, "recipe.seq_len=16", "model.max_seq_len=16", "recipe.batch_size=4", "recipe.eval_batches=1"]
    ft = (
        "--batch-size 2 --warmup 1 --set train.device=cpu --set train.tensorboard=false "
        "--set recipe.eval_interval=2 --set recipe.eval_batches=1 --set recipe.grad_accum=2"
    )  # as the stage's default
    result = _script(
        tmp_path,
        extra_path=[_no_network(tmp_path)],
        STAGE="genome-more",
        GENOME_PRESET="genome-tiny",
        EXTRA=" ".join(f"--set {s}" for s in sets),
        FT_STEPS="2",
        FT_EXTRA=ft,
        EVAL_ARGS="--device cpu",
        DATA=str(data),
        POPE_CACHE=str(tmp_path / "empty-cache"),
        OMP_NUM_THREADS="1",
        **UNITS[unit],
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"data: genome from the carried folder {data}/genome" in result.stdout
    runs = tmp_path / "runs"
    if unit == "rope-unit":
        assert sorted(p.name for p in runs.iterdir() if p.is_dir()) == [
            "genome-rope",
            "genome-rope-ft64",
            "length-genome-more",
            "report-genome-more",
        ]
        assert json.loads((runs / "genome-rope-ft64/config.json").read_text())["model"]["pe"].startswith("yarn:")
        evaluated = json.loads((runs / "length-genome-more/length.json").read_text())["runs"]
        assert [Path(run["run"]).parts[-1] for run in evaluated] == ["seed-2", "genome-rope-ft64"]
        assert (runs / "genome-rope/seed-2/eval/frequencies/frequency_usage.json").is_file()
        return
    if unit == "alibi-only":
        assert sorted(p.name for p in runs.iterdir() if p.is_dir()) == [
            "genome-alibi",
            "length-genome-more",
            "report-genome-more",
        ]
        evaluated = json.loads((runs / "length-genome-more/length.json").read_text())["runs"]
        assert [Path(run["run"]).parts[-2:] for run in evaluated] == [("genome-alibi", "seed-0")]
        assert {r["length"] for r in evaluated[0]["results"]} == {16, 32, 64, 128, 160}
        return
    for name in ("pope", "rope", "pope-d0", "alibi", "nope"):
        assert f"sweep genome-{name} exit status 0" in result.stdout
    assert sorted(p.name for p in (runs / "genome-rope").glob("seed-*") if p.is_dir()) == ["seed-2"]
    assert json.loads((runs / "genome-rope-ft64/config.json").read_text())["model"]["pe"].startswith("yarn:")
    ft_config = json.loads((runs / "genome-pope-d0-ft64/config.json").read_text())
    assert ft_config["model"]["pe"] == "pope:delta_init=zero" and ft_config["recipe"]["grad_accum"] == 2
    evaluated = json.loads((runs / "length-genome-more/length.json").read_text())["runs"]
    assert len(evaluated) == 7 and all(
        {r["length"] for r in run["results"]} == {16, 32, 64, 128, 160} for run in evaluated
    )
    for sweep in ("genome-pope", "genome-rope", "genome-pope-d0"):
        assert (runs / sweep / "seed-2/eval/frequencies/frequency_usage.json").is_file()
    report = (runs / "report-genome-more/report.md").read_text()
    assert "| genome-tiny | alibi |" in report and "genome-rope-ft64/" in report
    import tarfile

    with tarfile.open(tmp_path / "out" / "reproduce-genome-more.tar.gz") as archive:
        names = set(archive.getnames())
    assert "./length-genome-more/length.json" in names and "./genome-nope/seed-0/summary.json" in names
    assert not any("checkpoints" in n for n in names)


def test_gpu_reproduce_text_ablations_stage_on_cpu(tmp_path):
    """The text-ablations stage on CPU (text-256-tiny at context 16, a carried random token set): full PoPE (delta
    zero), identity and ReLU magnitudes and no delta, two seeds each, side by side; their length evaluation at
    1x..10x; one report with each ablation against the full PoPE. Then ABLATIONS=wrap with a third seed: only the
    full PoPE and the wrapped-delta setting train."""
    data = tmp_path / "device-data"
    _write(data / "text", TEXT_VOCAB, {"train": [300] * 4, "valid": [200], "test": [400] * 2}, None)
    sets = [
        *TINY_SETS,
        "recipe.seq_len=16",
        "model.max_seq_len=16",
        "recipe.batch_size=4",
        "recipe.eval_batches=1",
        f"model.vocab_size={TEXT_VOCAB}",
    ]
    no_network = _no_network(tmp_path)
    result = _script(
        tmp_path,
        extra_path=[no_network],
        STAGE="text-ablations",
        TEXT_PRESET="text-256-tiny",
        EXTRA=" ".join(f"--set {s}" for s in sets),
        EVAL_ARGS="--device cpu",
        DATA=str(data),
        POPE_CACHE=str(tmp_path / "empty-cache"),
        OMP_NUM_THREADS="1",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    runs = tmp_path / "runs"
    specs = {
        "full": "pope:delta_init=zero",
        "identity": "pope:delta_init=zero,magnitude=identity",
        "relu": "pope:delta_init=zero,magnitude=relu",
        "no-delta": "pope:use_delta=false",
    }
    for name, spec in specs.items():
        assert f"sweep ablation-{name} exit status 0" in result.stdout
        for seed in (0, 1):
            config = json.loads((runs / f"ablation-{name}/seed-{seed}/config.json").read_text())
            assert config["model"]["pe"].startswith(spec) and config["seed"] == seed
    evaluated = json.loads((runs / "length-ablations/length.json").read_text())["runs"]
    assert len(evaluated) == 8 and all(
        {r["length"] for r in run["results"]} == {16, 32, 64, 128, 160} for run in evaluated
    )
    report = (runs / "report-text-ablations/report.md").read_text()
    against = report[report.index("## Against") :]
    assert "ablation-full/" in against.splitlines()[0]
    for name in ("identity", "relu", "no-delta"):  # each ablation has its rows against the full PoPE
        assert any(
            line.startswith("| text-256-tiny |") and f"| ablation-{name}/ " in line for line in against.splitlines()[1:]
        )
    assert not (runs / "ablation-wrap").exists()  # not in the default ABLATIONS
    for name in specs:  # the first seed's magnitudes and delta, read before the checkpoints are left behind
        usage = json.loads((runs / f"ablation-{name}/seed-0/eval/frequencies/frequency_usage.json").read_text())
        assert usage and not (runs / f"ablation-{name}/seed-1/eval/frequencies").exists()

    # ABLATIONS picks the settings trained beside the full PoPE: "wrap" alone, one more seed, the runs above kept
    result = _script(
        tmp_path,
        extra_path=[no_network],
        STAGE="text-ablations",
        ABLATIONS="wrap",
        ABLATION_SEEDS="2",
        TEXT_PRESET="text-256-tiny",
        EXTRA=" ".join(f"--set {s}" for s in sets),
        EVAL_ARGS="--device cpu",
        DATA=str(data),
        POPE_CACHE=str(tmp_path / "empty-cache"),
        OMP_NUM_THREADS="1",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    started = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("sweep ablation-")}
    assert started == {"ablation-full", "ablation-wrap"}
    config = json.loads((runs / "ablation-wrap/seed-2/config.json").read_text())
    assert config["model"]["pe"].startswith("pope:delta_init=zero,delta_range=wrap") and config["seed"] == 2
    assert (runs / "ablation-full/seed-2/summary.json").is_file()
    assert (runs / "ablation-wrap/seed-2/eval/frequencies/frequency_usage.json").is_file()
    report = (runs / "report-text-ablations/report.md").read_text()
    assert "| ablation-wrap/" in report[report.index("## Against") :]


@pytest.mark.slow
def test_gpu_reproduce_text_stage_on_cpu(tmp_path):
    """The text stage end to end on CPU from a small carried token set (training context 16; a TEXT_VOCAB
    vocabulary, as in the test above): five sweeps, YaRN and PoPE+ft fine-tunes at 4x, length evaluation at
    1x..20x, frequency usage, the report."""
    data = tmp_path / "device-data"
    _write(data / "text", TEXT_VOCAB, {"train": [300] * 4, "valid": [200], "test": [400] * 2}, None)
    sets = [
        *TINY_SETS,
        "recipe.seq_len=16",
        "model.max_seq_len=16",
        "recipe.batch_size=4",
        "recipe.eval_batches=1",
        f"model.vocab_size={TEXT_VOCAB}",
    ]
    ft = (
        "--batch-size 2 --warmup 1 --set train.device=cpu --set train.tensorboard=false "
        "--set recipe.eval_interval=2 --set recipe.eval_batches=1"
    )
    result = _script(
        tmp_path,
        extra_path=[_no_network(tmp_path)],
        STAGE="text",
        TEXT_PRESET="text-256-tiny",
        TEXT_SEEDS="0",
        EXTRA=" ".join(f"--set {s}" for s in sets),
        FT_STEPS="2",
        FT_EXTRA=ft,
        EVAL_ARGS="--device cpu",
        DATA=str(data),
        POPE_CACHE=str(tmp_path / "empty-cache"),
        OMP_NUM_THREADS="1",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    runs = tmp_path / "runs"
    for name in ("rope", "pope-d0", "pope-du", "alibi", "nope"):
        assert f"sweep text-{name} exit status 0" in result.stdout
    assert json.loads((runs / "text-rope-ft64/config.json").read_text())["model"]["pe"].startswith("yarn:")
    assert (runs / "text-pope-d0-ft64/summary.json").is_file()
    for name, lengths, span in (("text", {16, 32, 64, 128, 160}, "16-160"), ("text-long", {256, 320}, "256-320")):
        evaluated = json.loads((runs / f"length-{name}/length.json").read_text())["runs"]
        assert len(evaluated) == 5 + 2  # the seed of each of the five sweeps and the two fine-tunes
        assert all({r["length"] for r in run["results"]} == lengths for run in evaluated)
        # each run keeps both evaluations (the second one does not replace the first)
        beside = json.loads((runs / f"text-nope/seed-0/eval/length-text-test-{span}.json").read_text())
        assert {r["length"] for r in beside["results"]} == lengths
    assert (runs / "text-pope-du/seed-0/eval/frequencies/frequency_usage.json").is_file()
    report = (runs / "report-text/report.md").read_text()
    assert "## Perplexity vs evaluation length (text/test, the same documents at every length to 160)" in report
    assert "## Perplexity vs evaluation length (text/test, the same documents at every length to 320)" in report
    assert "lift-off" not in report  # no lift-off table for language models
    import tarfile

    with tarfile.open(tmp_path / "out" / "reproduce-text.tar.gz") as archive:
        names = set(archive.getnames())
    assert "./report-text/report.md" in names and "./length-text/length.json" in names
    assert not any("checkpoints" in n for n in names)


def _background(tmp_path, *args, **env):
    """Run scripts/gpu_reproduce_bg.sh with its logs, runs and $OUT under tmp_path (MPS left alone)."""
    no_network = tmp_path / "no-network"
    python_path = os.pathsep.join(
        [str(no_network if no_network.exists() else _no_network(tmp_path)), str(ROOT / "src")]
    )
    full = {
        **os.environ,
        "PYTHONPATH": python_path,
        "RUNS": str(tmp_path / "runs"),
        "OUT": str(tmp_path / "out"),
        "LOG_DIR": str(tmp_path / "logs"),
        "MPS": "off",
        "DATA": str(tmp_path / "no-device-data"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        **env,
    }
    return subprocess.run(
        ["bash", "scripts/gpu_reproduce_bg.sh", *args], cwd=ROOT, env=full, capture_output=True, text=True, timeout=300
    )


def test_gpu_reproduce_bg_rejects_bad_arguments(tmp_path):
    for args, message in [
        ((), "SECONDS must be a whole number"),
        (("5m", "jsb"), "SECONDS must be a whole number"),
        (("60",), "name at least one stage"),
        (("60", "owt"), "unknown stage 'owt'"),
    ]:
        result = _background(tmp_path, *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert not (tmp_path / "logs").exists()


def test_gpu_reproduce_bg_records_every_setting_gpu_reproduce_reads():
    """A setting missing from settings_now would make a second unit that changes only it a silent no-op again."""
    read = set(re.findall(r"\$\{([A-Z_]+):?-", (ROOT / "scripts/gpu_reproduce.sh").read_text()))
    # set by gpu_reproduce_bg.sh itself (STAGE, LIMIT, OUT), shared by every stage (RUNS, PYTHONPATH), or its own
    # archive-only call (ARCHIVE_*)
    read -= {"STAGE", "LIMIT", "OUT", "RUNS", "PYTHONPATH", "ARCHIVE_ONLY", "ARCHIVE_NAME"}
    background = (ROOT / "scripts/gpu_reproduce_bg.sh").read_text()
    loop = re.search(r"settings_now\(\) \{.*?for name in (.*?); do", background, re.S).group(1)
    assert set(loop.replace("\\", " ").split()) == read


@pytest.mark.slow
def test_gpu_reproduce_bg_runs_a_stage_in_the_background_and_leaves_an_ended_one_alone(tmp_path):
    """A stage starts in its own session, the call waits for it and copies its log and archive into $OUT; a second
    call finds it ended and starts nothing, a third with other settings starts it again; a call whose time runs out
    first returns 3 with a partial archive."""
    data = tmp_path / "device-data"
    _write(data / "maestro", 328, {"train": [40] * 8, "valid": [30] * 2, "test": [30] * 2}, 0)
    env = {
        "MAESTRO_PRESET": "maestro-tiny",
        "MAESTRO_SEEDS": "0",
        "DATA": str(data),
        "OMP_NUM_THREADS": "1",
        "POPE_CACHE": str(tmp_path / "empty-cache"),
        "EXTRA": " ".join(f"--set {s}" for s in TINY_SETS if "eval_interval" not in s),
    }
    first = _background(tmp_path, "240", "maestro", **env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "maestro: started (pid" in first.stdout and "== maestro: ended (exit status 0)" in first.stdout
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"reproduce-maestro.log", "reproduce-maestro.tar.gz"}
    assert json.loads((tmp_path / "runs" / "maestro-pope/seed-0/summary.json").read_text())["finished"]
    again = _background(tmp_path, "240", "maestro", **env)
    assert again.returncode == 0 and "maestro: ended (exit status 0)" in again.stdout.splitlines()[0], again.stdout
    assert "started" not in again.stdout
    # other settings (a second unit of the stage on a warm machine): it starts again, naming what changed, resumes
    # what RUNS holds (the finished seed is skipped, not retrained) and keeps the first log beside the new one
    trained = (tmp_path / "runs" / "maestro-pope/seed-0/metrics.jsonl").read_text()
    other = _background(tmp_path, "240", "maestro", **{**env, "JOBS_PER_GPU": "2"})
    assert other.returncode == 0, other.stdout + other.stderr
    assert (
        "maestro: started (pid" in other.stdout
        and "it had ended (exit status 0) with other settings: JOBS_PER_GPU unset -> JOBS_PER_GPU=2" in other.stdout
    ), other.stdout
    assert (tmp_path / "runs" / "maestro-pope/seed-0/metrics.jsonl").read_text() == trained
    assert (tmp_path / "logs" / "reproduce-maestro.log.previous").is_file()
    assert "JOBS_PER_GPU=2" in (tmp_path / "logs" / "reproduce-maestro.settings").read_text().splitlines()

    # a stage still running when SECONDS are up: exit 3, and what it has so far comes back as a partial archive
    slow = {**env, "EXTRA": env["EXTRA"].replace("recipe.max_steps=2", "recipe.max_steps=2000")}
    (tmp_path / "cut").mkdir()
    cut = _background(tmp_path / "cut", "5", "maestro", **slow)
    assert cut.returncode == 3 and "== maestro: running (pid" in cut.stdout, cut.stdout + cut.stderr
    assert (tmp_path / "cut" / "out" / "reproduce-maestro-partial.tar.gz").is_file()
    pid = int((tmp_path / "cut" / "logs" / "reproduce-maestro.pid").read_text())
    os.killpg(pid, 15)  # the stage runs in its own session: end it with its children
