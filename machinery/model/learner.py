"""The policy as training drives it: generation with the weights gathered (FSDP2), the log-probs of the policy
and the frozen reference, a loss's backward in micro-batches with every rank running the same number (a rank
with fewer rows runs zero-weight stand-ins) and the gradient normalised over every rank (`Learner`); AdamW with
App. D's cosine schedule, one per stage (`Optim`)."""
from __future__ import annotations

import math
import warnings
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from machinery import distributed
from machinery.datasets import data
from machinery.model import parallel, policy


@runtime_checkable
class LearnerSettings(Protocol):
    """What the optimiser and the SFT backward read of a run's settings (train.Config's fields of these names)."""
    weight_decay: float       # AdamW's
    max_grad_norm: float      # the gradient norm clip
    micro_batch_size: int     # rows per forward/backward (0: all at once)
    frames: int               # a stand-in prompt's blank video: frames
    max_pixels: int           # ... and pixels per frame


@dataclass
class Optim:
    """AdamW over the trainable parameters (fp32: FSDP2's sharded master weights, or LoRA's adapters; fused on
    CUDA) with App. D's cosine schedule from lr to 0 over the stage. One per stage: SFT's is dropped before RL."""
    params: list
    opt: Any
    sched: Any
    max_grad_norm: float

    @classmethod
    def make(cls, cfg: LearnerSettings, model, lr, total_steps, device, restart=0, restart_lr=0.0):
        """`restart`: the schedule starts again at that step (SFT's answerability part), from `restart_lr` (0: lr)."""
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay, fused=device.type == "cuda")

        def cosine(step):
            again = 0 < restart <= step
            start, end = (restart, total_steps) if again else (0, restart or total_steps)
            peak = (restart_lr or lr) / lr if again else 1.0
            return peak * 0.5 * (1 + math.cos(math.pi * min(step - start, end - start) / max(end - start, 1)))
        return cls(params, opt, torch.optim.lr_scheduler.LambdaLR(opt, cosine), cfg.max_grad_norm)

    def step(self, trained: bool):
        """One optimiser step on the accumulated gradients (already the mean over every rank's trained rows:
        parallel.backward_micro_batches), clipped; skipped when no rank trained anything, and then the schedule
        does not advance either (it counts updates, not steps)."""
        if trained:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            self.opt.step()
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
                self.sched.step()
        self.opt.zero_grad(set_to_none=True)

    @property
    def updates(self) -> int:
        """Optimiser updates so far in this stage (the schedule's position; saved with it)."""
        return self.sched.last_epoch


class Learner:
    """The policy in the RL update: `model` (FSDP2-sharded or plain) generates; forward and backward go through
    `train_model` (the DDP wrapper, else the model); `ref_model` is the frozen reference of the KL (None: with
    LoRA, the policy's own frozen reference adapter, or its adapters off before any SFT; with beta 0 none is
    needed: policy.reference_logprobs). `stand_in()`: a one-row prompt for a rank that trains
    nothing this step."""

    def __init__(self, model, processor, device, micro_batch_size, temperature=1.0, beta=0.0, train_model=None,
                 ref_model=None, stand_in=None):
        self.model, self.processor, self.device = model, processor, device
        self.micro_batch_size, self.temperature, self.beta = micro_batch_size, temperature, beta
        self.train_model, self.ref_model, self.stand_in = train_model or model, ref_model, stand_in
        self.engine = None   # --rollout-engine vllm: the rank's engine (engine.py; train.run_rl builds it)

    @torch.no_grad()
    def rollout(self, inputs, n, max_new_tokens, top_p, messages, views):
        """policy.rollout of the prompt batch `inputs`; with a rollout engine (--rollout-engine vllm), the engine's
        on the same chat `messages` and frames (`views`)."""
        sampling = dict(max_new_tokens=max_new_tokens, temperature=self.temperature, top_p=top_p)
        if self.engine is not None:
            return self.engine.rollout(self.model, messages, views, inputs, n, **sampling)
        return policy.rollout(self.model, self.processor, inputs, n=n, **sampling)

    def generating(self, *others):
        """The weights gathered for a generation phase (FSDP2: once, not per layer and token); no-op otherwise."""
        return parallel.gathered(self.model, *others)

    def anywhere(self, flag) -> bool:
        """`flag` on any rank (a phase that gathers the weights is entered by every rank or none)."""
        return bool(distributed.all_sum([float(flag)], self.device)[0])

    def logprobs(self, inputs, ids, mask, old=None, ref=None):
        """(log F_theta, log F_theta_old, log F_ref) per completion token: `old` and `ref` as given (kept from an
        earlier update on these rollouts), else the current policy's (detached) and the reference's (the
        policy's when beta is 0: no KL term)."""
        logp = policy.token_logprobs(self.train_model, inputs, ids, mask, temperature=self.temperature)
        if ref is None and self.beta > 0:
            ref = policy.reference_logprobs(parallel.unwrap(self.train_model), inputs, ids, mask,
                                            ref_model=self.ref_model, temperature=self.temperature)
            parallel.release(self.ref_model)  # FSDP2 keeps a root gathered after a forward without backward
        old = logp.detach() if old is None else old.to(logp.device)
        ref = logp.detach() if ref is None else ref.to(logp.device)
        return logp, old, ref

    def backward(self, loss, rollout, rows, adv, count, kept=None):
        """`loss(logp, old, ref, adv, mask, denominator, world) -> (its term of the step's loss, stats)` (train.RL.loss:
        Eq. 7 normalised by grpo.aggregate) on the completions `rows` of `rollout` (advantages `adv`, one per row),
        backward in micro-batches, the terms added; `count`: this rank's part of the step's denominator, which sums
        every rank's. `kept` (several updates per generation): a dict the first update fills with each
        micro-batch's old and reference log-probs, and the later ones read. Returns (this rank's mean loss and
        stats, the rows of all ranks)."""
        self.train_model.train()
        rows, sums = torch.as_tensor(rows, dtype=torch.long), defaultdict(float)
        base = parallel.unwrap(self.train_model)

        def batch(part):
            if part is None and not len(rows):  # this rank trains nothing this step: a blank video, at weight 0
                return self.stand_in(), *policy.target_ids(self.processor, [""]), torch.zeros(1)
            part = part if part is not None else slice(0, 1)  # fewer micro-batches than another rank: weight 0
            r = rows[part]
            return rollout.row_inputs(r), rollout.completion_ids[r], rollout.completion_mask[r], adv[part]

        def backward(part, denominator):
            x, ids, mask, a = batch(part)
            reuse = kept is not None and part is not None and part.start in kept
            old, ref = kept[part.start] if reuse else (None, None)
            logp, old, ref = self.logprobs(policy._to(x, policy.model_device(base)), ids, mask, old, ref)
            term, stats = loss(logp, old, ref, a.to(logp.device), mask.to(logp.device), denominator, parallel.world())
            (term if part is not None else term * 0.0).backward()   # (a stand-in adds nothing)
            if self.engine is not None:   # the sync check (every micro-batch: FSDP2's extra forwards pair up)
                fresh = part is not None and not reuse and rollout.engine_logprobs is not None
                self.engine.measure(self.train_model, x, ids, mask, logp,
                                    rollout.engine_logprobs[rows[part]] if fresh else None, self.temperature)
            if kept is not None and part is not None and not reuse:
                kept[part.start] = (old, ref)   # (the micro-batches are the same slices at every update)
            if part is not None:
                for key, v in stats.items():
                    sums[key] += v * len(ids)

        n = parallel.backward_micro_batches(len(rows), self.micro_batch_size, backward, self.device, count)
        return {k: v / len(rows) for k, v in sums.items()} if len(rows) else {}, n

    def update(self, backward, parts, count, optim, mu, draws):
        """`mu` optimiser steps, each on one gradient of the step's `parts` [(rollout, rows, advantages)]:
        `backward(rollout, rows, adv, kept=, count=)` per part, all with `count`, this rank's part of the step's
        denominator (grpo.count of all its parts), so the parts sum to one loss divided once. Each rank pads its
        parts to the most any rank has (at most `draws`), so every rank runs as many backward passes. Returns (the
        stats' means over the rows and the mu steps, this rank's rows)."""
        ranks_with = distributed.all_sum([float(len(parts) > k) for k in range(draws)], self.device)
        parts = list(parts) + [(None, [], torch.zeros(0))] * (sum(n > 0 for n in ranks_with) - len(parts))
        n_rows = sum(len(rows) for _, rows, _ in parts)
        kept, sums = [({} if mu > 1 else None) for _ in parts], defaultdict(float)
        if self.engine is not None:
            self.engine.sleep()   # (CUDA: the engine's memory is the update's)
        for _ in range(mu):
            total = 0
            for (rollout, rows, adv), keep in zip(parts, kept):
                stats, n = backward(rollout, rows, adv, kept=keep, count=count)
                total += n
                for key, v in stats.items():
                    sums[key] += v * len(rows) / n_rows / mu
            optim.step(total > 0)
        gap = -1.0
        if self.engine is not None:
            gap = self.engine.guard.close_step(self.device)   # (stops the run when the engine is not the policy)
            self.engine.sync(self.model)   # the next rollouts sample from the updated policy, never a stale one
        return {**sums, "engine_logprob_gap": gap}, n_rows


def stand_in(cfg: LearnerSettings, processor, observer, sample):
    """A one-row prompt for a zero-weight micro-batch (this rank has fewer rows than another, possibly none:
    parallel.backward_micro_batches): `sample`'s question on a blank video of the run's frame size."""
    side = max(56, int(math.sqrt(cfg.max_pixels)) // 28 * 28)
    blank = np.zeros((cfg.frames, side, side, 3), dtype=np.uint8)
    return observer.inputs(processor, [data.build_messages(sample)], [observer(sample, blank)])


def sft_backward(cfg: LearnerSettings, model, processor, inputs, targets, blank):
    """-log p(target + <|im_end|> | prompt) of each row of `inputs`, micro-batched, the gradient being the mean
    over every target token of the step on every rank (as one big batch would give). `blank`: (observer, sample) of
    the stand-in prompt (stand_in) a rank with no rows gives, built only then. Returns (this rank's mean NLL per
    token, its target tokens)."""
    ids, mask = policy.target_ids(processor, targets)
    tokens, nll_sum, base = int(mask.sum()), 0.0, parallel.unwrap(model)
    model.train()

    def batch(rows):
        if rows is not None:
            return policy.take_rows_for(base, inputs, list(range(rows.start, rows.stop))), ids[rows], mask[rows]
        if targets:  # fewer micro-batches than another rank: its first row again, at weight 0
            return policy.take_rows_for(base, inputs, [0]), ids[:1], mask[:1]
        return (stand_in(cfg, processor, *blank), *policy.target_ids(processor, [""]))  # no rows: weight 0

    def backward(rows, denominator):
        nonlocal nll_sum
        x, i, m = batch(rows)
        nll = -(policy.token_logprobs(model, x, i, m) * m.to(policy.model_device(model))).sum()
        (nll * (0.0 if rows is None else parallel.world() / denominator)).backward()   # (W: FSDP2/DDP average)
        nll_sum += nll.item() if rows is not None else 0.0

    parallel.backward_micro_batches(len(targets), cfg.micro_batch_size, backward, policy.model_device(model),
                                    count=tokens)
    return (nll_sum / tokens if tokens else None), tokens
