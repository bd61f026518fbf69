"""The lm-eval model: lm-eval's own interface on local tasks, and log-likelihoods checked directly."""

import json
import math

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-eval is part of the [eval] extra")

from lm_eval.api.instance import Instance  # noqa: E402

from pope.eval.lm_eval_model import PoPELM  # noqa: E402
from pope.eval.tokenizers import get_tokenizer  # noqa: E402
from pope.model import GPT, GPTConfig  # noqa: E402

QUESTIONS = [
    ("The cat sat on the", ["mat", "moon", "xylophone"], 0),
    ("One, two, three,", ["four", "seven", "banana"], 0),
    ("Roses are red, violets are", ["blue", "green", "loud"], 0),
    ("A B C D", ["E", "Q", "zz"], 1),
    ("2 + 2 =", ["4", "5", "22"], 2),
]


@pytest.fixture(scope="module")
def byte_model():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=256, n_layer=2, n_head=2, d_model=32, max_seq_len=24, pe="pope")
    return GPT(config).eval()


def _direct_logprob(model, context_ids, continuation_ids):
    """Sum of log p(continuation token | everything before it), one full forward pass, float64."""
    ids = torch.tensor([context_ids + continuation_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[:, :-1])[0].double(), -1)[0]  # (T-1, V)
    n = len(continuation_ids)
    positions = range(len(context_ids) - 1, len(context_ids) - 1 + n)
    return sum(logp[p, t].item() for p, t in zip(positions, continuation_ids))


def _instance(kind, args):
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def test_loglikelihood_equals_direct_sum_of_token_logprobs(byte_model):
    lm = PoPELM(model=byte_model, tokenizer=get_tokenizer("bytes"), batch_size=3)
    requests = [("The cat sat on the", " mat"), ("", "hello"), ("abc ", "def"), ("x" * 40, " tail!")]
    results = lm.loglikelihood([_instance("loglikelihood", r) for r in requests])
    for (context, continuation), (logprob, greedy) in zip(requests, results):
        if context == "":
            ctx, cont = [0], list(continuation.encode())
        else:  # trailing spaces move to the continuation
            stripped = context.rstrip()
            ctx, cont = list(stripped.encode()), list((context[len(stripped) :] + continuation).encode())
        whole = (ctx + cont)[-(24 + 1) :]  # the model's window: max_length inputs + 1
        expected = _direct_logprob(byte_model, whole[: len(whole) - len(cont)], cont)
        assert logprob == pytest.approx(expected, abs=1e-4)
        assert isinstance(greedy, bool)


def test_rolling_scores_every_token_once(byte_model):
    lm = PoPELM(model=byte_model, tokenizer=get_tokenizer("bytes"), max_length=8)
    text = "abcdefghijklmnopqrstu"  # 21 tokens -> windows of 8 predicted tokens: 8, 8, 5 (last keeps 8 inputs)
    (total,) = lm.loglikelihood_rolling([_instance("loglikelihood_rolling", (text,))])
    ids = [0] + list(text.encode())
    expected = 0.0
    for start, stop in ((0, 8), (8, 16)):  # disjoint windows: inputs ids[start:stop], targets ids[start+1:stop+1]
        expected += _direct_logprob(byte_model, ids[start : start + 1], ids[start + 1 : stop + 1])
    # Last window: the final 8 inputs, scoring only the 5 tokens not yet predicted.
    last_inputs = ids[-9:-1]
    with torch.no_grad():
        logp = torch.log_softmax(byte_model(torch.tensor([last_inputs]))[0].double(), -1)[0]
    expected += sum(logp[p, ids[-8 + p]].item() for p in range(3, 8))
    assert total == pytest.approx(expected, abs=1e-4)


def test_generate_until_is_greedy_and_stops(byte_model):
    lm = PoPELM(model=byte_model, tokenizer=get_tokenizer("bytes"), max_gen_toks=6)
    (text,) = lm.generate_until([_instance("generate_until", ("Hello", {"until": ["\n\n"], "max_gen_toks": 6}))])
    ids = list(b"Hello")
    with torch.no_grad():
        for _ in range(6):  # reference: greedy without a cache
            ids.append(int(byte_model(torch.tensor([ids]))[0][0, -1].argmax()))
    expected = bytes(ids[5:]).decode("utf-8", errors="replace").split("\n\n")[0]
    assert text == expected
    with pytest.raises(ValueError, match="greedily"):
        lm.generate_until([_instance("generate_until", ("Hi", {"do_sample": True, "temperature": 0.7}))])


def test_bad_arguments_are_refused(byte_model, tmp_path):
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        small = GPT(GPTConfig(vocab_size=100, n_layer=1, n_head=1, d_model=8, max_seq_len=8, pe="rope"))
        PoPELM(model=small, tokenizer=get_tokenizer("bytes"))
    with pytest.raises(ValueError, match="exactly one of"):
        PoPELM(tokenizer="bytes")
    with pytest.raises(ValueError, match="unknown model_args"):
        PoPELM(model=byte_model, tokenizer="bytes", temperature=3)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        PoPELM(path=str(tmp_path / "missing"), tokenizer="bytes")


def _write_tasks(tmp_path):
    data = tmp_path / "choice.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "label": a}) + "\n" for q, c, a in QUESTIONS))
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["alpha beta gamma delta " * 3, "short one."]))
    (tmp_path / "pope_local_choice.yaml").write_text(f"""
task: pope_local_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
""")
    (tmp_path / "pope_local_ppl.yaml").write_text(f"""
task: pope_local_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {texts}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: bits_per_byte
""")
    return tmp_path


@pytest.fixture(scope="module")
def task_manager(tmp_path_factory):
    """The local tasks only (indexing all of lm-eval's task files takes seconds)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(_write_tasks(tmp_path_factory.mktemp("lm_eval_tasks"))), include_defaults=False)


def test_simple_evaluate_on_local_tasks(byte_model, task_manager):
    from lm_eval import simple_evaluate

    lm = PoPELM(model=byte_model, tokenizer=get_tokenizer("bytes"), batch_size=4)
    out = simple_evaluate(
        model=lm,
        tasks=["pope_local_choice", "pope_local_ppl"],
        task_manager=task_manager,
        bootstrap_iters=0,
        log_samples=False,
    )
    accuracy = out["results"]["pope_local_choice"]["acc,none"]
    # The same accuracy computed directly: argmax over choices of log p(" " + choice | question).
    correct = 0
    for question, choices, answer in QUESTIONS:
        scores = [_direct_logprob(byte_model, list(question.encode()), list((" " + c).encode())) for c in choices]
        correct += int(max(range(len(choices)), key=scores.__getitem__) == answer)
    assert accuracy == pytest.approx(correct / len(QUESTIONS))
    word_ppl = out["results"]["pope_local_ppl"]["word_perplexity,none"]
    assert math.isfinite(word_ppl) and word_ppl > 1.0


def test_registered_under_the_name_pope():
    from lm_eval.api.registry import get_model

    assert get_model("pope") is PoPELM


def test_simple_evaluate_by_name_with_a_checkpoint_path(byte_model, tmp_path, task_manager):
    """`lm_eval --model pope --model_args path=...` route: the registry name and model_args string."""
    from lm_eval import simple_evaluate

    from pope.checkpoint import save_checkpoint

    checkpoint = save_checkpoint(
        tmp_path / "ckpt", model_state=byte_model.state_dict(), model_config=byte_model.config.to_dict()
    )
    out = simple_evaluate(
        model="pope",
        model_args=f"path={checkpoint},tokenizer=bytes",
        tasks=["pope_local_choice"],
        task_manager=task_manager,
        bootstrap_iters=0,
        log_samples=False,
        batch_size=2,
    )
    in_process = simple_evaluate(
        model=PoPELM(model=byte_model, tokenizer=get_tokenizer("bytes")),
        tasks=["pope_local_choice"],
        task_manager=task_manager,
        bootstrap_iters=0,
        log_samples=False,
    )
    assert out["results"]["pope_local_choice"]["acc,none"] == in_process["results"]["pope_local_choice"]["acc,none"]


CBT_DOCS = [
    {
        "sentences": ["Tom had a red ball .", "He gave it to Ann ."],
        "question": "Ann threw the XXXXX back .",
        "options": ["ball", "cat", "tree"],
        "answer": "ball",
    },
    {
        "sentences": ["The dog ran home ."],
        "question": "XXXXX was happy to be home .",
        "options": ["Tom", "The dog", "Ann"],
        "answer": "The dog",
    },
    {
        "sentences": ["It rained all day ."],
        "question": "Everyone stayed XXXXX",
        "options": ["inside", "wet"],
        "answer": "inside",
    },
]


def test_cbt_task_scores_candidate_plus_rest_of_question(byte_model, tmp_path, task_manager):
    """pope's CBT task on local data in the HF cam-cst/cbt format, checked against a direct computation."""
    from pope.eval.downstream import cbt_choices, cbt_context, cbt_task_config, run_downstream

    assert cbt_context(CBT_DOCS[0]) == "Tom had a red ball . He gave it to Ann . Ann threw the"
    assert cbt_choices(CBT_DOCS[0]) == ["ball back .", "cat back .", "tree back ."]
    assert (
        cbt_context(CBT_DOCS[1]) == "The dog ran home ." and cbt_choices(CBT_DOCS[1])[0] == "Tom was happy to be home ."
    )
    data = tmp_path / "cbt.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in CBT_DOCS))
    config = cbt_task_config("cn", dataset_path="json", dataset_kwargs={"data_files": {"test": str(data)}})
    lm = PoPELM(model=byte_model, tokenizer=get_tokenizer("bytes"), max_length=128)  # no truncation here
    out = run_downstream(None, tasks=[config], lm=lm, task_manager=task_manager)
    correct = 0
    for doc in CBT_DOCS:
        scores = [
            _direct_logprob(byte_model, list(cbt_context(doc).encode()), list((" " + c).encode()))
            for c in cbt_choices(doc)
        ]
        correct += int(max(range(len(scores)), key=scores.__getitem__) == doc["options"].index(doc["answer"]))
    assert out["results"]["pope_cbt_cn"]["acc,none"] == pytest.approx(correct / len(CBT_DOCS))


def test_paper_table_layout():
    from pope.eval.downstream import downstream_table, paper_row

    results = {
        "lambada_openai": {"acc,none": 0.2767},
        "blimp": {"acc,none": 0.7775},
        "pope_cbt_cn": {"acc,none": 0.45},
        "pope_cbt_ne": {"acc,none": 0.4386},
        "hellaswag": {"acc,none": 0.2918},
        "piqa": {"acc,none": 0.5958},
        "arc_easy": {"acc,none": 0.3852},
    }
    row = paper_row(results)
    assert row["CBT"] == pytest.approx(44.43) and row["Average"] == pytest.approx(
        (27.67 + 77.75 + 44.43 + 29.18 + 59.58 + 38.52) / 6
    )
    table = downstream_table({"pope-124m": row})
    assert table.splitlines()[0] == "| model | LAMBADA | BLiMP | CBT | HellaSwag | PIQA | ARC-E | Average |"
    assert "| pope-124m | 27.67 | 77.75 | 44.43 | 29.18 | 59.58 | 38.52 | 46.19 |" in table
    partial = paper_row({"piqa": {"acc,none": 0.5}})
    assert partial["PIQA"] == 50.0 and partial["Average"] is None and partial["LAMBADA"] is None


@pytest.mark.data
def test_gpt2_tokenizer_offline_and_word_boundary_split():
    """The GPT-2 tokenizer (offline files from `make data`) and the context/continuation split on it."""
    tokenizer = get_tokenizer("gpt2")
    assert tokenizer.encode("Hello world") == [15496, 995] and tokenizer.prefix_token_id == 50256
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50257, n_layer=1, n_head=1, d_model=8, max_seq_len=32, pe="pope")).eval()
    lm = PoPELM(model=model, tokenizer=tokenizer)
    context_ids, continuation_ids = lm._encode_pair("The capital of France is ", "Paris")
    assert (
        tokenizer.decode(continuation_ids) == " Paris" and tokenizer.decode(context_ids) == "The capital of France is"
    )
    ((logprob, _),) = lm.loglikelihood([_instance("loglikelihood", ("The capital of France is ", "Paris"))])
    assert logprob == pytest.approx(_direct_logprob(model, context_ids, continuation_ids), abs=1e-4)


def test_paper_downstream_rows_match_the_paper_averages():
    from pope.eval.downstream import PAPER_DOWNSTREAM, paper_downstream
    from pope.eval.report import paper_encoding

    for values in PAPER_DOWNSTREAM.values():  # the printed averages are the means of the six tasks
        assert sum(values[:6]) / 6 == pytest.approx(values[6], abs=0.006)
    assert paper_encoding("owt-124m", "pope:delta_init=zero") == "pope"
    assert paper_downstream("owt-124m", "pope")["CBT"] == 44.43 and paper_downstream("jsb", "pope") is None


def test_eval_downstream_cli_on_a_local_task(byte_model, tmp_path, capsys):
    from pope.checkpoint import save_checkpoint
    from pope.cli import main

    checkpoint = save_checkpoint(
        tmp_path / "run" / "checkpoints" / "last",
        model_state=byte_model.state_dict(),
        model_config=byte_model.config.to_dict(),
    )
    (tmp_path / "tasks").mkdir()
    _write_tasks(tmp_path / "tasks")
    assert (
        main(
            [
                "eval",
                "downstream",
                str(tmp_path / "run"),
                "--tasks",
                "pope_local_choice",
                "--include-path",
                str(tmp_path / "tasks"),
                "--tokenizer",
                "bytes",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "| model | LAMBADA | BLiMP | CBT | HellaSwag | PIQA | ARC-E | Average |" in printed
    saved = json.loads((tmp_path / "run" / "eval" / "downstream.json").read_text())
    accuracy = saved["results"]["pope_local_choice"]["acc,none"]
    assert f"pope_local_choice: {100 * accuracy:.2f}" in printed and saved["git_commit"]
    assert checkpoint.exists()


def test_downstream_indexes_lm_evals_own_tasks_only_when_a_task_needs_them():
    """With --include-path, lm-eval's own task files (seconds to index) are read only when a task asked for is not
    defined in the included folder."""
    from types import SimpleNamespace

    from pope.eval.downstream import _task_manager

    made = []

    class Manager:  # records what run_downstream asks lm-eval's TaskManager for
        def __init__(self, include_path=None, include_defaults=True):
            made.append((include_path, include_defaults))
            self.all_subtasks = ["pope_local_choice"] + (["lambada_openai"] if include_defaults else [])

    module = SimpleNamespace(TaskManager=Manager)
    assert _task_manager(module, "tasks", ["pope_local_choice"]).all_subtasks == ["pope_local_choice"]
    assert made == [("tasks", False)]
    made.clear()
    assert "lambada_openai" in _task_manager(module, "tasks", ["pope_local_choice", "lambada_openai"]).all_subtasks
    assert made == [("tasks", False), ("tasks", True)]
    made.clear()
    _task_manager(module, "tasks", [{"task": "cbt_cn"}])  # a task config (pope's CBT) is never looked up locally
    assert made[-1] == ("tasks", True)
    made.clear()
    _task_manager(module, None, ["pope_local_choice"])
    assert made == [(None, True)]


# ------------------------------------------------------------------ pope.hf model directories
@pytest.fixture(scope="module")
def hf_model_dir(tmp_path_factory):
    """A tiny PoPELlama (byte vocabulary) saved with save_pretrained, and a WordLevel tokenizer beside it."""
    pytest.importorskip("transformers", reason="transformers is part of the [hf] extra")
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    import pope.hf

    torch.manual_seed(0)
    config = pope.hf.PoPELlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pope_delta_init="uniform",
        bos_token_id=1,
        eos_token_id=2,
    )
    model = pope.hf.PoPELlamaForCausalLM(config).eval()
    directory = tmp_path_factory.mktemp("hf_model")
    model.save_pretrained(directory)
    words = sorted({w for q, c, _ in QUESTIONS for w in (q.split() + c)})
    raw = RawTokenizer(
        models.WordLevel(
            {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}, unk_token="<unk>"
        )
    )
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(
        directory
    )
    return directory, model


def test_hf_model_directory_scores_like_the_model(hf_model_dir, task_manager):
    """PoPELM(path=<save_pretrained dir>): loglikelihoods equal direct sums with the HF model; generate_until is
    greedy through the transformers cache."""
    from lm_eval import simple_evaluate

    from pope.eval.lm_eval_model import HFCausalLM

    directory, model = hf_model_dir
    lm = PoPELM(path=str(directory), tokenizer="bytes", batch_size=2)
    assert isinstance(lm.model, HFCausalLM) and lm.max_length == 64
    adapter = HFCausalLM(model)
    ((logprob, _),) = lm.loglikelihood([_instance("loglikelihood", ("The cat sat on the", " mat"))])
    assert logprob == pytest.approx(_direct_logprob(adapter, list(b"The cat sat on the"), list(b" mat")), abs=1e-4)
    (text,) = lm.generate_until([_instance("generate_until", ("Hello", {"until": ["\n\n"], "max_gen_toks": 5}))])
    ids = list(b"Hello")
    with torch.no_grad():
        for _ in range(5):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert text == bytes(ids[5:]).decode("utf-8", errors="replace").split("\n\n")[0]
    out = simple_evaluate(
        model=lm, tasks=["pope_local_choice"], task_manager=task_manager, bootstrap_iters=0, log_samples=False
    )
    correct = 0
    for question, choices, answer in QUESTIONS:
        scores = [_direct_logprob(adapter, list(question.encode()), list((" " + c).encode())) for c in choices]
        correct += int(max(range(len(choices)), key=scores.__getitem__) == answer)
    assert out["results"]["pope_local_choice"]["acc,none"] == pytest.approx(correct / len(QUESTIONS))


def test_hf_directory_tokenizer_and_downstream_output_path(hf_model_dir, tmp_path, task_manager):
    from pope.eval.downstream import run_downstream, write_downstream

    directory, _ = hf_model_dir
    lm = PoPELM(path=str(directory), tokenizer="hf")
    assert lm.tokenizer.prefix_token_id == 1 and lm.tokenizer.stop_token_id == 2
    context, continuation = lm._encode_pair("The cat sat on the", " mat")
    assert len(context) == 5 and len(continuation) == 1 and 0 not in context + continuation  # all known words
    out = run_downstream(
        str(directory), tasks=["pope_local_choice"], tokenizer="hf", batch_size=2, task_manager=task_manager
    )
    assert 0.0 <= out["results"]["pope_local_choice"]["acc,none"] <= 1.0
    written = write_downstream(str(directory), out, "tiny", output=tmp_path / "sub" / "downstream.json")
    assert json.loads(written.read_text())["label"] == "tiny"
    with pytest.raises(ValueError, match="is a directory"):
        write_downstream(str(directory), out, "tiny", output=tmp_path)
    with pytest.raises(ValueError, match="tokenizer=hf"):
        PoPELM(model=hf_model_dir[1], tokenizer="hf")
