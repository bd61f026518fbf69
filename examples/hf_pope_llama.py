"""A PoPE Llama in Hugging Face transformers: build, train a few Trainer steps, generate, save and reload.

    pip install 'pope-attention[hf]'
    python examples/hf_pope_llama.py [--out DIR] [--steps N]

Tiny config, byte-level tokens, CPU in seconds (the fused Triton kernels run instead on a CUDA GPU).
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments

import pope.hf  # registers "pope_llama" with AutoConfig / AutoModelForCausalLM

TEXT = "PoPE separates what from where: magnitudes carry content, phases carry position. " * 8


class ByteChunks(torch.utils.data.Dataset):
    """Fixed-length windows of a text's UTF-8 bytes (token ids 0..255), labels = inputs (the model shifts them)."""

    def __init__(self, text: str, length: int):
        ids = torch.tensor(list(text.encode()))
        self.windows = ids.unfold(0, length, length // 2)  # (N, length)

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, i):
        return {"input_ids": self.windows[i], "labels": self.windows[i]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        default=None,
        help="directory for the Trainer's output and the saved model (default: a temporary directory)",
    )
    parser.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    llama = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    config = pope.hf.from_llama_config(llama, delta_init="zero")  # the PoPE twin of this Llama config
    model = pope.hf.PoPELlamaForCausalLM(config)
    out = args.out or tempfile.mkdtemp(prefix="pope-hf-")
    training = TrainingArguments(
        output_dir=out,
        max_steps=args.steps,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        warmup_steps=0,
        logging_steps=max(1, args.steps // 3),
        report_to=[],
        save_strategy="no",
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training, train_dataset=ByteChunks(TEXT, 64))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print(f"training loss: {' -> '.join(f'{loss:.3f}' for loss in losses)}")

    model.eval()
    prompt = torch.tensor([list(b"PoPE separates ")], device=model.device)
    generated = model.generate(prompt, max_new_tokens=24, do_sample=False, pad_token_id=0)
    text = bytes(generated[0, prompt.shape[1] :].tolist()).decode(errors="replace")
    print(f"greedy continuation: {text!r}")

    model.save_pretrained(out)
    reloaded = AutoModelForCausalLM.from_pretrained(out)  # works because pope.hf is imported
    same = torch.equal(reloaded.generate(prompt, max_new_tokens=24, do_sample=False, pad_token_id=0), generated)
    print(f"saved to {out}; reloaded as {type(reloaded).__name__}, same generation: {same}")
    return {"losses": losses, "continuation": text, "same_after_reload": same, "out": out}


if __name__ == "__main__":
    main()
