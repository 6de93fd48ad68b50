"""The policy's optimisation: AdamW with App. D's cosine schedule, one per stage."""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch

@dataclass
class Optim:
    """AdamW over the trainable parameters (fp32: FSDP2's sharded master weights, or LoRA's adapters; fused on
    CUDA) with App. D's cosine schedule from lr to 0 over the stage. One per stage: SFT's is dropped before RL."""
    params: list
    opt: Any
    sched: Any
    max_grad_norm: float

    @classmethod
    def make(cls, cfg, model, lr, total_steps, device, restart=0):
        """`restart`: the schedule starts again from lr at that step (SFT's answerability part)."""
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay, fused=device.type == "cuda")

        def cosine(step):
            start, end = (restart, total_steps) if 0 < restart <= step else (0, restart or total_steps)
            return 0.5 * (1 + math.cos(math.pi * min(step - start, end - start) / max(end - start, 1)))
        return cls(params, opt, torch.optim.lr_scheduler.LambdaLR(opt, cosine), cfg.max_grad_norm)

    def step(self, trained: bool):
        """One optimiser step on the accumulated gradients (already the mean over every rank's trained rows:
        parallel.backward_micro_batches), clipped; skipped when no rank trained anything (all deferred), while
        the schedule advances."""
        if trained:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            self.opt.step()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            self.sched.step()
        self.opt.zero_grad(set_to_none=True)
