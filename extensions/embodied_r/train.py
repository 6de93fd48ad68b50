"""Embodied-R (its paper's Sec. 2) on ROVA's training loop, and "Embodied-R + ROVA" (ROVA Table 2).

    python -m extensions.embodied_r.train                      # the CPU demo: tiny text LM, classical-vision perceiver
    python -m extensions.embodied_r.train --model Qwen/Qwen2.5-3B-Instruct --data ... --video-root ... \\
        --perceiver openai:Qwen/Qwen2.5-VL-72B-Instruct --frame-sampler keyframes --frames 32 \\
        --reward-weights embodied-r --judge openai:gpt-4o --mode grpo        # Embodied-R itself
    ... --mode rova                                             # Embodied-R + ROVA

`--policy text` (the default here): the policy is a text-only LM (AutoModelForCausalLM) that never sees
pixels; each video a step uses, clean or corrupted, first goes through a frozen perception model
(perceive.py: `--perceiver hf:PATH | openai:MODEL | cv`), whose text replaces the video in the prompt.
Every mode of train.py works unchanged on those texts; with `--mode rova` the dual branch aligns the LM's
outputs on the clean and the perturbed perception. Embodied-R's own recipe adds `--frame-sampler
keyframes` (keyframes.py) and `--reward-weights embodied-r` (rewards.py: its logical-consistency reward
and staged weights). `--policy vlm` keeps train.py's VLM and adds only the key frames and reward weights.
Every flag of train.py applies too.
"""
from __future__ import annotations

from machinery import cli  # noqa: I001 - first: the OpenMP wait policy before torch loads
from dataclasses import dataclass
from typing import ClassVar
from pathlib import Path

from machinery import hub
from machinery.datasets import data
from machinery.model import policy
import train
from machinery.training import records, runs
from machinery.training.clips import Observer
from extensions.embodied_r import perceive
from extensions.embodied_r import rewards as er_rewards
from extensions.embodied_r.keyframes import keyframe_sampler

TEXT_DEMO_OUT = "runs/rova-text"  # the text demo's OUT (it shares the VLM demo's runs/rova/synthetic)


@dataclass
class Config(train.Config):
    not_results: ClassVar[tuple] = ("perception_cache",)   # (changes nothing a run computes)
    policy: str = train.option("text", "text: the model reads --perceiver's text of the video (clean and corrupted "
                                       "alike) | vlm: train.py's VLM, with the key frames and reward weights below",
                               "Embodied-R")
    perceiver: str = train.option("", "--policy text: the frozen perception model, hf:PATH | openai:MODEL | cv "
                                      "(classical vision, a CPU stand-in; the demo's default); Embodied-R: "
                                      "Qwen2.5-VL-72B-Instruct", "Embodied-R")
    perception_cache: str = train.option("", "SQLite cache of perception texts (default: OUT/perception_cache.sqlite; "
                                             "keyed by frame content, question, perceiver)", "Embodied-R")
    reward_weights: str = train.option("", "format:accuracy:consistency[:alignment] weights, normalised to sum 1, or "
                                           "a schedule by data epoch: 'embodied-r' (Embodied-R Sec. 2.3: 7:3:0 epochs "
                                           "1-2, 3:7:0 epochs 3-4, 1:7:2 from 5) or '1-2=7:3:0,3-=1:7:2'; consistency "
                                           "= Embodied-R's logical-consistency reward (asks --judge); without an "
                                           "alignment weight r^A gets the accuracy weight (App. D's ratio). Empty: "
                                           "App. D's w_F = w_Acc = 1", "Embodied-R")
    frame_sampler: str = train.option("uniform", "uniform (qwen-vl-utils) | keyframes (Embodied-R Sec. 2.1: ORB + "
                                                 "RANSAC overlap < eps at 1 fps; at most --frames)", "Embodied-R")
    keyframe_eps: float = train.option(0.5, "overlap threshold of --frame-sampler keyframes (Embodied-R's code: 0.5)",
                                       "Embodied-R")


def check(ap, cfg):
    if cfg.policy not in ("vlm", "text"):
        ap.error(f"--policy must be vlm or text, got {cfg.policy!r}")
    if cfg.policy == "text" and cfg.model and not cfg.perceiver:
        ap.error("--policy text reads a perception model's text of each video: give --perceiver "
                 f"({' | '.join(perceive.PERCEIVER_SPECS)})")
    if cfg.reward_weights:
        try:
            er_rewards.parse_reward_weights(cfg.reward_weights)
        except ValueError as e:
            ap.error(f"--reward-weights: {e}")
    if cfg.frame_sampler not in ("uniform", "keyframes"):
        ap.error(f"--frame-sampler must be uniform or keyframes, got {cfg.frame_sampler!r}")
    if cfg.policy == "text" and cfg.rollout_engine != "hf":   # (--policy vlm: train.py's rollouts, on the engine)
        ap.error(f"--rollout-engine {cfg.rollout_engine}: --policy text prompts the LM with the perceiver's text, "
                 "which the rollout engine is never given (it takes chat prompts with a video); use --rollout-engine "
                 "hf, or --policy vlm")
    if cfg.policy == "text" and not cfg.model and cfg.out == train.Config.out:
        cfg.out = TEXT_DEMO_OUT  # the text demo keeps the VLM demo's runs/rova (eval_pvrbench.py's default) apart
    hub.check_hf_flags({"--perceiver": cfg.perceiver})


class TextObserver(Observer):
    """--policy text: the policy is shown Embodied-R's perception text of a clip (Embodied-R Sec. 2.2,
    Eq. 1: perceive.py with --perceiver), which replaces the video in every prompt (perceive.text_messages).
    Texts are cached on disk by frame content, question and perceiver, so the clean video of a sample is
    perceived once and a resumed run asks nothing twice."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.stats: dict = {}
        self.backend = perceive.make_perceiver(cfg.perceiver)
        self.cache = perceive.PerceptionCache(cfg.perception_cache or Path(cfg.out) / "perception_cache.sqlite")

    def __call__(self, sample, frames):
        return perceive.perceive(frames, data.question_text(sample), self.backend, cache=self.cache, stats=self.stats)

    def inputs(self, processor, messages, views):
        return policy.make_inputs(processor, [perceive.text_messages(m, o) for m, o in zip(messages, views)], None)


def observer(cfg):
    return TextObserver(cfg) if cfg.policy == "text" else Observer(cfg)


class EmbodiedRL(train.RL):
    """train.RL with Embodied-R's perception phase (--policy text), staged reward weights and
    logical-consistency reward (Embodied-R Sec. 2.3)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.schedule = er_rewards.parse_reward_weights(self.cfg.reward_weights) if self.cfg.reward_weights else None

    def corrupt_videos(self, todo, spec_rng):
        items = super().corrupt_videos(todo, spec_rng)
        if isinstance(self.observer, TextObserver):
            with self.timer("perception"):  # Embodied-R Sec. 2.2: each video the step uses becomes text (cached)
                for it in items:
                    it.clean, it.pert = self.observer(it.sample, it.clean), self.observer(it.sample, it.pert)
                    if it.shuffled is not None:
                        it.shuffled = self.observer(it.sample, it.shuffled)
        return items

    def staged(self):
        """(w_format, w_acc, w_consistency, w_alignment) for the data epoch being read (counted from 1)."""
        if self.schedule is None:
            return self.cfg.w_format, self.cfg.w_acc, 0.0, 1.0
        w = er_rewards.reward_weights(self.cursor.epoch + 1, self.schedule)
        return (w[0], w[1], w[2], w[3]) if len(w) == 4 else (w[0], w[1], w[2], w[1])

    def weights(self):
        w_f, w_a, _, w_al = self.staged()
        return w_f, w_a, w_al

    @staticmethod
    def needs_judge(cfg):
        """The judge also answers the logical-consistency reward's questions."""
        return train.RL.needs_judge(cfg) or uses_consistency(cfg)

    def rewards(self, selected):
        """Alg. 1's R_j (train.RL.rewards), then w_C r^C_j, Embodied-R's logical-consistency reward (asks the
        judge; its missing answers count)."""
        missing, w = super().rewards(selected), self.staged()[2]
        for it in selected:
            s = it.sample
            it.rewards, it.comp["consistency"], m = er_rewards.with_consistency(
                it.rewards, it.texts, s.question, s.answer, s.problem_type, self.judge, w, s.options or None, s.source)
            if it.comp["consistency"] is not None:
                it.comp["extra"].append([w * x for x in it.comp["consistency"]])   # (with_consistency added it)
            it.comp["judge_missing"] += m
            missing += m
        return missing

    def record(self, items, selected, *args, extra=None, **kwargs):
        """train.RL.record with r^C per rollout and the epoch's w_C."""
        extra = {"r_consistency": records.flat(it.comp.get("consistency") for it in selected), **(extra or {})}
        s = super().record(items, selected, *args, extra=extra, **kwargs)
        s["w_consistency"] = self.staged()[2]
        return s


def demo(cfg):
    """What the demo builds: for the text policy a tiny text LM (its tokenizer also knows the perception
    vocabulary) under OUT, which in its default OUT reads the VLM demo's synthetic benchmark (runs/rova/synthetic,
    rendered once); for the VLM, train.py's demo."""
    if cfg.policy != "text":
        return runs.Demo()
    synthetic = str(Path(train.Config.out) / "synthetic") if cfg.out == TEXT_DEMO_OUT else ""
    return runs.Demo("tiny-text", "qwen2", tuple(perceive.tokenizer_corpus()), synthetic)


def uses_consistency(cfg):
    return bool(cfg.reward_weights) and any(w[2] > 0 for _, _, w in er_rewards.parse_reward_weights(cfg.reward_weights))


GROUPS = {"Embodied-R": "Embodied-R's text policy, key frames and rewards (Embodied-R Sec. 2)"}
# The demo perceives by classical vision (no model to download); its text policy has no vision encoder to keep
# frozen, and its SFT keeps the jitter (+-30%) and the answerability warm-up's lr (SFT's) its figures were measured
# with.
_NOT_KEPT = ("freeze_vision", "answerability_lr")
DEMO = {k: v for k, v in train.DEMO.items() if k not in _NOT_KEPT} | {"perceiver": "cv", "sft_jitter": 0.3}


def parse_args(argv=None, settings=None):
    return train.parse_args(argv, settings, Config, GROUPS, DEMO, check)


def main(argv=None, **settings):
    """Train.py's two stages with Embodied-R's policy, frame sampler and rewards."""
    cfg = parse_args(argv, settings)
    read_kwargs = {"sampler": keyframe_sampler(cfg.keyframe_eps)} if cfg.frame_sampler == "keyframes" else {}
    with cli.interrupt_hint(runs.resume_hint(cfg, train.RESUME)):
        run, ckpt = runs.setup(cfg, observer=observer(cfg), text_policy=cfg.policy == "text", policy_flag="--policy",
                               demo=demo(cfg), read_kwargs=read_kwargs)
        train.train(run, ckpt, rl=EmbodiedRL)


if __name__ == "__main__":
    cli.run(main, interrupted=train.RESUME)
