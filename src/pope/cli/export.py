"""`pope export hf RUN OUT`: a trained run as a transformers model directory (thin: parsing over pope.hf.export)."""

from __future__ import annotations

import argparse
import sys

EXPORT_TOKENIZERS = ("auto", "gpt2", "bytes", "none")  # pope.hf.export.TOKENIZERS (that module imports transformers)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a trained run in another format (hf: a transformers model directory)",
        description="Write a trained run in another format. See docs/hf.md.",
    )
    formats = parser.add_subparsers(dest="export_command", metavar="FORMAT")
    parser.set_defaults(func=lambda args: _usage(parser))
    hf = formats.add_parser(
        "hf",
        help="a transformers model directory that AutoModelForCausalLM, pipeline and lm-eval's --model hf load "
        "with trust_remote_code=True",
        description="Write RUN's model (its best checkpoint if it has one, else its last; or a checkpoint "
        "directory) as a new transformers model directory OUT: the same network and weights (logits equal), "
        "the remote code that loads it in any process with pope-attention installed, and a tokenizer where the "
        "run has a text one. Then: lm_eval --model hf --model_args pretrained=OUT,trust_remote_code=True ...",
    )
    hf.add_argument("run", help="run or checkpoint directory (pope train)")
    hf.add_argument("out", help="new directory to write (an existing non-empty one is refused)")
    hf.add_argument(
        "--tokenizer",
        choices=EXPORT_TOKENIZERS,
        default="auto",
        help="tokenizer to write beside the model: gpt2 (GPT-2 BPE, offline files of `make data`), bytes (UTF-8 "
        "bytes as ids 0..255), none; auto (default): gpt2 for a 50257-id vocabulary, else none",
    )
    hf.set_defaults(func=_export_hf)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _export_hf(args: argparse.Namespace) -> int:
    from pope.hf.export import export_run  # imports transformers: only for this command

    # A redirected log gets the summary lines, not transformers' progress-bar frames.
    record = export_run(args.run, args.out, tokenizer=args.tokenizer, progress_bars=sys.stderr.isatty())
    print(f"wrote {args.out}: {record['model_type']} ({record['pe']}), step {record['source']['step']} of {args.run}")
    if record["tokenizer"] == "none":
        print(
            "no tokenizer written (the run's vocabulary is not text); lm-eval needs one: add tokenizer=NAME to "
            "--model_args"
        )
    print(f"load it with: AutoModelForCausalLM.from_pretrained({str(args.out)!r}, trust_remote_code=True)")
    print(f"score it with: lm_eval --model hf --model_args pretrained={args.out},trust_remote_code=True --tasks ...")
    return 0
