"""The commands of results/REPRODUCTION.md for the rows not run, each run on a tiny model on CPU; and
scripts/reproduce.py's stages on CPU, its argument handling, time limit and resume.

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
import signal
import subprocess
import sys
import time
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


# ---------------------------------------------------------------------------------------------------------------
# scripts/reproduce.py on CPU: the stages with the *-tiny presets, random prepared data in POPE_DATA_DIR (nothing
# prepared or fetched: an empty POPE_CACHE and no network), one seed, two steps.

NO_NETWORK = """import socket


def _refuse(*args, **kwargs):
    raise OSError("network disabled by the test")


socket.socket.connect = socket.socket.connect_ex = _refuse
socket.create_connection = socket.getaddrinfo = _refuse
"""

TINY_SETS = ("recipe.max_steps=2", "recipe.warmup_steps=1", "recipe.eval_interval=2", "train.tensorboard=false")
SMALL_CONTEXT = ("recipe.seq_len=16", "model.max_seq_len=16", "recipe.batch_size=4", "recipe.eval_batches=1")
FINETUNE_ARGS = "--batch-size 2 --warmup 1 --set train.tensorboard=false --set recipe.eval_interval=2"


def _sets(*items: str) -> list[str]:
    return [x for item in items for x in ("--set", item)]


def _reproduce(tmp_path, *args, data: Path | None = None, wait: bool = True):
    """Run scripts/reproduce.py (subprocess.run, or a Popen when ``wait`` is False) with the network disabled, an
    empty POPE_CACHE and ``data`` as POPE_DATA_DIR."""
    no_network = tmp_path / "no-network"
    no_network.mkdir(exist_ok=True)
    (no_network / "sitecustomize.py").write_text(NO_NETWORK)
    (tmp_path / "empty-cache").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(no_network), str(ROOT / "src")]),
        "POPE_CACHE": str(tmp_path / "empty-cache"),
        "OMP_NUM_THREADS": "1",
    }
    if data is not None:
        env["POPE_DATA_DIR"] = str(data)
    command = [sys.executable, "scripts/reproduce.py", *map(str, args)]
    if not wait:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def _maestro_data(tmp_path) -> Path:
    _write(tmp_path / "data" / "maestro", 328, {"train": [40] * 8, "valid": [30] * 2, "test": [30] * 2}, 0)
    return tmp_path / "data"


def test_reproduce_rejects_bad_arguments_in_one_line(tmp_path):
    out = tmp_path / "out"
    for args, message in [
        (["owt", "--out", out], "unknown stage 'owt'; give one or more of indirect, jsb, maestro, genome, text"),
        (["jsb", "jsb", "--out", out], "a stage is named twice"),
        (["jsb", "genome", "--out", out, "--preset", "jsb-tiny"], "--preset replaces one stage's preset"),
        (["jsb", "--out", out, "--max-seconds", "30"], "--max-seconds 30 leaves no time before the 60-s grace"),
        (["jsb", "--out", out, "--seeds", "3-1"], "runs backwards"),
        (["text-ablations", "--out", out, "--ablations", "relu,softmax"], "--ablations takes identity, relu"),
        (["text-ablations", "--out", out, "--ablations", ","], "--ablations is empty"),
        (["jsb", "--out", out, "--set", "train.compile"], "--set takes SECTION.KEY=VALUE"),
        (["jsb", "--out", out, "--jobs-per-gpu", "0"], "--jobs-per-gpu must be at least 1"),
    ]:
        result = _reproduce(tmp_path, *args)
        error_lines = [line for line in result.stderr.splitlines() if line.startswith("reproduce.py: error")]
        assert result.returncode == 2 and len(error_lines) == 1 and message in error_lines[0], result.stderr
        assert not out.exists()


@pytest.mark.slow
def test_reproduce_maestro_stage_then_resume_skips_finished_seeds(tmp_path):
    """The maestro stage (maestro-tiny on random documents): both sweeps train, the stage's 2000-step budget is
    applied except the keys --set gives, the report is written; a second call without --resume is refused before
    anything runs, and with --resume it skips the finished seeds."""
    data = _maestro_data(tmp_path)
    out = tmp_path / "out"
    args = ["maestro", "--out", out, "--preset", "maestro-tiny", "--seeds", "0", "--device", "cpu"]
    args += _sets("recipe.max_steps=2", "recipe.warmup_steps=1", "train.tensorboard=false", "model.n_layer=1")
    result = _reproduce(tmp_path, *args, data=data)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "maestro-pope: done" in result.stdout and "maestro-rope: done" in result.stdout
    assert not any((tmp_path / "empty-cache").iterdir()), "the stage prepared or fetched data"
    for pe in ("pope", "rope"):
        config = json.loads((out / f"maestro-{pe}/seed-0/config.json").read_text())
        # the stage's budget, except the keys --set gives itself (pope train takes each key once)
        assert (config["recipe"]["max_steps"], config["recipe"]["warmup_steps"]) == (2, 1)
        assert config["recipe"]["eval_interval"] == 50 and config["train"]["device"] == "cpu"
        summary = json.loads((out / f"maestro-{pe}/seed-0/summary.json").read_text())
        assert summary["finished"] and "test_loss" in summary["at_best_valid"]
    assert "ours at best-valid checkpoint" in (out / "report-maestro/report.md").read_text()
    assert (out / "logs/maestro-pope.log").is_file()

    refused = _reproduce(tmp_path, *args, data=data)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == (
        f"reproduce.py: {out}/maestro-pope already exists (an earlier call's runs); add --resume to continue them, "
        "or give a new --out"
    )
    again = _reproduce(tmp_path, *args, "--resume", data=data)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "skipped" in (out / "logs/maestro-pope.log").read_text().split("$ pope")[-1]


def _last_step(run: Path) -> int:
    try:
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    except OSError:
        return 0
    return max((r["step"] for r in records if r.get("kind") == "train"), default=0)


@pytest.mark.slow
def test_reproduce_stops_cleanly_at_its_time_limit_and_resumes(tmp_path):
    """--max-seconds: the running sweep is asked to stop --grace-seconds before the limit; its seed writes
    checkpoints/last and the call exits 3 with the line that continues it. The same command with --resume continues
    that seed from its checkpoint; a SIGTERM sent to the script stops it the same way."""
    data = _maestro_data(tmp_path)
    out = tmp_path / "out"
    args = ["maestro", "--out", out, "--preset", "maestro-tiny", "--seeds", "0", "--device", "cpu"]
    args += _sets("recipe.max_steps=1000000", "recipe.eval_interval=100000", "train.tensorboard=false")
    args += _sets("model.n_layer=1", "train.log_interval=1")
    result = _reproduce(tmp_path, *args, "--max-seconds", "70", "--grace-seconds", "35", data=data)
    assert result.returncode == 3, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("reproduce.py: stopped by --max-seconds after ") and "every run checkpointed" in last
    assert last.endswith("--max-seconds 70 --grace-seconds 35 --resume"), last
    run = out / "maestro-pope/seed-0"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "SIGINT" and not summary["finished"]
    stopped_at = summary["step"]
    assert stopped_at > 0 and (run / "checkpoints/last").is_dir()
    assert not (out / "maestro-rope").exists()  # nothing started after the stop

    process = _reproduce(tmp_path, *args, "--resume", data=data, wait=False)
    try:
        deadline = time.monotonic() + 300
        while _last_step(run) <= stopped_at and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.5)
        assert _last_step(run) > stopped_at, "the resumed seed made no progress"
        process.send_signal(signal.SIGTERM)
        stdout, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 3, stdout
    assert "reproduce.py: stopped by SIGTERM" in stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] > stopped_at and summary["stop_reason"] == "SIGINT"
    assert json.loads((run / f"env.resume-{stopped_at}.json").read_text())["resumed_from_step"] == stopped_at


def test_reproduce_genome_stage_plan(tmp_path):
    """genome: PoPE d=U, RoPE and PoPE d=0 over the seeds, ALiBi and NoPE on the first; YaRN and PoPE+ft fine-tuned at
    4x from the first seed; all seven evaluated at 1x..10x; frequency usage of the first seed's three; one report.
    (The stages' commands run end to end in test_reproduce_maestro_stage_then_resume_skips_finished_seeds.)"""
    commands = _plan(tmp_path, "genome", "--seeds", "2")
    out = tmp_path / "out"
    trained = [(c[1], c[c.index("--pe") + 1], c[c.index("--seeds") + 1]) for c in commands if c[0] == "train"]
    pes = ["pope", "rope", "pope:delta_init=zero", "alibi", "nope"]
    assert trained == [("genome-small", pe, "2") for pe in pes]
    tuned = [(c[1], c[c.index("--context") + 1]) for c in commands if c[0] == "finetune"]
    assert tuned == [(f"{out}/genome-rope/seed-2", "64"), (f"{out}/genome-pope-d0/seed-2", "64")]
    (length,) = [c for c in commands if c[:2] == ["eval", "length"]]
    names = ["pope", "rope", "pope-d0", "alibi", "nope"]
    assert length[2:9] == [f"{out}/genome-{n}/seed-2" for n in names] + [
        f"{out}/genome-{n}-ft64" for n in ("rope", "pope-d0")
    ]
    usage = [c[2] for c in commands if c[:2] == ["analyze", "frequencies"]]
    assert usage == [f"{out}/genome-{name}/seed-2" for name in ("pope", "rope", "pope-d0")]
    assert commands[-1][0] == "report" and commands[-1][-2:] == ["--out", f"{out}/report-genome"]


def test_reproduce_text_ablations_stage_plan(tmp_path):
    """text-ablations: the full PoPE beside the settings of --ablations, their length evaluation, frequency usage,
    and the report against the full PoPE."""
    commands = _plan(tmp_path, "text-ablations", "--seeds", "0", "--ablations", "relu,wrap")
    out = tmp_path / "out"
    specs = {"full": "pope:delta_init=zero", **ABLATION_SPECS}
    trained = [(c[c.index("--pe") + 1], c[c.index("--out") + 1]) for c in commands if c[0] == "train"]
    assert trained == [(spec, f"{out}/ablation-{name}") for name, spec in specs.items()]
    (length,) = [c for c in commands if c[:2] == ["eval", "length"]]
    assert length[2:5] == [f"{out}/ablation-{name}/seed-0" for name in specs]
    assert [c[2] for c in commands if c[:2] == ["analyze", "frequencies"]] == length[2:5]
    assert commands[-1][-2:] == ["--against", f"{out}/ablation-full"]


ABLATION_SPECS = {
    "relu": "pope:delta_init=zero,magnitude=relu",
    "wrap": "pope:delta_init=zero,delta_range=wrap",
}


def _load_reproduce():
    import importlib.util

    spec = importlib.util.spec_from_file_location("reproduce_script", ROOT / "scripts" / "reproduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _plan(tmp_path, stage: str, *extra: str) -> list[list[str]]:
    """The pope commands a stage runs, without running them: each `pope train --seeds` writes finished seed
    directories (training length 16) and each fine-tune a finished run, as the real commands would."""
    reproduce = _load_reproduce()
    args = reproduce.parse_args([stage, "--out", str(tmp_path / "out"), *extra])
    plan = reproduce.Reproduction(args, [])
    commands = []

    def pope(name, argv):
        commands.append(argv)
        out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
        if argv[0] == "train":
            for seed in argv[argv.index("--seeds") + 1].split(","):
                (out / f"seed-{seed}").mkdir(parents=True)
                (out / f"seed-{seed}/config.json").write_text(json.dumps({"recipe": {"seq_len": 16}}))
                (out / f"seed-{seed}/summary.json").write_text(json.dumps({"finished": True}))
            (out / "sweep.json").write_text("{}")
        elif argv[0] == "finetune":
            out.mkdir(parents=True)
            (out / "summary.json").write_text(json.dumps({"finished": True}))
            (out / "config.json").write_text("{}")
        return True

    plan.pope = pope
    plan.run_stage(stage)
    return commands


def test_reproduce_text_stage_plan(tmp_path):
    """text: RoPE and PoPE d=0 over the seeds, PoPE d=U, ALiBi and NoPE on the first; fine-tunes at 4x from the
    first seed; perplexity at 1x..10x and 16x, 20x of all seven; frequency usage of the first seed's three."""
    commands = _plan(tmp_path, "text", "--seeds", "3-4")
    out = tmp_path / "out"
    trained = [(c[c.index("--pe") + 1], c[c.index("--seeds") + 1]) for c in commands if c[0] == "train"]
    assert trained == [
        ("rope", "3,4"),
        ("pope:delta_init=zero", "3,4"),
        ("pope:delta_init=uniform", "3"),
        ("alibi", "3"),
        ("nope", "3"),
    ]
    tuned = [(c[1], c[c.index("--context") + 1]) for c in commands if c[0] == "finetune"]
    assert tuned == [(f"{out}/text-rope/seed-3", "64"), (f"{out}/text-pope-d0/seed-3", "64")]
    lengths = {
        c[c.index("--out") + 1]: (len(c[2 : c.index("--data")]), c[c.index("--lengths") + 1])
        for c in commands
        if c[:2] == ["eval", "length"]
    }
    assert lengths == {f"{out}/length-text": (9, "16,32,64,128,160"), f"{out}/length-text-long": (9, "256,320")}
    usage = [c[2] for c in commands if c[:2] == ["analyze", "frequencies"]]
    assert usage == [f"{out}/text-{name}/seed-3" for name in ("rope", "pope-d0", "pope-du")]
    assert commands[-1][0] == "report" and len(commands[-1]) == 1 + 5 + 2 + 2


def test_reproduce_indirect_stage_plan(tmp_path):
    """indirect: PoPE and RoPE over the seeds, with the stage's evaluation settings unless --set gives them; the
    delta of each finished PoPE seed's final weights; the report."""
    commands = _plan(tmp_path, "indirect", "--set", "train.log_interval=10")
    out = tmp_path / "out"
    train = commands[0]
    assert train[:6] == ["train", "indirect-indexing", "--pe", "pope", "--seeds", "0,1,2"]
    sets = [train[i + 1] for i, word in enumerate(train) if word == "--set"]
    assert sets == [
        "train.eval_batch_size=1000",
        "train.checkpoint_interval=25000",
        "train.progress=false",
        "train.log_interval=10",
    ]
    deltas = [c[2] for c in commands if c[:2] == ["analyze", "delta"]]
    assert deltas == [f"{out}/indirect-pope/seed-{s}/checkpoints/last" for s in range(3)]
    assert commands[-1] == ["report", f"{out}/indirect-pope", f"{out}/indirect-rope", "--out", f"{out}/report-indirect"]


def test_reproduce_kills_a_command_that_ignores_the_stop_at_the_limit(tmp_path):
    """A command that ignores SIGINT gets a second one at the limit and SIGKILL KILL_SECONDS later; the call stops
    (Stopped) and names it."""
    reproduce = _load_reproduce()
    args = reproduce.parse_args(["jsb", "--out", str(tmp_path), "--max-seconds", "2", "--grace-seconds", "1"])
    plan = reproduce.Reproduction(args, [])
    stubborn = (
        "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('started', flush=True); "
        "time.sleep(120)"
    )
    plan.command = [sys.executable, "-c", stubborn]
    started = time.monotonic()
    with pytest.raises(reproduce.Stopped):
        plan.pope("stubborn", [])
    seconds = time.monotonic() - started
    assert plan.stop_reason == "--max-seconds" and plan.killed == "stubborn"
    assert 2 + reproduce.KILL_SECONDS <= seconds < 2 + reproduce.KILL_SECONDS + 10, seconds
    assert "started" in (tmp_path / "logs/stubborn.log").read_text()
    with pytest.raises(reproduce.Stopped):  # nothing starts after the stop
        plan.pope("next", [])
    assert not (tmp_path / "logs/next.log").exists()
