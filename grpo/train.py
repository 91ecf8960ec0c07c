"""
MUTABLE: GRPO fine-tuning of the base model on GSM8K train. The agent edits this file (and only this file).

Usage (cwd = grpo/):
    python train.py > run.log 2>&1

Trains for prepare.time_budget() seconds (TIME_BUDGET, or AUTORESEARCH_TIME_BUDGET for smoke runs), then
hands the policy to the frozen evaluator, prepare.evaluate_and_report: it saves the weights when the harness
asks (AUTORESEARCH_ARTIFACT; the harness scores them in a separate process) and, run standalone, scores
greedy pass@1 on the fixed test subset here and prints the summary block, pass@1 first.

GRPO (Group Relative Policy Optimization, Shao et al. 2024, "DeepSeekMath", section 4.1): for each question,
sample G answers; each answer's advantage is its reward normalised by the mean and std of its group, so no
value network is needed; the policy maximises the PPO-style clipped surrogate of the token probability
ratio, minus beta times a KL penalty to a frozen reference model, estimated per token with the k3 estimator
(Schulman 2020, "Approximating KL Divergence").

Memory on one 80 GB GPU with Qwen2.5-0.5B (~0.5B parameters, vocabulary 151,936):
  - policy weights in float32 (2 GB) + gradients (2 GB) + AdamW moments (4 GB); forward passes run under
    bf16 autocast, so the fp32 copy only serves as master weights that keep small updates from rounding away;
  - the frozen reference in bf16 (1 GB), loaded only when KL_COEF > 0;
  - rollouts: PROMPTS_PER_STEP x GROUP_SIZE = 128 sequences of up to ~1k tokens in one generate() call; with GQA
    the KV cache is ~12 KB per token, ~1.5 GB for 128 sequences;
  - the loss pass: logits are [MICRO_BATCH, completion tokens, vocabulary]; only completion positions are
    computed (logits_to_keep) and MICRO_BATCH=16 keeps them at ~16 x 384 x 151936 x 4 B = 3.7 GB in float32
    (plus the softmax kept for backward). Raise MICRO_BATCH only with memory to spare.
  Estimated total ~25-35 GB peak (not yet measured on a GPU), so there is headroom; peak_vram_mb in the
  summary reports the real figure. On CPU everything runs in float32 without autocast.
"""

import os
import random
import time
from dataclasses import dataclass

import torch

from prepare import (build_prompt, eos_ids, evaluate_and_report, get_device, load_model, load_problems, reward,
                     time_budget)

# ---------------------------------------------------------------------------
# Hyperparameters (edit these directly, no CLI flags needed)
# ---------------------------------------------------------------------------

# "cuda" is the real target (Qwen2.5-0.5B). On a CPU only tiny.py's offline stand-in is practical, and its
# smoke runs last ~30 s: the cpu branch exists so that they show learning, not to be tuned.
PROFILE = get_device().type

if PROFILE == "cpu":
    PROMPTS_PER_STEP = 8         # small steps, 0.5-1 s each on one core: ~50 in a 30 s smoke run
    MAX_COMPLETION_TOKENS = 16   # the stand-in answers "#### k" in 7 tokens
    LEARNING_RATE = 1e-3         # a ~0.1M-parameter model from scratch: 2e-6 leaves it unchanged (KL 0) for a run
else:
    PROMPTS_PER_STEP = 16        # distinct questions per GRPO step
    MAX_COMPLETION_TOKENS = 384  # rollout length cap; the evaluator always allows prepare.MAX_NEW_TOKENS
    LEARNING_RATE = 2e-6
GROUP_SIZE = 8               # G: sampled answers per question (the group that normalises advantages)
TEMPERATURE = 1.0            # rollout sampling temperature (the loss uses the same temperature)
ADAM_BETAS = (0.9, 0.99)
WEIGHT_DECAY = 0.0
GRAD_CLIP = 1.0              # max global gradient norm
CLIP_EPS = 0.2               # PPO clip range: the ratio pi/pi_old is kept in [1 - eps, 1 + eps]
KL_COEF = 0.04               # beta of the KL penalty to the frozen reference (DeepSeekMath's value); 0 disables it
PPO_EPOCHS = 1               # optimiser passes over each batch of rollouts (ratio = 1 on the first pass)
MICRO_BATCH = 16             # sequences per forward/backward in the loss pass (bounds the logits' memory)
ADV_EPS = 1e-4               # added to the group std so that a group of identical rewards gives advantage 0
SEED = int(os.environ.get("AUTORESEARCH_SEED", "42"))   # sampling and data order; the harness varies it between runs

# ---------------------------------------------------------------------------
# GRPO
# ---------------------------------------------------------------------------


@dataclass
class Rollouts:
    input_ids: torch.Tensor        # [N, P + C] int64: left-padded prompt, then the completion (right-padded)
    attention_mask: torch.Tensor   # [N, P + C] int64: 1 on real prompt tokens and on completion_mask tokens
    completion_mask: torch.Tensor  # [N, C] float32: 1 on completion tokens up to and including the first eos
    rewards: torch.Tensor          # [N] float32: prepare.reward of each decoded completion
    texts: list                    # N decoded completions


@torch.no_grad()
def sample_rollouts(model, tokenizer, problems, group_size: int, max_new_tokens: int,
                    temperature: float) -> Rollouts:
    """Sample `group_size` completions for each problem (N = len(problems) * group_size, grouped
    contiguously: rows g*G .. g*G+G-1 answer problems[g]) and score them with the frozen reward."""
    device = next(model.parameters()).device
    prompts = [build_prompt(tokenizer, p.question) for p in problems for _ in range(group_size)]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    model.eval()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
        out = model.generate(**batch, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                             max_new_tokens=max_new_tokens)
    completion = out[:, batch["input_ids"].shape[1]:]
    # Keep tokens up to and including the first eos; generate() pads finished rows after it.
    is_eos = torch.isin(completion, torch.tensor(eos_ids(model), device=device))
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    completion_mask = (~after_eos).float()
    texts = [tokenizer.decode(row[mask.bool()], skip_special_tokens=True)
             for row, mask in zip(completion, completion_mask)]
    golds = [p.gold for p in problems for _ in range(group_size)]
    rewards = torch.tensor([reward(t, g) for t, g in zip(texts, golds)], device=device)
    attention_mask = torch.cat([batch["attention_mask"], completion_mask.long()], dim=1)
    return Rollouts(out, attention_mask, completion_mask, rewards, texts)


def completion_logprobs(model, input_ids, attention_mask, num_completion: int, temperature: float) -> torch.Tensor:
    """log pi(token) of the last `num_completion` tokens of each row, [N, C] float32, under `temperature`.

    Position ids count real tokens only, matching what generate() used for the left-padded prompts.
    Only the completion positions get logits (logits_to_keep), which is most of the memory saving.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    device_type = input_ids.device.type
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device_type == "cuda"):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       logits_to_keep=num_completion + 1).logits
    logits = logits[:, :-1].float() / temperature       # position t predicts token t + 1
    targets = input_ids[:, -num_completion:]
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = ADV_EPS) -> torch.Tensor:
    """A_i = (r_i - mean(group)) / (std(group) + eps) for [N] rewards in contiguous groups of `group_size`.

    DeepSeekMath's outcome-supervision advantage (every token of answer i gets A_i). std is the unbiased
    sample std; a group whose rewards are all equal gets advantage 0 (it carries no preference).
    """
    groups = rewards.view(-1, group_size)
    advantages = (groups - groups.mean(dim=1, keepdim=True)) / (groups.std(dim=1, keepdim=True) + eps)
    return advantages.view(-1)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref) from samples of pi: exp(ref - logp) - (ref - logp) - 1.

    Same shape as the inputs; always >= 0 and unbiased (Schulman 2020, "Approximating KL Divergence").
    """
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_eps: float, kl_coef: float) -> torch.Tensor:
    """Per-sequence GRPO loss, [n] float32 (the caller averages over sequences).

    logp, old_logp, ref_logp: [n, C] token log-probs under the policy (with grad), the policy that sampled
    the rollouts, and the frozen reference (ref_logp may be None when kl_coef == 0). advantages: [n].
    mask: [n, C] float, 1 on completion tokens. Per token, with ratio = exp(logp - old_logp):
        surrogate = min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)
        loss_t    = -(surrogate - kl_coef * kl_k3(logp, ref_logp))
    and each sequence's loss is the mean over its own tokens (DeepSeekMath eq. 3's 1/|o_i|).
    """
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(1)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    per_token = -surrogate
    if kl_coef > 0:
        per_token = per_token + kl_coef * kl_k3(logp, ref_logp)
    return (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def grpo_step(policy, reference, optimizer, tokenizer, problems, group_size=GROUP_SIZE,
              max_new_tokens=MAX_COMPLETION_TOKENS, temperature=TEMPERATURE, clip_eps=CLIP_EPS, kl_coef=KL_COEF,
              ppo_epochs=PPO_EPOCHS, micro_batch=MICRO_BATCH, grad_clip=GRAD_CLIP) -> dict:
    """One GRPO iteration on `problems`: sample groups, score, compute advantages, update the policy.

    Returns statistics: mean reward, fraction of groups with any reward spread (only those carry signal),
    loss, mean per-token KL to the reference before the update (0 without one), mean completion length.
    """
    rollouts = sample_rollouts(policy, tokenizer, problems, group_size, max_new_tokens, temperature)
    advantages = group_advantages(rollouts.rewards, group_size)
    n, c = rollouts.completion_mask.shape
    chunks = [slice(i, i + micro_batch) for i in range(0, n, micro_batch)]

    def logprobs(model, s):
        return completion_logprobs(model, rollouts.input_ids[s], rollouts.attention_mask[s], c, temperature)

    with torch.no_grad():  # the sampling policy's and the reference's log-probs are fixed targets
        old_logp = torch.cat([logprobs(policy, s) for s in chunks])
        ref_logp = torch.cat([logprobs(reference, s) for s in chunks]) if kl_coef > 0 else None
    policy.train()
    total_loss = 0.0
    for _ in range(ppo_epochs):
        for s in chunks:
            loss = grpo_loss(logprobs(policy, s), old_logp[s], None if ref_logp is None else ref_logp[s],
                             advantages[s], rollouts.completion_mask[s], clip_eps, kl_coef).sum() / n
            loss.backward()  # gradients accumulate over micro-batches to the batch mean
            total_loss += loss.item()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    policy.eval()
    mask = rollouts.completion_mask
    kl = (kl_k3(old_logp, ref_logp) * mask).sum().item() / mask.sum().item() if ref_logp is not None else 0.0
    spread = (rollouts.rewards.view(-1, group_size).std(dim=1) > 0).float().mean().item()
    return {"reward": rollouts.rewards.mean().item(), "spread": spread, "loss": total_loss / ppo_epochs, "kl": kl,
            "length": mask.sum(dim=1).mean().item()}


# ---------------------------------------------------------------------------
# Training loop
# ---------------------------------------------------------------------------

if __name__ == "__main__":
    t_start = time.time()
    random.seed(SEED)
    torch.manual_seed(SEED)
    device = get_device()
    budget, _ = time_budget()
    if GROUP_SIZE < 2:
        raise SystemExit(f"GROUP_SIZE={GROUP_SIZE}: GRPO needs at least 2 samples per question to compare them")

    # float32 master weights everywhere; on cuda the forward passes autocast to bf16 (see the docstring)
    policy, tokenizer = load_model(device, dtype=torch.float32)
    reference = None
    if KL_COEF > 0:
        reference, _ = load_model(device)  # bf16 on cuda
        reference.requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=LEARNING_RATE, betas=ADAM_BETAS,
                                  weight_decay=WEIGHT_DECAY)
    train = load_problems("train")
    order = []

    step, training_seconds, stats = 0, 0.0, {}
    # The budget is checked before each step, so the last step may end up to one step past it.
    while training_seconds < budget:
        t0 = time.time()
        if len(order) < PROMPTS_PER_STEP:  # reshuffle once per pass over the training set
            order += random.sample(range(len(train)), len(train))
        problems = [train[i] for i in order[:PROMPTS_PER_STEP]]
        del order[:PROMPTS_PER_STEP]
        stats = grpo_step(policy, reference, optimizer, tokenizer, problems)
        if device.type == "cuda":
            torch.cuda.synchronize()
        training_seconds += time.time() - t0
        step += 1
        # loss is ~0 by construction on the first PPO epoch (ratio 1, advantages sum to 0 per group): the
        # reward and kl columns are the ones that show learning
        print(f"step {step:04d} | reward {stats['reward']:.3f} | spread {stats['spread']:.2f} | "
              f"loss {stats['loss']:+.4f} | kl {stats['kl']:.4f} | length {stats['length']:.0f} | "
              f"{training_seconds:.0f}/{budget:.0f}s", flush=True)

    evaluate_and_report(
        policy, tokenizer,
        training_seconds=f"{training_seconds:.1f}",
        total_seconds=f"{time.time() - t_start:.1f}",
        num_steps=step,
        last_reward=f"{stats.get('reward', 0.0):.4f}",
        device=device.type,
    )
