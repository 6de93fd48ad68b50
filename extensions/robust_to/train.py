"""Robust-TO's orchestrated agent trained with GRPO on ROVA's training loop.

    python -m extensions.robust_to.train --model ... --data ... --mode grpo-aug   # Robust-TO's five corruptions
    python -m extensions.robust_to.train --model ... --data ... --mode grpo       # clean videos

The agent (orchestrate.Agent over the policy: frame selection by reliability-relevance, decomposition,
tools, three-tier synthesis) is the policy. A step: the batch's videos (clean for --mode grpo; for
grpo-aug one of Robust-TO's five corruptions each, perturb.PROTOCOLS["robust-to"], dynamic protocol);
G agent rollouts per video (sampled decompositions, the tools, a sampled synthesis each); the
confidence-cost reward (rewards.py) plus w_F times the format reward of the synthesis; Eq. 8's group
advantages; Eq. 7's loss on the decomposition and the synthesis tokens of every rollout (one advantage
per rollout for both). The sub-query budget comes from the frozen reference (the policy as RL starts;
with LoRA its frozen copy of the adapters, or the adapters off before any SFT; with neither, beta 0 and
no LoRA, the policy when the sample is first met), asked once per sample and kept. The SFT warm-up
teaches the agent's two outputs (`agent_sft_step`). Every flag of train.py applies too.
"""
from __future__ import annotations

from machinery import cli  # noqa: I001 - first: the OpenMP wait policy before torch loads
import json
from collections import defaultdict
from dataclasses import dataclass

import torch

import grpo
from machinery import steplog
from machinery.model import learner, parallel
from machinery.training import runs
import perturb
from machinery.model import policy
import train
from machinery.training.clips import Observer
from extensions.robust_to import corruptions  # noqa: F401 - registers motion_blur, noise and the robust-to protocol
from extensions.robust_to import orchestrate
from extensions.robust_to.rewards import confidence_cost_reward


@dataclass
class Config(train.Config):
    agent_k: int = train.option(4, "frames the agent selects by reliability-relevance (of --frames)", "Robust-TO")
    max_subqueries: int = train.option(4, "sub-queries kept from a decomposition", "Robust-TO")
    synthesis_tokens: int = train.option(0, "new tokens of the agent's synthesis in rollouts (0: --max-new-tokens); "
                                            "an answer that cites the evidence first needs more than a direct one",
                                         "Robust-TO")
    w_reliability: float = train.option(0.5, "weight of the reliability of the evidence the answer rests on",
                                        "Robust-TO")
    w_cost: float = train.option(0.1, "cost per sub-query beyond the frozen estimator's count", "Robust-TO")


def check(ap, cfg):
    if cfg.mode not in ("grpo", "grpo-aug"):
        ap.error("Robust-TO's agent trains with --mode grpo or grpo-aug")
    if cfg.synthesis_tokens < 0:
        ap.error(f"--synthesis-tokens must be >= 0 (0: --max-new-tokens), got {cfg.synthesis_tokens}")
    if cfg.rollout_engine != "hf":   # (AgentRL generates through orchestrate.Agent, and its update never syncs one)
        ap.error(f"--rollout-engine {cfg.rollout_engine}: Robust-TO's agent samples its decompositions and syntheses "
                 "with transformers (orchestrate.Agent), never on a rollout engine; use --rollout-engine hf")


def agent_sft_step(cfg, model, processor, batch, clips, observer=None, step=1, agent=None):
    """The agent's warm-up (ours; Robust-TO describes none, but a policy never shown the agent's prompts
    answers them with noise, and GRPO then sees only zero rewards). On the clean videos, both of the
    agent's outputs by teacher forcing: the decomposition as the one-sub-query plan (the question, typed
    by orchestrate.guess_type) in DECOMPOSE_PROMPT's JSON, and the synthesis over the evidence the tools
    return on the selected frames as orchestrate.warmup_target (the tiers' own synthesis when their
    evidence reaches the answer, else the evidence, Video-R1's chain of thought and the answer). `step`
    is unused: the agent's clips are not jittered."""
    agent = agent or orchestrate.Agent(parallel.unwrap(model), processor, k=cfg.agent_k,
                                       max_subqueries=cfg.max_subqueries)
    items = [(s, clips.get(s)) for s in batch]
    items = [(s, f) for s, f in items if f is not None]
    if not items:
        return learner.sft_backward(cfg, model, processor, None, [], (Observer(cfg), batch[0]))
    samples = [s for s, _ in items]
    questions, sel, chosen = agent.prepare(samples, [f for _, f in items])
    plans = [[orchestrate.SubQuery(orchestrate.guess_type(q), q)] for q in questions]
    with torch.no_grad(), parallel.gathered(model):
        evidence = agent.evidence(samples, questions, sel, chosen, range(len(samples)), plans)
    texts = [agent.decompose_text(q, len(c), p) for q, c, (_, _, p) in zip(questions, chosen, sel)]
    texts += [agent.synthesis_text(s, ev) for s, ev in zip(samples, evidence)]
    targets = [json.dumps([{"type": p[0].type, "sub_query": p[0].query}]) for p in plans]
    targets += [orchestrate.warmup_target(s, ev) for s, ev in zip(samples, evidence)]
    prompts = [[{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": t}]}] for t in texts]
    inputs = policy.make_inputs(processor, prompts, chosen + chosen)
    return learner.sft_backward(cfg, model, processor, inputs, targets, (Observer(cfg), batch[0]))


class AgentRL(train.RL):
    """GRPO on Robust-TO's agent (the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = self.cfg
        self.agent = orchestrate.Agent(self.model, self.processor, k=cfg.agent_k, max_subqueries=cfg.max_subqueries,
                                       synthesis_tokens=cfg.synthesis_tokens or cfg.max_new_tokens)
        self.expected: dict = {}

    def step(self, step, spec_rng):
        self.timer = steplog.Timer()
        with self.timer("perturbation"):
            items = self.corrupt_videos(self.next_samples(), spec_rng)
        extra, dec, syn = {}, None, None
        with self.learner.generating(self.learner.ref_model):  # FSDP2: the weights gathered once to generate
            if items:
                with self.timer("estimator"):
                    self.budget(items)
                with self.timer("rollout"):
                    traces, dec, syn = self.agent.sample([it.sample for it in items], [it.pert for it in items],
                                                         self.cfg.group_size, self.cfg.temperature)
                with self.timer("reward"):
                    extra = self.agent_rewards(items, traces)
        with self.timer("backward"):
            loss_stats, n_rows, total = self.agent_backward(items, dec, syn)
            self.optim.step(total > 0)
        return self.record(items, items, loss_stats, n_rows, extra=extra)

    def corrupt_videos(self, todo, spec_rng):
        """One of Robust-TO's five corruptions per video (drawn in both modes: one spec stream)."""
        items = []
        for s, _, _ in todo:
            frames = self.clips.get(s)
            if frames is None:
                continue
            sub = str(spec_rng.choice(perturb.PROTOCOLS["robust-to"]))
            spec = perturb.sample_spec(spec_rng, subtype=sub, eta=self.cfg.eta)
            items.append(train.Item(s, spec, False, clean=frames,
                                    pert=train.perturbed(self.clips, s, frames, spec) if self.on_corrupted else frames))
        return items

    def budget(self, items):
        """The frozen estimator's expected sub-query count per sample (asked once per sample)."""
        todo = [it for it in items if it.sample.id not in self.expected]
        if not todo:
            return
        args = ([it.sample for it in todo], [it.pert for it in todo])
        if self.learner.ref_model is None and hasattr(self.model, "disable_adapter"):
            with policy.as_reference(self.model):   # (LoRA: the adapters as RL started)
                counts = self.agent.expected_subqueries(*args)
        else:
            counts = self.agent.expected_subqueries(*args, model=self.learner.ref_model)
        for it, n in zip(todo, counts):
            self.expected[it.sample.id] = n

    def agent_rewards(self, items, traces):
        """The confidence-cost reward + w_F r^F of each rollout's synthesis; returns the extra log figures."""
        cfg, G, extra = self.cfg, self.cfg.group_size, defaultdict(list)
        w_f, w_a, _ = self.weights()
        for i, it in enumerate(items):
            s, tr = it.sample, traces[i * G:(i + 1) * G]
            parts = [confidence_cost_reward(
                t.synthesis, s.answer, s.problem_type, t.evidence, len(t.subqueries), self.expected[s.id],
                options=s.options or None, source=s.source, w_acc=w_a, w_rel=cfg.w_reliability,
                w_cost=cfg.w_cost) for t in tr]
            fmt = [grpo.format_reward(t.synthesis) for t in tr]
            it.acc = [c["accuracy"] for c in parts]
            it.rewards = [w_f * f + c["total"] for f, c in zip(fmt, parts)]
            it.comp = {"format": fmt, "accuracy": it.acc, "sim_r": [], "sim_a": []}
            extra["r_reliability"] += [c["reliability"] for c in parts]
            extra["extra_subqueries"] += [c["extra_subqueries"] for c in parts]
            extra["subqueries"] += [len(t.subqueries) for t in tr]
            extra["evidence_high"] += [e.tier == "HIGH" for t in tr for e in t.evidence]
        return extra

    def agent_backward(self, items, dec, syn):
        """Eq. 7-8 over both completions of every rollout, each half weighing 1/2 and divided by its own denominator
        (every process runs both, one without items on stand-ins); stats are the means over the two halves."""
        adv = grpo.group_advantages([it.rewards for it in items]).view(-1) if items else torch.zeros(0)
        rows, stats, trained = list(range(len(adv))), defaultdict(float), 0.0
        for roll in (dec, syn):
            tokens = train.completion_tokens([(roll, rows, adv)])
            trained, denominator = self.learner.totals(len(rows), grpo.count(
                self.cfg.loss_norm, tokens, self.cfg.batch_size * self.cfg.group_size))
            if trained and denominator:   # (a process without rows runs stand-ins)
                sums = self.backward(roll, rows, adv, denominator, weight=0.5)
                for k, v in (sums.items() if rows else ()):
                    stats[k] += v / len(rows) / 2
        return dict(stats), 2 * len(adv), trained


GROUPS = {"Robust-TO": "Robust-TO's orchestrated agent and its reward"}


def parse_args(argv=None, settings=None):
    return train.parse_args(argv, settings, Config, GROUPS, check=check)


def main(argv=None, **settings):
    """Train.py's two stages with the agent as the policy: its warm-up, then GRPO on it (AgentRL)."""
    cfg = parse_args(argv, settings)
    with cli.interrupt_hint(runs.resume_hint(cfg, train.RESUME)):
        run, ckpt = runs.setup(cfg, observer=Observer(cfg))
        train.train(run, ckpt, rl=AgentRL, sft_step=agent_sft_step)


if __name__ == "__main__":
    cli.run(main, interrupted=train.RESUME)
