"""
HELPER (not part of the experiment loop): a tiny offline stand-in for the GRPO target's model and data.

Writes a tiny Qwen2 model (randomly initialised from a config, ~0.1M parameters) with a byte-level
tokenizer and a chat template, and a GSM8K-format task of one-digit sums, so that the whole target
(prepare.py --source / --check / --preflight, train.py, agent.py --target grpo) runs offline on a CPU.
The model is warm-started on the answer format only ("#### k" with k a guess from GUESSES, whatever the
question): it then stops after one line and guesses, greedy decoding says 7 to every question, and samples
cover every digit. That gives chance-level, non-degenerate rewards, and a first lesson GRPO learns within
seconds on a CPU: 9, the most common sum, pays off twice as often as 7 (the sums themselves take far
longer). With --warm-start-steps 0 it stays random, and the preflight gate must refuse it on GSM8K. The
tests import these functions.

Usage (cwd = grpo/):
    uv run tiny.py --out /tmp/grpo-tiny     # -> /tmp/grpo-tiny/model and /tmp/grpo-tiny/sums/{train,test}.jsonl
"""

import argparse
import json
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from prepare import build_prompt

# Same special tokens as Qwen2.5-Instruct, so the chat layout (and eos = <|im_end|>) matches the real model.
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# The warm start's answers, drawn uniformly: every digit once, 7 four times. 7 is then the greedy choice, right for
# ~14 % of the sums (preflight needs some right), and it is not the best guess: 9 is (~29 %), for GRPO to find.
GUESSES = tuple(range(10)) + (7,) * 3
CHAT_TEMPLATE = (
    "{% for m in messages %}" + IM_START + "{{ m['role'] }}\n{{ m['content'] }}" + IM_END + "\n{% endfor %}"
    "{% if add_generation_prompt %}" + IM_START + "assistant\n{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer (256 byte tokens, no merges, + 3 specials): any text encodes, nothing is unknown."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([PAD, IM_START, IM_END])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=IM_END, pad_token=PAD)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer, seed: int = 0) -> Qwen2ForCausalLM:
    """A randomly initialised 2-layer Qwen2 (hidden 64, GQA 4/2 heads), float32, seeded."""
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def digit_sums(n: int, seed: int, total: int | None = None) -> list[dict]:
    """n GSM8K-format records "What is a + b?" with one-digit a, b and a + b <= 9 (so the answer is one digit).

    With `total`, every question has a + b == total: the "always answer `total`" task the learning test uses.
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a = rng.randint(0, 9 if total is None else total)
        b = rng.randint(0, 9 - a) if total is None else total - a
        rows.append({"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"})
    return rows


def write_task(out: Path, n_train: int = 2000, n_test: int = 100, seed: int = 0) -> Path:
    """Write out/train.jsonl and out/test.jsonl of digit_sums (different seeds); returns out."""
    out.mkdir(parents=True, exist_ok=True)
    for split, n, s in (("train", n_train, seed), ("test", n_test, seed + 1)):
        with open(out / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in digit_sums(n, s))
    return out


def warm_start(model, tokenizer, rows: list[dict], steps: int = 100, lr: float = 3e-3, seed: int = 0,
               answers: tuple = GUESSES) -> None:
    """Supervised steps (batches of 16) on prompt(question of a random row) -> "#### k" + eos, k drawn
    uniformly from `answers`, whatever the question.

    Teaches the answer format and stopping, not the task: afterwards the model guesses from `answers`, and
    greedy decoding gives the most frequent one (7 for GUESSES). Loss = cross-entropy on the completion
    tokens only (prompt labels are -100).
    """
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        questions = [rng.choice(rows)["question"] for _ in range(16)]
        guesses = [rng.choice(answers) for _ in questions]
        prompts = [tokenizer(build_prompt(tokenizer, q), add_special_tokens=False)["input_ids"] for q in questions]
        targets = [tokenizer(f"#### {a}", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                   for a in guesses]
        width = max(len(p) + len(t) for p, t in zip(prompts, targets))
        ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
        labels = torch.full((len(prompts), width), -100)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, (p, t) in enumerate(zip(prompts, targets)):  # right padding is fine for teacher forcing
            ids[i, :len(p) + len(t)] = torch.tensor(p + t)
            labels[i, len(p):len(p) + len(t)] = torch.tensor(t)
            mask[i, :len(p) + len(t)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()


def make_tiny(out: Path, warm_start_steps: int = 100, seed: int = 0) -> tuple[Path, Path]:
    """Write out/model (tokenizer + model) and out/sums (the task). Returns (model_dir, task_dir)."""
    task = write_task(out / "sums", seed=seed)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=seed)
    if warm_start_steps:
        warm_start(model, tokenizer, digit_sums(500, seed + 2), steps=warm_start_steps, seed=seed)
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    return out / "model", task


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(description="Write a tiny offline model and a one-digit-sums task.")
    parser.add_argument("--out", type=Path, required=True, help="output directory (model/ and sums/ go inside)")
    parser.add_argument("--warm-start-steps", type=int, default=100, help="format-only supervised steps (0: random)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model_dir, task_dir = make_tiny(args.out, args.warm_start_steps, args.seed)
    print(f"model: {model_dir}\ntask:  {task_dir}\n"
          f"next:  export AUTORESEARCH_GRPO_MODEL={model_dir}; uv run prepare.py --source {task_dir}\n"
          "       (add --force if $AUTORESEARCH_CACHE already holds data from another source)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
