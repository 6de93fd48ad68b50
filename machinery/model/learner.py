"""The policy as training drives it (`Learner`): generation with the weights gathered (FSDP2), a step's totals summed
over the processes, its completions in micro-batches with every process running the same number (one with fewer rows
runs zero-weight stand-ins), the log-probs of the policy and the frozen reference, and a term's backward scaled so
that FSDP2's and DDP's average over the processes gives the step's gradient. train.py's RL.update writes Eq. 7 with
these pieces, in Alg. 2's order. AdamW with App. D's cosine schedule, one per stage (`Optim`); SFT's backward."""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from machinery import distributed
from machinery.datasets import data
from machinery.model import parallel, policy


@dataclass
class Optim:
    """AdamW over the trainable parameters (fp32: FSDP2's sharded master weights, or LoRA's adapters; fused on
    CUDA) with App. D's cosine schedule from lr to 0 over the stage. One per stage: SFT's is dropped before RL."""
    params: list
    opt: Any
    sched: Any
    max_grad_norm: float

    @classmethod
    def make(cls, cfg, model, lr, total_steps, device, restart=0, restart_lr=0.0):
        """`cfg`: a run's settings (weight_decay, max_grad_norm). `restart`: the schedule starts again at that step
        (SFT's answerability part), from `restart_lr` (0: lr)."""
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
        Learner.backward), clipped; skipped when no rank trained anything, and then the schedule
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
    needed: policy.reference_logprobs). `blank`: (the run's settings, its observer, a sample), what the one-row
    stand-in prompt of a process that trains nothing this step is built from (stand_in)."""

    def __init__(self, model, processor, device, micro_batch_size, temperature=1.0, beta=0.0, train_model=None,
                 ref_model=None, blank=None):
        self.model, self.processor, self.device = model, processor, device
        self.micro_batch_size, self.temperature, self.beta = micro_batch_size, temperature, beta
        self.train_model, self.ref_model, self.blank = train_model or model, ref_model, blank
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

    def totals(self, n_rows, count):
        """(the rows trained on every process, the step's denominator): this process's `n_rows` and `count`
        (grpo.count), each summed over the processes, once per step."""
        return tuple(distributed.all_sum([float(n_rows), float(count)], self.device))

    def pad(self, parts, draws):
        """The step's `parts` [(rollout, rows, advantages)] padded with empty ones to the most any process has (at
        most `draws`): every process then runs as many micro-batches (an empty part's are stand-ins)."""
        ranks_with = distributed.all_sum([float(len(parts) > k) for k in range(draws)], self.device)
        return list(parts) + [(None, [], torch.zeros(0))] * (sum(n > 0 for n in ranks_with) - len(parts))

    def micro_batches(self, rollout, rows, adv, kept=None):
        """This process's micro-batches of the completions `rows` of `rollout` (advantages `adv`, one per row), on the
        policy's device, padded with stand-ins (weight 0) to the busiest process's number: every process runs as many
        forward/backward passes (FSDP2's collectives pair up; DDP's all-reduce too). `kept` (several updates per
        generation): the old and reference log-probs an earlier update stored per micro-batch."""
        self.train_model.train()
        rows = torch.as_tensor(rows, dtype=torch.long)
        device = policy.model_device(parallel.unwrap(self.train_model))
        for part in parallel.micro_batches(len(rows), self.micro_batch_size, self.device):
            if part is None and not len(rows):   # this process trains nothing this step: a blank video, at weight 0
                ids, mask = policy.target_ids(self.processor, [""])
                yield MicroBatch(policy._to(stand_in(self.processor, *self.blank), device), ids, mask.to(device),
                                 torch.zeros(1, device=device), 0.0, 0)
                continue
            real = part is not None   # else fewer micro-batches here than on another process: its first row again
            part = part if real else slice(0, 1)
            r = rows[part]
            old, ref = kept[part.start] if real and kept is not None and part.start in kept else (None, None)
            fresh = real and old is None and rollout.engine_logprobs is not None
            yield MicroBatch(policy._to(rollout.row_inputs(r), device), rollout.completion_ids[r],
                             rollout.completion_mask[r].to(device), adv[part].to(device), 1.0 if real else 0.0,
                             len(r) if real else 0, part.start if real else None, old, ref,
                             rollout.engine_logprobs[r] if fresh else None)

    def logprobs(self, mb, kept=None):
        """(log F_theta, log F_theta_old, log F_ref) per completion token of the micro-batch `mb`: F_theta_old and
        F_ref as an earlier update on these rollouts kept them, else the current policy's (detached) and the
        reference's (the policy's when beta is 0: no KL term), then kept in `kept` for the next updates."""
        logp = policy.token_logprobs(self.train_model, mb.inputs, mb.ids, mb.mask, temperature=self.temperature)
        old, ref = mb.old, mb.ref
        if ref is None and self.beta > 0:
            ref = policy.reference_logprobs(parallel.unwrap(self.train_model), mb.inputs, mb.ids, mb.mask,
                                            ref_model=self.ref_model, temperature=self.temperature)
            parallel.release(self.ref_model)  # FSDP2 keeps a root gathered after a forward without backward
        old = logp.detach() if old is None else old.to(logp.device)
        ref = logp.detach() if ref is None else ref.to(logp.device)
        if kept is not None and mb.key is not None and mb.old is None:
            kept[mb.key] = (old, ref)   # (the micro-batches are the same slices at every update)
        return logp, old, ref

    def backward(self, loss, mb, logp):
        """Backpropagate a micro-batch's term of the step's loss, times W, since FSDP2 and DDP average the processes'
        gradients (the terms over every process sum to the step's loss), and times 0 for a stand-in; then, with a
        rollout engine, its log-prob gap on these tokens (every micro-batch: FSDP2's extra forwards pair up)."""
        (loss * (parallel.world() * mb.weight)).backward()
        if self.engine is not None:
            self.engine.measure(self.train_model, mb.inputs, mb.ids, mb.mask, logp, mb.engine_logprobs,
                                self.temperature)

    def engine_sleep(self):
        """--rollout-engine vllm: the engine's memory is the update's (CUDA); no-op otherwise."""
        if self.engine is not None:
            self.engine.sleep()

    def engine_sync(self):
        """After the update: the engine's log-prob gap check (stops the run when the engine is not the policy) and
        the updated weights loaded into it, so the next rollouts never sample a stale policy. Returns the step's
        mean gap (-1: no engine)."""
        if self.engine is None:
            return -1.0
        gap = self.engine.guard.close_step(self.device)
        self.engine.sync(self.model)
        return gap


@dataclass
class MicroBatch:
    """One forward/backward of the update on this process: rows of a rollout, or a stand-in (weight 0)."""
    inputs: Any                      # the rows' prompt inputs (video and text), on the policy's device
    ids: torch.Tensor                # [n, T] completion tokens
    mask: torch.Tensor               # [n, T] which are tokens of the completion
    adv: torch.Tensor                # [n] advantages (Eq. 8)
    weight: float                    # 1, or 0 for a stand-in
    n: int                           # rows trained (0 for a stand-in)
    key: int | None = None           # the micro-batch's first row (kept's key)
    old: torch.Tensor | None = None  # log F_theta_old kept from an earlier update on these rollouts
    ref: torch.Tensor | None = None  # log F_ref kept likewise
    engine_logprobs: torch.Tensor | None = None   # the rollout engine's, on a first update


def stand_in(processor, cfg, observer, sample):
    """A one-row prompt for a zero-weight micro-batch (this rank has fewer rows than another, possibly none:
    Learner.micro_batches, sft_backward): `sample`'s question on a blank video of the run's frame size."""
    side = max(56, int(math.sqrt(cfg.max_pixels)) // 28 * 28)
    blank = np.zeros((cfg.frames, side, side, 3), dtype=np.uint8)
    return observer.inputs(processor, [data.build_messages(sample)], [observer(sample, blank)])


def sft_backward(cfg, model, processor, inputs, targets, blank):
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
        return (stand_in(processor, cfg, *blank), *policy.target_ids(processor, [""]))  # no rows: weight 0

    def backward(rows, denominator):
        nonlocal nll_sum
        x, i, m = batch(rows)
        nll = -(policy.token_logprobs(model, x, i, m) * m.to(policy.model_device(model))).sum()
        (nll * (0.0 if rows is None else parallel.world() / denominator)).backward()   # (W: FSDP2/DDP average)
        nll_sum += nll.item() if rows is not None else 0.0

    parallel.backward_micro_batches(len(targets), cfg.micro_batch_size, backward, policy.model_device(model),
                                    count=tokens)
    return (nll_sum / tokens if tokens else None), tokens
