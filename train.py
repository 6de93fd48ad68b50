"""ROVA training (Alg. 2): an SFT warm-up on chain-of-thought data, then dual-branch GRPO with the
self-reflective, difficulty-aware curriculum and the temporal memory buffer.

    python train.py                                   # the CPU demo: tiny model + synthetic benchmark
    torchrun --nproc_per_node=4 train.py --model Qwen/Qwen2.5-VL-7B-Instruct --lora-r 64 \\
        --data data/Video-R1-COT-outdoor.json --video-root data/Video-R1-data --out runs/rova --judge openai:gpt-4o
    python train.py --model ... --lora-r 64 --load-in-4bit   # one smaller GPU

One RL step follows App. G's order (the one that saves cost): sample a corruption spec
per video (dynamic protocol, Sec. 4) and corrupt it (Sec. 3.1); roll out G on the clean and G on the
perturbed video (Alg. 2 l.3); self-assess every sample (Eq. 3, Alg. 2 l.6); discard confident easy
ones, defer difficult ones to the buffer (l.7-10); compute rewards (Alg. 1) and the GRPO update
(Eq. 7-8) for the selected ones only; every `reeval_period` steps re-evaluate the buffer on
regenerated videos (Eq. 5-6, l.12-21) and train on what it promotes. The baselines: `--mode dual`
is the naive dual-branch (alignment reward, no curriculum; App. G Eq. 12), `--mode grpo` standard
single-branch GRPO on the clean videos (App. G Eq. 11: "from clean video only"), `--mode grpo-aug`
single-branch GRPO on corrupted videos (the same dynamic corruption sampling as ROVA, no clean branch,
no alignment reward, no curriculum: the "generic data augmentation" of Sec. 1, absent from the tables).
Every mode draws the same corruption specs and data order for a given --seed.

Embodied-R (its paper's Sec. 2; `--policy text`): the policy is a text-only LM (AutoModelForCausalLM,
Qwen2.5-3B-Instruct in that paper) that never sees pixels; each video a step uses, clean or corrupted,
first goes through a frozen perception model (perceive.py: `--perceiver hf:PATH | openai:MODEL | cv`),
whose text replaces the video in the prompt. Every mode works unchanged on those texts; `--mode rova`
is then "Embodied-R + ROVA" (ROVA Table 2): the dual branch aligns the LM's outputs on the clean and
the perturbed perception. Embodied-R's own recipe adds `--frame-sampler keyframes` and
`--reward-weights embodied-r` (its logical-consistency reward and staged weights).

Distributed: torchrun sets the process group up from the environment (NCCL on GPUs, gloo on CPU);
each rank has its own data shard and buffer. Because the curriculum selects a different number of
samples on each rank (possibly none), gradients are averaged with an explicit all-reduce weighted by
each rank's number of trained completions, instead of DDP's hooks (which need every rank to run the
same backward passes). Rank 0 writes logs and checkpoints.
"""
from __future__ import annotations

import runtime  # noqa: I001 - first: it sets the OpenMP wait policy before torch loads (runtime.GOMP_SPINCOUNT)
import argparse
import json
import math
import os
import random
import shutil
import textwrap
import time
import warnings
from collections import OrderedDict, defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import buffer as membuf
import data
import grpo
import judge as judges
from extensions.embodied_r import perceive
import perturb
import policy
import video

log = print  # rank-aware below
RESUME_HINT = "rerun the same command to continue from the last checkpoint"  # Ctrl-C's line; main() names OUT


def _arg(default, help_, group):
    return field(default=default, metadata={"help": help_, "group": group})


# --help shows the flags in these groups, in this order (each Config field names its group)
GROUPS = {
    "model": "the policy and how it is trained (full fine-tune, LoRA, 4-bit)",
    "data": "training data and how videos are read (Sec. 5.1, App. D)",
    "output": "the run folder: logs, checkpoints, resuming",
    "SFT": "the supervised warm-up (Sec. 5.1, App. D)",
    "RL": "dual-branch GRPO (Alg. 1-2, Eq. 7-10, App. D)",
    "curriculum": "self-assessment and the memory buffer (Sec. 3.2, Eq. 3-6, Alg. 2 l.6-21)",
    "evaluation": "the before/after check of the demo (PVRBench itself: eval_pvrbench.py)",
    "distributed": "torchrun --nproc_per_node=N train.py ...: NCCL on GPUs, gloo on CPU, one data shard and "
                   "buffer per rank, gradients averaged by trained completions; no flags of its own",
    "extensions": "Embodied-R (--policy text) and Robust-TO (--agent), on the same harness",
}


@dataclass
class Config:
    """Every default is App. D's unless said otherwise; each field is a command-line flag."""
    # model
    model: str = _arg("", "policy: any AutoModelForImageTextToText path or hub id (Qwen2.5-VL, Qwen2-VL, Qwen3-VL), "
                          "or with --policy text an AutoModelForCausalLM (Qwen2.5-3B-Instruct); empty with --data "
                          "empty: the demo's tiny model", "model")
    lora_r: int = _arg(0, "LoRA rank on the language model (0: full fine-tune)", "model")
    load_in_4bit: bool = _arg(False, "NF4 4-bit base weights (needs --lora-r > 0)", "model")
    gradient_checkpointing: bool = _arg(True, "activation checkpointing (on GPUs only)", "model")
    # data
    data: str = _arg("", "training data, Video-R1 JSON (Sec. 5.1: a Video-R1-260k subset, `python data.py "
                         "make-subset`); empty: the demo", "data")
    video_root: str = _arg("", "folder the data's video paths are relative to (default: the JSON's folder)", "data")
    frames: int = _arg(16, "frames per video (App. D: 16 in training); at most this many with --frame-sampler "
                           "keyframes", "data")
    max_pixels: int = _arg(128 * 28 * 28, "pixels per frame (App. D: 128x28x28 in training)", "data")
    frame_sampler: str = _arg("uniform", "uniform (qwen-vl-utils) | keyframes (Embodied-R Sec. 2.1: ORB + RANSAC "
                                         "overlap < eps at 1 fps)", "data")
    keyframe_eps: float = _arg(0.5, "overlap threshold of --frame-sampler keyframes (Embodied-R's code: 0.5)", "data")
    max_bad_fraction: float = _arg(0.1, "stop when more than this share of videos is missing or unreadable", "data")
    video_cache: int = _arg(64, "decoded clips kept in memory per process", "data")
    demo_clips: int = _arg(480, "clips of the demo's synthetic benchmark", "data")
    seed: int = _arg(0, "seed of data order, corruption specs and sampling", "data")
    # output
    out: str = _arg("runs/rova", "output folder: log.jsonl, checkpoints/, final/ (the --policy text demo: "
                                 "runs/rova-text). A finished run in it is never replaced without --overwrite; "
                                 "an unfinished one with the same config is continued", "output")
    resume: str = _arg("", "auto: continue from the last complete checkpoint in OUT even if the config differs; or "
                           "a checkpoint folder", "output")
    overwrite: bool = _arg(False, "replace whatever run OUT holds, finished or not (the demo's model and benchmark "
                                  "are kept)", "output")
    save_every: int = _arg(50, "checkpoint every this many steps (SFT and RL)", "output")
    keep_checkpoints: int = _arg(2, "complete checkpoints kept (older ones are deleted)", "output")
    stop_after: int = _arg(0, "testing: exit (as if killed) after this many steps of this run, no final save", "output")
    # SFT
    sft_epochs: float = _arg(1.0, "SFT warm-up epochs on `process` + `solution` (App. D: 1)", "SFT")
    sft_batch_size: int = _arg(8, "videos per SFT step per process", "SFT")
    sft_lr: float = _arg(1e-5, "AdamW learning rate of SFT, cosine schedule (App. D: 1e-5)", "SFT")
    # RL
    mode: str = _arg("rova", "rova (full) | dual (alignment, no curriculum) | grpo (single branch, clean videos) | "
                             "grpo-aug (single branch, corrupted videos) (Table 3, 13; App. G)", "RL")
    rl_steps: int = _arg(300, "RL steps (App. D: 300)", "RL")
    batch_size: int = _arg(4, "videos per RL step per process (Table 14: N = 4 per GPU)", "RL")
    group_size: int = _arg(8, "G: rollouts per video and branch (App. D: 8)", "RL")
    temporal_grpo: bool = _arg(False, "add T-GRPO's shuffled group (Video-R1; App. D: G~ = 4)", "RL")
    shuffled_group_size: int = _arg(4, "G~: rollouts on the shuffled video for T-GRPO (App. D: 4)", "RL")
    eta: float = _arg(0.7, "perturbation intensity (App. D: 0.7)", "RL")
    lr: float = _arg(1e-5, "AdamW learning rate of RL, cosine schedule (App. D: 1e-5)", "RL")
    weight_decay: float = _arg(0.0, "AdamW weight decay", "RL")
    max_grad_norm: float = _arg(1.0, "gradient norm clip (App. D: 1.0)", "RL")
    clip_eps: float = _arg(0.2, "PPO clip epsilon of Eq. 7 (App. D: 0.2)", "RL")
    beta: float = _arg(0.01, "KL coefficient of Eq. 7 (App. D: 0.01)", "RL")
    w_format: float = _arg(1.0, "weight of the format reward (App. D: w_F = 1)", "RL")
    w_acc: float = _arg(1.0, "weight of the accuracy reward (App. D: w_Acc = 1)", "RL")
    alpha_r: float = _arg(0.3, "reasoning-consistency weight of the alignment reward (App. D: 0.3)", "RL")
    alpha_a: float = _arg(0.7, "answer-consistency weight of the alignment reward (App. D: 0.7)", "RL")
    judge: str = _arg("local", "alignment judge: local | openai:MODEL | hf:PATH (App. C.1; GPT-4o in the paper)", "RL")
    judge_cache: str = _arg("", "SQLite verdict cache (default: OUT/judge_cache.sqlite)", "RL")
    max_new_tokens: int = _arg(256, "tokens per rollout", "RL")
    temperature: float = _arg(1.0, "sampling temperature of rollouts", "RL")
    top_p: float = _arg(1.0, "nucleus sampling of rollouts", "RL")
    # curriculum
    tau: float = _arg(0.8, "confidence threshold: easy samples with c > tau are discarded (Sec. 3.2, App. D)",
                      "curriculum")
    a_min: float = _arg(0.3, "perturbed accuracy below a_min: difficult (App. D)", "curriculum")
    a_max: float = _arg(0.85, "perturbed accuracy at least a_max (and answers agree): easy (App. D)", "curriculum")
    unanswerable_below: float = _arg(0.5, "P(YES) on the answerability prompt (Fig. 10) below which a sample is "
                                          "difficult; 0 ignores it", "curriculum")
    buffer_capacity: int = _arg(1000, "memory buffer size |M|_max (App. D: 1000)", "curriculum")
    n_max: int = _arg(3, "re-evaluations before eviction N_max (App. D: 3; the paper also writes K_max = 537)",
                      "curriculum")
    reeval_period: int = _arg(50, "re-evaluate the buffer every this many steps (App. D, App. G: 50)", "curriculum")
    reeval_rollouts: int = _arg(2, "perturbed rollouts per buffered sample at re-evaluation", "curriculum")
    # evaluation
    eval_data: str = _arg("", "VSI-Bench-format file to report clean/perturbed accuracy before and after", "evaluation")
    eval_video_root: str = _arg("", "video root of --eval-data", "evaluation")
    eval_limit: int = _arg(96, "questions of --eval-data used for the before/after report", "evaluation")
    # extensions
    policy: str = _arg("vlm", "vlm: the model sees the video | text: Embodied-R, the model reads --perceiver's text "
                              "of the video (clean and corrupted alike)", "extensions")
    perceiver: str = _arg("", "--policy text: the frozen perception model, hf:PATH | openai:MODEL | cv (classical "
                              "vision, a CPU stand-in; the demo's default); Embodied-R: Qwen2.5-VL-72B-Instruct",
                          "extensions")
    perception_cache: str = _arg("", "--policy text: SQLite cache of perception texts (default: "
                                     "OUT/perception_cache.sqlite; keyed by frame content, question, perceiver)",
                                 "extensions")
    reward_weights: str = _arg("", "format:accuracy:consistency[:alignment] weights, normalised to sum 1, or a "
                                   "schedule by data epoch: 'embodied-r' (Embodied-R Sec. 2.3: 7:3:0 epochs 1-2, "
                                   "3:7:0 epochs 3-4, 1:7:2 from 5) or '1-2=7:3:0,3-=1:7:2'; consistency = "
                                   "Embodied-R's logical-consistency reward (asks --judge); without an alignment "
                                   "weight r^A gets the accuracy weight (App. D's ratio). Empty: --w-format/--w-acc",
                               "extensions")
    agent: str = _arg("", "robust-to: train Robust-TO's orchestrated agent (orchestrate.py: frame selection, "
                          "decomposition, tools, three-tier synthesis) with its confidence-cost reward; --mode grpo "
                          "(clean videos) or grpo-aug (Robust-TO's five corruptions)", "extensions")
    agent_k: int = _arg(4, "--agent: frames the agent selects by reliability-relevance (of --frames)", "extensions")
    max_subqueries: int = _arg(4, "--agent: sub-queries kept from a decomposition", "extensions")
    synthesis_tokens: int = _arg(0, "--agent: new tokens of the agent's synthesis in rollouts (0: --max-new-tokens); "
                                    "an answer that cites the evidence first needs more than a direct one",
                                 "extensions")
    w_reliability: float = _arg(0.5, "--agent: weight of the reliability of the evidence the answer rests on",
                                "extensions")
    w_cost: float = _arg(0.1, "--agent: cost per sub-query beyond the frozen estimator's count", "extensions")


# The CPU demo (no --model, no --data): what a 2-core laptop trains in a few minutes. The tiny model
# was never taught the answerability question, so its P(YES) is noise and is not used to defer samples.
DEMO = dict(frames=8, max_pixels=56 * 56, sft_epochs=10.0, sft_batch_size=16, sft_lr=3e-3, lr=1e-4, rl_steps=100,
            batch_size=4, group_size=8, max_new_tokens=64, save_every=50, reeval_period=10, video_cache=4096,
            eval_limit=120, unanswerable_below=0.0)


MODES = ("rova", "dual", "grpo", "grpo-aug")
TEXT_DEMO_OUT = "runs/rova-text"  # the --policy text demo's OUT (the VLM demo's is Config.out)


def parse_args(argv=None) -> Config:
    demo = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in DEMO.items())
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=runtime.HelpFormatter,
                                 usage="%(prog)s [--model M --data D.json --video-root DIR] [options]",
                                 epilog=textwrap.fill(f"The demo (no --model, no --data) changes these defaults: "
                                                      f"{demo}.", 100))
    groups = {name: ap.add_argument_group(name, text) for name, text in GROUPS.items()}
    for f in fields(Config):
        flag, group = "--" + f.name.replace("_", "-"), groups[f.metadata["group"]]
        if f.type in ("bool", bool):
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=f.metadata["help"])
        else:
            kind = {"int": int, "float": float}.get(str(f.type), str)
            group.add_argument(flag, type=kind, default=f.default, help=f.metadata["help"])
    runtime.add_debug_flag(groups["output"])
    args = vars(ap.parse_args(argv))
    args.pop("debug")  # read by runtime.run
    cfg = Config(**args)
    if cfg.mode not in MODES:
        ap.error(f"--mode must be one of {', '.join(MODES)}, got {cfg.mode!r}")
    if cfg.reward_weights:
        try:
            grpo.parse_reward_weights(cfg.reward_weights)
        except ValueError as e:
            ap.error(f"--reward-weights: {e}")
    if cfg.policy not in ("vlm", "text"):
        ap.error(f"--policy must be vlm or text, got {cfg.policy!r}")
    if cfg.policy == "text" and cfg.model and not cfg.perceiver:
        ap.error("--policy text reads a perception model's text of each video: give --perceiver "
                 f"({' | '.join(perceive.PERCEIVER_SPECS)})")
    if cfg.agent not in ("", "robust-to"):
        ap.error(f"--agent must be robust-to (or empty), got {cfg.agent!r}")
    if cfg.agent and (cfg.mode not in ("grpo", "grpo-aug") or cfg.policy != "vlm"):
        ap.error("--agent robust-to trains a VLM policy with --mode grpo or grpo-aug")
    if cfg.synthesis_tokens < 0:
        ap.error(f"--synthesis-tokens must be >= 0 (0: --max-new-tokens), got {cfg.synthesis_tokens}")
    if cfg.frame_sampler not in ("uniform", "keyframes"):
        ap.error(f"--frame-sampler must be uniform or keyframes, got {cfg.frame_sampler!r}")
    if cfg.load_in_4bit and cfg.lora_r <= 0:
        ap.error("--load-in-4bit trains LoRA adapters: give --lora-r > 0")
    return cfg


# ----------------------------------------------------------------------------- processes, RNG, timing

def setup_distributed():
    """torchrun's environment -> (rank, world, device); a plain `python train.py` is rank 0 of 1."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        cuda = torch.cuda.is_available()
        dist.init_process_group("nccl" if cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        return rank, world, device
    return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")


def all_sum(values, device):
    """Sum a list of floats over ranks."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def sync_gradients(params, weight, device):
    """Average gradients over ranks, each rank's gradient (of a loss summed over its `weight` trained
    completions) counting in proportion to it: g = sum_r g_r / sum_r weight_r."""
    total = all_sum([float(weight)], device)[0]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    if dist.is_initialized():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(p).clone()
            offset += n
    else:
        for p, g in zip(params, grads):
            p.grad = g
    if total > 0:
        for p in params:
            p.grad.div_(total)
    return total


class Timer:
    """Seconds spent in each of Table 14's components during one step."""

    def __init__(self):
        self.seconds = defaultdict(float)

    @contextmanager
    def __call__(self, name):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0


def rng_state(spec_rng):
    """Every RNG of this rank: JSON-able parts, and torch's generator states as tensors."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_py = random.getstate()
    plain = {"python": [version, list(internal), gauss_py], "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
             "spec": spec_rng.bit_generator.state}
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return plain, tensors


def set_rng_state(plain, tensors, spec_rng):
    version, internal, gauss_py = plain["python"]
    random.setstate((version, tuple(internal), gauss_py))
    kind, keys, pos, has_gauss, gauss = plain["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    spec_rng.bit_generator.state = plain["spec"]
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(tensors["cuda"]))


# ----------------------------------------------------------------------------- data

class Clips:
    """Decoded training clips with an LRU cache. A missing or unreadable video is skipped, and remembered
    (path -> reason) so that it is neither decoded again nor counted twice; above --max-bad-fraction of
    the data's videos the run stops."""

    def __init__(self, cfg: Config, missing: list, n_videos: int):
        self.cfg, self.cache, self.n_videos = cfg, OrderedDict(), n_videos
        self.bad = {path: "missing" for _, path in missing}

    def get(self, sample):
        if sample.video in self.bad:
            return None
        if sample.video in self.cache:
            self.cache.move_to_end(sample.video)
            return self.cache[sample.video]
        try:
            frames, _, _ = video.read_frames(sample.video, num_frames=self.cfg.frames, max_pixels=self.cfg.max_pixels,
                                             sampler=self.cfg.frame_sampler, keyframe_eps=self.cfg.keyframe_eps)
        except Exception as e:  # noqa: BLE001 - a bad file is skipped, never fatal (up to max_bad_fraction)
            self.bad[sample.video] = " ".join(str(e).split())
            log(f"skipping sample {sample.id}: {e}")
            if len(self.bad) > self.cfg.max_bad_fraction * max(self.n_videos, 1):
                raise runtime.UserError(f"stopping: {len(self.bad)} of {self.n_videos} videos are missing or "
                                        f"unreadable (more than --max-bad-fraction {self.cfg.max_bad_fraction}); "
                                        f"last: {sample.video}")
            return None
        self.cache[sample.video] = frames
        if len(self.cache) > self.cfg.video_cache:
            self.cache.popitem(last=False)
        return frames


class Observer:
    """What the policy is shown of a clip (clean or corrupted): the frames themselves (--policy vlm), or
    Embodied-R's perception text of them (--policy text; Embodied-R Sec. 2.2, Eq. 1: perceive.py with
    --perceiver), which replaces the video in every prompt (perceive.text_messages). Texts are cached
    on disk by frame content, question and perceiver, so the clean video of a sample is perceived once
    and a resumed run asks nothing twice."""

    def __init__(self, cfg: Config):
        self.text = cfg.policy == "text"
        self.stats: dict = {}
        if self.text:
            self.backend = perceive.make_perceiver(cfg.perceiver)
            self.cache = perceive.PerceptionCache(cfg.perception_cache or Path(cfg.out) / "perception_cache.sqlite")

    def __call__(self, sample, frames):
        if not self.text:
            return frames
        return perceive.perceive(frames, data.question_text(sample), self.backend, cache=self.cache, stats=self.stats)

    def inputs(self, processor, messages, observations):
        """The model's batch for chat messages (each with one video item) and their observations."""
        if not self.text:
            return policy.make_inputs(processor, messages, observations)
        return policy.make_inputs(processor, [perceive.text_messages(m, o) for m, o in zip(messages, observations)],
                                  None)


class Cursor:
    """A seeded, resumable walk over this rank's shard: epoch e visits a fresh permutation."""

    def __init__(self, n, seed, epoch=0, pos=0):
        self.n, self.seed, self.epoch, self.pos = n, seed, epoch, pos

    def take(self, k):
        out = []
        while len(out) < k and self.n:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
            out.append(int(order[self.pos]))
            self.pos += 1
            if self.pos == self.n:
                self.epoch, self.pos = self.epoch + 1, 0
        return out

    def state(self):
        return {"epoch": self.epoch, "pos": self.pos}


# ----------------------------------------------------------------------------- model, optimiser, checkpoints

def cosine(total_steps):
    """App. D: a cosine learning-rate schedule from lr to 0 over the stage."""
    return lambda step: 0.5 * (1 + math.cos(math.pi * min(step, total_steps) / max(total_steps, 1)))


def make_optimizer(cfg, model, lr, total_steps):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay)
    return params, opt, torch.optim.lr_scheduler.LambdaLR(opt, cosine(total_steps))


def load_model(cfg, device, weights=None):
    """The policy, from cfg.model; `weights` = a checkpoint's model folder (full model or LoRA adapter)."""
    lora = cfg.lora_r > 0
    path = weights if (weights and not lora) else cfg.model
    model, processor = policy.load_policy(path, lora_r=cfg.lora_r, load_in_4bit=cfg.load_in_4bit, device=device,
                                          gradient_checkpointing=cfg.gradient_checkpointing and device.type == "cuda")
    if weights and lora:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file
        set_peft_model_state_dict(model, load_file(str(Path(weights) / "adapter_model.safetensors"), device=str(device)))
    return model, processor


def save_model(model, processor, folder):
    """safetensors: the full model (with its processor), or only the LoRA adapter."""
    with runtime.no_hf_progress_bars():  # no "Writing model shards" bar inside the training bar
        model.save_pretrained(folder, safe_serialization=True)
    if not hasattr(model, "peft_config"):
        processor.save_pretrained(folder)


def checkpoint_name(state):
    return f"{state['stage']}-{state['step']:07d}"


def save_checkpoint(cfg, rank, model, processor, opt, sched, state, per_rank):
    """Atomic: every rank writes into a temporary folder, rank 0 marks it complete and renames it."""
    root = Path(cfg.out) / "checkpoints"
    tmp = root / f".tmp-{checkpoint_name(state)}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    plain, tensors = per_rank  # JSON (cursor, buffer, RNG) and tensors (torch RNG), both safe to load
    (tmp / f"rank{rank}.json").write_text(json.dumps(plain))
    torch.save(tensors, tmp / f"rank{rank}_rng.pt")
    if rank == 0:
        save_model(model, processor, tmp / "model")
        torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, tmp / "optimizer.pt")
        (tmp / "state.json").write_text(json.dumps({"state": state, "config": asdict(cfg)}, indent=1))
    barrier()
    if rank == 0:
        (tmp / "COMPLETE").write_text("ok\n")
        final = root / checkpoint_name(state)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in _complete_checkpoints(root)[:-max(1, cfg.keep_checkpoints)]:
            shutil.rmtree(old, ignore_errors=True)
    barrier()


def _complete_checkpoints(root):
    """Complete checkpoints, oldest first (SFT before RL, then by step)."""
    order = {"sft": 0, "rl": 1}
    done = [p for p in Path(root).glob("*-*") if (p / "COMPLETE").is_file()]
    return sorted(done, key=lambda p: (order.get(p.name.split("-")[0], 2), p.name))


# Config fields that change nothing a run computes: an unfinished run continues across a change of these.
NOT_RESULT_KEYS = ("out", "resume", "overwrite", "stop_after", "save_every", "keep_checkpoints", "video_cache",
                   "max_bad_fraction", "judge_cache", "perception_cache")
RUN_FILES = ("log.jsonl", "eval_before.json", "eval_after_sft.json", "summary.json")  # + the folders below
RUN_FOLDERS = ("checkpoints", "reference", "final", "tensorboard")  # the demo's tiny/ and synthetic/ are kept


def config_changes(saved: dict, cfg: Config) -> list[str]:
    """'flag old -> new' for every result-changing field in which cfg differs from a saved config."""
    now = asdict(cfg)
    return [f"--{k.replace('_', '-')} {saved[k]!r} -> {now[k]!r}" for k in now
            if k in saved and k not in NOT_RESULT_KEYS and saved[k] != now[k]]


def claim_run_folder(cfg, rank):
    """What OUT holds decides what this run does; nothing finished is ever deleted implicitly. A finished
    run (final/ or summary.json) is refused unless --overwrite; an unfinished one (complete checkpoints)
    is continued from its last checkpoint when the config matches or --resume is given, refused
    otherwise; the files of a run stopped before its first checkpoint are replaced. Returns the
    checkpoint to resume from, or None for a fresh run."""
    out = Path(cfg.out)
    if cfg.resume and cfg.resume != "auto":
        ckpt = Path(cfg.resume)
        if not (ckpt / "COMPLETE").is_file():
            raise runtime.UserError(f"--resume {ckpt}: not a complete checkpoint (no COMPLETE marker)")
        log(f"resuming from {ckpt}")
        return ckpt
    done = _complete_checkpoints(out / "checkpoints")
    finished = (out / "final").is_dir() or (out / "summary.json").is_file()
    if cfg.overwrite:
        if rank == 0 and (done or finished):
            log(f"--overwrite: replacing the run in {out}")
        _clear_run(out, rank)
        return None
    if finished:
        raise runtime.UserError(f"{out} holds a finished run (final weights in {out / 'final'}): give --out NEW for "
                                "another run, or --overwrite to replace it")
    if done:
        saved = json.loads((done[-1] / "state.json").read_text())
        changes = config_changes(saved["config"], cfg)
        if changes and not cfg.resume:
            raise runtime.UserError(f"{out} holds an unfinished run (last checkpoint {done[-1].name}) with another "
                                    f"config ({'; '.join(changes[:4])}): rerun with its flags to continue it, "
                                    "--resume auto to continue it with these, --out NEW, or --overwrite")
        log(f"continuing the unfinished run in {out} from {done[-1].name} ({saved['state']['stage']} step "
            f"{saved['state']['step']}" + (f"; changed flags: {'; '.join(changes)})" if changes
                                          else "; same config, --overwrite starts over)"))
        return done[-1]
    _clear_run(out, rank)  # nothing finished: a run stopped before its first checkpoint
    return None


def _clear_run(out, rank):
    barrier()  # every rank has decided before rank 0 removes anything
    if rank == 0:
        for name in RUN_FILES:
            (out / name).unlink(missing_ok=True)
        for name in RUN_FOLDERS:
            shutil.rmtree(out / name, ignore_errors=True)
    barrier()


def barrier():
    if dist.is_initialized():
        dist.barrier()


# ----------------------------------------------------------------------------- the steps

def teacher_forced_nll(model, processor, inputs, target_texts):
    """Mean -log p(target + <|im_end|> | prompt) over the target tokens of a batch (`inputs` from
    make_inputs, one target per row); backward of (nll x rows) sums over rows, as sync_gradients expects."""
    tok = policy.tokenizer_of(processor)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    targets = [tok(t, add_special_tokens=False)["input_ids"] + [eos] for t in target_texts]
    length = max(len(t) for t in targets)
    ids = torch.full((len(targets), length), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(targets), length), dtype=torch.long)
    for i, t in enumerate(targets):
        ids[i, :len(t)] = torch.tensor(t)
        mask[i, :len(t)] = 1
    model.train()
    logp = policy.token_logprobs(model, inputs, ids, mask)
    return -(logp * mask.to(logp.device)).sum() / mask.sum()


def sft_step(cfg, model, processor, batch, clips, observer):
    """Supervised warm-up on Video-R1's chain of thought: -log p(process + solution | prompt, video)
    (with --policy text: given the clean video's perception text)."""
    items = [(s, clips.get(s)) for s in batch]
    items = [(s, observer(s, f)) for s, f in items if f is not None]
    if not items:
        return None, 0
    inputs = observer.inputs(processor, [data.build_messages(s) for s, _ in items], [f for _, f in items])
    nll = teacher_forced_nll(model, processor, inputs, [data.sft_target(s) for s, _ in items])
    (nll * len(items)).backward()  # summed over samples: sync_gradients divides by the global count
    return nll.item(), len(items)


def agent_sft_step(cfg, model, processor, batch, clips, agent):
    """--agent robust-to's warm-up (ours; Robust-TO describes none, but a policy never shown the agent's
    prompts answers them with noise, and GRPO then sees only zero rewards). On the clean videos, both
    of the agent's outputs by teacher forcing: the decomposition as the one-sub-query plan (the
    question, typed by orchestrate.guess_type) in DECOMPOSE_PROMPT's JSON, and the synthesis over the
    evidence the tools return on the selected frames as orchestrate.warmup_target (the tiers' own
    synthesis when their evidence reaches the answer, else the evidence, Video-R1's chain of thought
    and the answer)."""
    from extensions.robust_to import orchestrate

    items = [(s, clips.get(s)) for s in batch]
    items = [(s, f) for s, f in items if f is not None]
    if not items:
        return None, 0
    samples = [s for s, _ in items]
    questions, sel, chosen = agent.prepare(samples, [f for _, f in items])
    plans = [[orchestrate.SubQuery(orchestrate.guess_type(q), q)] for q in questions]
    with torch.no_grad():
        evidence = agent.evidence(samples, questions, sel, chosen, range(len(samples)), plans)
    texts = [agent.decompose_text(q, len(c), p) for q, c, (_, _, p) in zip(questions, chosen, sel)]
    texts += [agent.synthesis_text(s, ev) for s, ev in zip(samples, evidence)]
    targets = [json.dumps([{"type": p[0].type, "sub_query": p[0].query}]) for p in plans]
    targets += [orchestrate.warmup_target(s, ev) for s, ev in zip(samples, evidence)]
    prompts = [[{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": t}]}] for t in texts]
    inputs = policy.make_inputs(processor, prompts, chosen + chosen)
    nll = teacher_forced_nll(model, processor, inputs, targets)
    (nll * len(items)).backward()
    return nll.item(), len(items)


def answerability(model, processor, videos, questions, observer=None):
    """c of Eq. 3: the policy's P(YES) on the answerability prompt (Fig. 10) with the perturbed video
    (`videos`: what `observer` made of them, the frames or the perception texts)."""
    prompts = [[{"role": "user", "content": [{"type": "video"},
                                             {"type": "text", "text": judges.ANSWERABILITY_PROMPT.format(question=q)}]}]
               for q in questions]
    inputs = observer.inputs(processor, prompts, videos) if observer else policy.make_inputs(processor, prompts, videos)
    yes, no = judges.answerability_token_ids(policy.tokenizer_of(processor))
    with torch.no_grad():
        logits = model(**{k: v.to(policy.model_device(model)) if hasattr(v, "to") else v for k, v in inputs.items()},
                       use_cache=False, logits_to_keep=1).logits[:, -1].float().cpu().numpy()
    return [judges.answerability_confidence(row, yes, no) for row in logits]


def answers_of(texts, sample):
    return [data.extract_answer(t, sample.source, problem_type=sample.problem_type) for t in texts]


class RL:
    """One rank's RL state (Alg. 2): shard cursor, corruption-spec stream, memory buffer, promotion queue."""

    def __init__(self, cfg, rank, device, shard, by_id, clips, model, processor, ref_model, judge, params, opt, sched,
                 observer=None):
        self.cfg, self.rank, self.device, self.shard, self.by_id, self.clips = cfg, rank, device, shard, by_id, clips
        self.observer = observer or Observer(cfg)
        self.model, self.processor, self.ref_model, self.judge = model, processor, ref_model, judge
        self.params, self.opt, self.sched = params, opt, sched
        self.cursor = Cursor(len(shard), cfg.seed * 1000 + 2 * rank + 1)
        self.buffer = membuf.MemoryBuffer(cfg.buffer_capacity, cfg.n_max, cfg.reeval_period)
        self.queue: list = []  # (sample id, spec dict) promoted by the buffer, trained first (Alg. 2 l.17)
        self.gen = dict(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
        self.schedule = grpo.parse_reward_weights(cfg.reward_weights) if cfg.reward_weights else None

    def weights(self):
        """(w_format, w_acc, w_consistency, w_alignment) for the data epoch being read (counted from 1):
        --reward-weights' schedule, else App. D's w_F, w_Acc with no consistency reward and r^A at 1."""
        if self.schedule is None:
            return self.cfg.w_format, self.cfg.w_acc, 0.0, 1.0
        w = grpo.reward_weights(self.cursor.epoch + 1, self.schedule)
        return (w[0], w[1], w[2], w[3]) if len(w) == 4 else (w[0], w[1], w[2], w[1])

    def state(self):
        return {"cursor": self.cursor.state(), "buffer": self.buffer.state_dict(), "queue": self.queue}

    def load(self, st):
        self.cursor.epoch, self.cursor.pos = st["cursor"]["epoch"], st["cursor"]["pos"]
        self.buffer.load_state_dict(st["buffer"])
        self.queue = [tuple(q) for q in st["queue"]]

    def _rollout(self, prompts, videos, n):
        inputs = self.observer.inputs(self.processor, prompts, videos)
        return policy.rollout(self.model, self.processor, inputs, n=n, **self.gen)

    def _update(self, n_rows):
        """One optimiser step on the gradients of this step's n_rows trained completions (averaged over
        ranks by their counts), clipped; the schedule advances even when nothing was trained (all deferred)."""
        if sync_gradients(self.params, n_rows, self.device) > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
            self.opt.step()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            self.sched.step()
        self.opt.zero_grad(set_to_none=True)

    def assess_entries(self, entries):
        """Eq. 5 / Alg. 2 l.15: d' of buffered samples, each on its regenerated corrupted video, in one
        batched rollout (reeval_rollouts each) and one answerability forward; an unreadable video
        gives its entry an exception (evicted by the buffer)."""
        out, todo = [], []
        for entry in entries:
            s = self.by_id[entry.sample_id]
            frames = self.clips.get(s)
            if frames is None:
                out.append(FileNotFoundError(f"video of {s.id} is unreadable"))
                continue
            out.append(None)
            todo.append((len(out) - 1, s,
                         self.observer(s, perturb.apply(frames, perturb.PerturbSpec.from_dict(entry.spec)))))
        if todo:
            k = self.cfg.reeval_rollouts
            roll = self._rollout([data.build_messages(s) for _, s, _ in todo], [p for _, _, p in todo], k)
            conf = answerability(self.model, self.processor, [p for _, _, p in todo],
                                 [data.question_text(s) for _, s, _ in todo], self.observer)
            for n, ((i, s, _), c) in enumerate(zip(todo, conf)):
                acc = [grpo.accuracy_reward(t, s.answer, s.problem_type, s.source) for t in roll.texts[n * k:(n + 1) * k]]
                out[i] = judges.self_assess(acc, c, tau=self.cfg.tau, a_min=self.cfg.a_min, a_max=self.cfg.a_max,
                                            unanswerable_below=self.cfg.unanswerable_below).difficulty
        return out

    def step(self, step, spec_rng):
        cfg, timer, G = self.cfg, Timer(), self.cfg.group_size
        dual = cfg.mode in ("rova", "dual")
        corrupt = cfg.mode != "grpo"  # standard GRPO trains on the clean video (App. G, Eq. 11)
        items = []
        while self.queue and len(items) < cfg.batch_size:
            sid, spec = self.queue.pop(0)
            items.append((self.by_id[sid], perturb.PerturbSpec.from_dict(spec), True))
        items += [(self.shard[i], None, False) for i in self.cursor.take(cfg.batch_size - len(items))]
        batch = []
        with timer("perturbation"):  # Sec. 3.1, Eq. 2: the dynamic protocol samples a spec per video
            for s, spec, promoted in items:
                frames = self.clips.get(s)
                if frames is None:
                    continue
                # drawn in every mode, so that all modes see the same spec stream for a given seed
                spec = spec or perturb.sample_spec(spec_rng, eta=cfg.eta)
                # "pert": the video of the trained branch (the clean one itself for --mode grpo)
                b = dict(sample=s, spec=spec, promoted=promoted, clean=frames,
                         pert=perturb.apply(frames, spec) if corrupt else frames)
                if cfg.temporal_grpo:  # Eq. 1 on top of the spatial corruption (alone for --mode grpo)
                    shuffled = perturb.PerturbSpec(spec.subtype if corrupt else None, spec.eta, spec.seed, True,
                                                   dict(spec.params) if corrupt else {})
                    b["shuffled"] = perturb.apply(frames, shuffled)
                batch.append(b)
        if self.observer.text:
            with timer("perception"):  # Embodied-R Sec. 2.2: each video the step uses becomes text (cached)
                for b in batch:
                    for key in ("clean", "pert", "shuffled"):
                        if key in b:
                            b[key] = self.observer(b["sample"], b[key])
        prompts = [data.build_messages(b["sample"]) for b in batch]
        if batch:
            if dual:
                with timer("clean_rollout"):  # Alg. 2 l.3: the clean anchor (no gradient)
                    clean = self._rollout(prompts, [b["clean"] for b in batch], G)
            with timer("perturbed_rollout" if corrupt else "clean_rollout"):
                pert = self._rollout(prompts, [b["pert"] for b in batch], G)
                shuf = self._rollout(prompts, [b["shuffled"] for b in batch], cfg.shuffled_group_size) \
                    if cfg.temporal_grpo else None
        with timer("self_assessment"):  # Eq. 3, Alg. 2 l.6-10
            for i, b in enumerate(batch):
                s = b["sample"]
                b["texts"] = pert.texts[i * G:(i + 1) * G]
                b["acc"] = [grpo.accuracy_reward(t, s.answer, s.problem_type, s.source) for t in b["texts"]]
                b["clean_texts"] = clean.texts[i * G:(i + 1) * G] if dual else None
                b["clean_acc"] = [grpo.accuracy_reward(t, s.answer, s.problem_type, s.source)
                                  for t in b["clean_texts"]] if dual else None
                b["decision"] = "train"
            judged = [b for b in batch if cfg.mode == "rova" and not b["promoted"]]
            if judged:
                conf = answerability(self.model, self.processor, [b["pert"] for b in judged],
                                     [data.question_text(b["sample"]) for b in judged], self.observer)
                for b, c in zip(judged, conf):
                    s = b["sample"]
                    a = judges.self_assess(b["acc"], c, answers_of(b["texts"], s), answers_of(b["clean_texts"], s),
                                           tau=cfg.tau, a_min=cfg.a_min, a_max=cfg.a_max,
                                           unanswerable_below=cfg.unanswerable_below)
                    b["decision"] = a.decision
                    if a.decision == "defer":  # Alg. 2 l.7-8, Eq. 4
                        self.buffer.add(s.id, b["spec"].to_dict(), step)
        idx = [i for i, b in enumerate(batch) if b["decision"] == "train"]  # by position: items hold arrays
        selected = [batch[i] for i in idx]
        missing = 0
        w_f, w_a, w_c, w_al = self.weights()
        with timer("alignment_reward"):  # Alg. 1 for the selected samples only (App. G)
            for i in idx:
                b = batch[i]
                s = b["sample"]
                rewards, comp = grpo.total_reward(  # w_al r^A = (w_al alpha_r) Sim^r + (w_al alpha_a) Sim^a
                    b["texts"], s.answer, s.problem_type, reference_texts=b["clean_texts"] if dual else None,
                    judge=self.judge if (dual or w_c) else None, w_format=w_f, w_acc=w_a,
                    alpha_r=w_al * cfg.alpha_r, alpha_a=w_al * cfg.alpha_a, source=s.source,
                    w_consistency=w_c, question=s.question, options=s.options or None)
                if cfg.temporal_grpo:
                    k = cfg.shuffled_group_size
                    shuf_acc = [grpo.accuracy_reward(t, s.answer, s.problem_type, s.source)
                                for t in shuf.texts[i * k:(i + 1) * k]]
                    comp["temporal"] = grpo.temporal_reward(b["acc"], shuf_acc)
                    rewards = [r + t for r, t in zip(rewards, comp["temporal"])]
                b["rewards"], b["comp"] = rewards, comp
                missing += comp["judge_missing"]
        loss_stats = {}
        with timer("backward"):  # Eq. 7-8 on the perturbed branch
            n_rows = 0
            if selected:
                rows = [i * G + j for i in idx for j in range(G)]
                model = self.model
                inputs = self.observer.inputs(self.processor, [prompts[i] for i in idx], [batch[i]["pert"] for i in idx])
                inputs = policy.repeat_for(model, inputs, G)
                ids, mask = pert.completion_ids[rows], pert.completion_mask[rows]
                adv = grpo.group_advantages([b["rewards"] for b in selected]).view(-1)
                model.train()
                logp = policy.token_logprobs(model, inputs, ids, mask, temperature=cfg.temperature)
                if cfg.beta > 0:
                    ref = policy.reference_logprobs(model, inputs, ids, mask, ref_model=self.ref_model,
                                                    temperature=cfg.temperature)
                else:
                    ref = logp.detach()
                # one update per generation (as Video-R1): old = current policy, the ratio is 1 at the update
                loss, loss_stats = grpo.grpo_loss(logp, logp.detach(), ref, adv.to(logp.device),
                                                  mask.to(logp.device), cfg.clip_eps, cfg.beta)
                (loss * len(rows)).backward()
                loss_stats["loss"] = loss.item()
                n_rows = len(rows)
            self._update(n_rows)
        promoted = evicted = 0
        with timer("memory_reevaluation"):  # Eq. 5-6, Alg. 2 l.12-21
            if cfg.mode == "rova" and self.buffer.due(step + 1):
                # batched as a step's rollouts: batch_size x group_size sequences per generate call
                up, out = self.buffer.reevaluate(assess_batch=self.assess_entries, batch_size=max(
                    1, cfg.batch_size * cfg.group_size // max(1, cfg.reeval_rollouts)))
                self.queue.extend((e.sample_id, e.spec) for e in up)
                promoted, evicted = len(up), len(out)
        rec = self._record(batch, selected, loss_stats, missing, promoted, evicted, n_rows, timer, corrupt)
        rec.update(w_format=w_f, w_acc=w_a, w_consistency=w_c, w_alignment=w_al if dual else 0.0)
        return rec

    def _record(self, batch, selected, loss_stats, missing, promoted, evicted, n_rows, timer, corrupt=True):
        """Sums and counts of this rank's step, reduced over ranks by `reduce_record`."""
        s = defaultdict(float)
        for key in ("acc_perturbed", "acc_clean", "r_format", "r_accuracy", "r_alignment", "r_consistency",
                    "r_temporal", "r_total",
                    "sim_r", "sim_a", "kl", "clip_fraction", "ratio", "loss"):
            s[f"{key}_sum"], s[f"{key}_n"] = 0.0, 0.0  # every key in every record (None when there is no data)
        s["samples"] = len(batch)
        s["selected"] = len(selected)
        s["discarded"] = sum(b["decision"] == "discard" for b in batch)
        s["deferred"] = sum(b["decision"] == "defer" for b in batch)
        s["promoted_trained"] = sum(b["promoted"] for b in selected)
        for b in batch:  # rollout accuracy on each branch's video (--mode grpo has the clean one only)
            for key, acc in (("acc_perturbed", b["acc"] if corrupt else None),
                             ("acc_clean", b["clean_acc"] if corrupt else b["acc"])):
                if acc is not None:
                    s[f"{key}_sum"] += sum(acc)
                    s[f"{key}_n"] += len(acc)
        for b in selected:
            for key in ("format", "accuracy", "alignment", "consistency", "temporal"):
                vals = b["comp"].get(key) or []
                s[f"r_{key}_sum"] += sum(vals)
                s[f"r_{key}_n"] += len(vals)
            s["r_total_sum"] += sum(b["rewards"])
            s["r_total_n"] += len(b["rewards"])
            for key in ("sim_r", "sim_a"):
                vals = [v for v in b["comp"][key] if v is not None]
                s[f"{key}_sum"] += sum(vals)
                s[f"{key}_n"] += len(vals)
        for key in ("kl", "clip_fraction", "ratio", "loss"):
            if key in loss_stats:
                s[f"{key}_sum"] += loss_stats[key] * n_rows
                s[f"{key}_n"] += n_rows
        s["judge_missing"] = missing
        s["promoted"], s["evicted"], s["buffer_size"] = promoted, evicted, len(self.buffer)
        for k, v in timer.seconds.items():
            s[f"sec_{k}"] = v
        return s


class AgentRL(RL):
    """--agent robust-to: GRPO on Robust-TO's agent (orchestrate.Agent over this policy). A step: the
    batch's videos (clean for --mode grpo; for grpo-aug one of Robust-TO's five corruptions each,
    perturb.PROTOCOLS["robust-to"], dynamic protocol); G agent rollouts per video (sampled
    decompositions, the tools, a sampled synthesis each); the confidence-cost reward
    (grpo.confidence_cost_reward) plus w_F times the format reward of the synthesis; Eq. 8's group
    advantages; Eq. 7's loss on the decomposition and the synthesis tokens of every rollout (one
    advantage per rollout for both). The sub-query budget comes from the frozen reference (the policy
    as RL starts; with LoRA its adapters off; with neither, beta 0 and no LoRA, the policy when the
    sample is first met), asked once per sample and kept."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from extensions.robust_to import orchestrate
        cfg = self.cfg
        self.agent = orchestrate.Agent(self.model, self.processor, k=cfg.agent_k, max_subqueries=cfg.max_subqueries,
                                       synthesis_tokens=cfg.synthesis_tokens or cfg.max_new_tokens)
        self.expected: dict = {}

    def _budget(self, batch):
        todo = [b for b in batch if b["sample"].id not in self.expected]
        if not todo:
            return
        args = ([b["sample"] for b in todo], [b["pert"] for b in todo])
        if self.ref_model is None and hasattr(self.model, "disable_adapter"):
            with self.model.disable_adapter():
                counts = self.agent.expected_subqueries(*args)
        else:
            counts = self.agent.expected_subqueries(*args, model=self.ref_model)
        for b, n in zip(todo, counts):
            self.expected[b["sample"].id] = n

    def step(self, step, spec_rng):
        cfg, timer, G = self.cfg, Timer(), self.cfg.group_size
        corrupt = cfg.mode == "grpo-aug"
        batch = []
        with timer("perturbation"):
            for i in self.cursor.take(cfg.batch_size):
                s = self.shard[i]
                frames = self.clips.get(s)
                if frames is None:
                    continue
                sub = str(spec_rng.choice(perturb.PROTOCOLS["robust-to"]))  # drawn in both modes: one stream
                spec = perturb.sample_spec(spec_rng, subtype=sub, eta=cfg.eta)
                batch.append(dict(sample=s, spec=spec, promoted=False, decision="train", clean_acc=None,
                                  pert=perturb.apply(frames, spec) if corrupt else frames))
        w_f, w_a, _, _ = self.weights()
        loss_stats, n_rows, extra = {}, 0, defaultdict(float)
        if batch:
            with timer("estimator"):
                self._budget(batch)
            with timer("perturbed_rollout" if corrupt else "clean_rollout"):
                traces, dec, syn = self.agent.sample([b["sample"] for b in batch], [b["pert"] for b in batch], G,
                                                     cfg.temperature)
            with timer("reward"):
                for i, b in enumerate(batch):
                    s, tr = b["sample"], traces[i * G:(i + 1) * G]
                    parts = [grpo.confidence_cost_reward(
                        t.synthesis, s.answer, s.problem_type, t.evidence, len(t.subqueries), self.expected[s.id],
                        options=s.options or None, source=s.source, w_acc=w_a, w_rel=cfg.w_reliability,
                        w_cost=cfg.w_cost) for t in tr]
                    fmt = [grpo.format_reward(t.synthesis) for t in tr]
                    b["acc"] = [c["accuracy"] for c in parts]
                    b["rewards"] = [w_f * f + c["total"] for f, c in zip(fmt, parts)]
                    b["comp"] = {"format": fmt, "accuracy": b["acc"], "sim_r": [], "sim_a": []}
                    for key, vals in (("r_reliability", [c["reliability"] for c in parts]),
                                      ("extra_subqueries", [c["extra_subqueries"] for c in parts]),
                                      ("subqueries", [len(t.subqueries) for t in tr]),
                                      ("evidence_high", [e.tier == "HIGH" for t in tr for e in t.evidence])):
                        extra[f"{key}_sum"] += sum(vals)
                        extra[f"{key}_n"] += len(vals)
        with timer("backward"):  # Eq. 7-8 over both completions of every rollout
            if batch:
                adv = grpo.group_advantages([b["rewards"] for b in batch]).view(-1)
                self.model.train()
                for roll in (dec, syn):
                    logp = policy.token_logprobs(self.model, roll.prompt_inputs, roll.completion_ids,
                                                 roll.completion_mask, temperature=cfg.temperature)
                    ref = policy.reference_logprobs(self.model, roll.prompt_inputs, roll.completion_ids,
                                                    roll.completion_mask, ref_model=self.ref_model,
                                                    temperature=cfg.temperature) if cfg.beta > 0 else logp.detach()
                    mask = roll.completion_mask.to(logp.device)
                    loss, st = grpo.grpo_loss(logp, logp.detach(), ref, adv.to(logp.device), mask, cfg.clip_eps,
                                              cfg.beta)
                    (loss * len(adv)).backward()
                    for k, v in st.items():  # means over the two halves, weighted by rows
                        loss_stats[k] = loss_stats.get(k, 0.0) + float(v) / 2
                    loss_stats["loss"] = loss_stats.get("loss", 0.0) + loss.item() / 2
                n_rows = 2 * len(adv)
            self._update(n_rows)
        rec = self._record(batch, batch, loss_stats, 0, 0, 0, n_rows, timer, corrupt)
        rec.update(extra)
        rec.update(w_format=w_f, w_acc=w_a, w_consistency=0.0, w_alignment=0.0)
        return rec


def build_rl(cfg, rank, world, device, samples, clips, model, processor, ref_model, observer=None):
    """This rank's RL stage for cfg.mode: its shard, the alignment judge (dual-branch modes; App. C.1,
    verdicts cached so a resumed run asks nothing twice), AdamW with the cosine schedule over rl_steps."""
    consistency = bool(cfg.reward_weights) and any(w[2] > 0 for _, _, w in grpo.parse_reward_weights(cfg.reward_weights))
    judge = judges.make_judge(cfg.judge, cache=cfg.judge_cache or str(Path(cfg.out) / "judge_cache.sqlite")) \
        if cfg.mode in ("rova", "dual") or consistency else None
    params, opt, sched = make_optimizer(cfg, model, cfg.lr, cfg.rl_steps)
    return (AgentRL if cfg.agent else RL)(cfg, rank, device, samples[rank::world], {s.id: s for s in samples}, clips,
                                          model, processor, ref_model, judge, params, opt, sched, observer)


def reduce_record(s, device, world):
    """Means of the per-rank sums (Table 12's rates, Table 14's seconds averaged over ranks)."""
    keys = sorted(s)
    tot = dict(zip(keys, all_sum([s[k] for k in keys], device)))
    rec = {}
    for k in keys:
        if k.endswith("_sum"):
            base = k[:-4]
            rec[base] = tot[k] / tot[base + "_n"] if tot.get(base + "_n") else None
        elif not k.endswith("_n"):
            rec[k] = tot[k] / world if k.startswith(("sec_", "w_")) else tot[k]  # w_*: the same on every rank
    n = tot.get("samples", 0)
    rec["rho"] = tot.get("selected", 0) / n if n else None  # effective training ratio rho_t (App. G)
    rec["discard_rate"] = tot.get("discarded", 0) / n if n else None
    rec["defer_rate"] = tot.get("deferred", 0) / n if n else None
    return rec


# ----------------------------------------------------------------------------- evaluation (before / after)

def evaluate(cfg, model, processor, samples, limit, observer, batch_size=16):
    """A quick check for the demo: greedy accuracy pooled over questions, on clean videos and under
    PVRBench's static corruption (each question gets one of the 12 subtypes in turn). The benchmark's
    own aggregation (per-task means, categories, reasoning quality) is eval_pvrbench.py's."""
    samples = samples[:limit]
    scores = {"clean": [], "perturbed": []}
    for start in range(0, len(samples), batch_size):
        chunk, clips = [], []
        for k, s in enumerate(samples[start:start + batch_size]):
            try:
                frames, _, _ = video.read_frames(s.video, num_frames=cfg.frames, max_pixels=cfg.max_pixels,
                                                 sampler=cfg.frame_sampler, keyframe_eps=cfg.keyframe_eps)
            except Exception as e:  # noqa: BLE001
                log(f"evaluation: skipping {s.id}: {e}")
                continue
            chunk.append((s, perturb.SUBTYPES[(start + k) % len(perturb.SUBTYPES)]))
            clips.append(frames)
        if not chunk:
            continue
        for cond in scores:
            vids = clips if cond == "clean" else [  # Sec. 4 static protocol: one corruption per (video, subtype)
                perturb.apply(f, perturb.static_spec(data.video_identity(s), sub, eta=cfg.eta))
                for f, (s, sub) in zip(clips, chunk)]
            inputs = observer.inputs(processor, [data.build_messages(s) for s, _ in chunk],
                                     [observer(s, v) for v, (s, _) in zip(vids, chunk)])
            out = policy.rollout(model, processor, inputs, n=1, max_new_tokens=cfg.max_new_tokens, do_sample=False)
            scores[cond] += [data.score_sample(t, s) for t, (s, _) in zip(out.texts, chunk)]
    return {k: (float(np.mean(v)) if v else None) for k, v in scores.items()} | {"n": len(scores["clean"])}


# ----------------------------------------------------------------------------- main

def prepare_demo(cfg, rank):
    """No --model and no --data: the tiny model and the synthetic benchmark under OUT (built once). The
    --policy text demo in its default OUT shares the VLM demo's benchmark (runs/rova/synthetic, which
    eval_pvrbench.py also reads), so the same 480 clips are rendered once."""
    out = Path(cfg.out)
    text = cfg.policy == "text"
    tiny, synth = out / ("tiny-text" if text else "tiny"), out / "synthetic"
    if text and cfg.out == TEXT_DEMO_OUT:
        synth = Path(Config().out) / "synthetic"
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        if not (tiny / "config.json").is_file():
            log(f"demo: building the tiny {'text LM' if text else 'model'} in {tiny}")
            with runtime.no_hf_progress_bars():
                policy.build_tiny(tiny, arch="qwen2" if text else "qwen2_5_vl")
        if not (synth / "summary.json").is_file():
            log(f"demo: rendering the synthetic benchmark ({cfg.demo_clips} clips) in {synth}")
            data.make_synthetic(synth, n=cfg.demo_clips, seed=0, num_frames=cfg.frames, size=56)
    barrier()
    cfg.model, cfg.data = str(tiny), str(synth / "train.json")
    cfg.eval_data, cfg.eval_video_root = str(synth / "eval.jsonl"), str(synth / "videos")


def apply_demo_preset(cfg):
    """No --model and no --data: the demo's settings (DEMO), except what the user set explicitly."""
    defaults = Config()
    for k, v in DEMO.items():
        if getattr(cfg, k) == getattr(defaults, k):
            setattr(cfg, k, v)
    if cfg.policy == "text":
        cfg.perceiver = cfg.perceiver or "cv"  # the demo's perception: classical vision, no model to download
        if cfg.out == defaults.out:  # keep the VLM demo's runs/rova (eval_pvrbench.py's default) apart
            cfg.out = TEXT_DEMO_OUT


def check_sources(cfg):
    """Every model the run will load exists (locally, in the cache or on a reachable hub): one line now,
    not a traceback after the data is read."""
    runtime.model_source(cfg.model)
    runtime.check_hf_flags({"--judge": cfg.judge, "--perceiver": cfg.perceiver})


def main(argv=None):
    global log, RESUME_HINT
    cfg = parse_args(argv)
    rank, world, device = setup_distributed()
    log = (lambda *a, **k: print(*a, **k, flush=True)) if rank == 0 else (lambda *a, **k: None)
    demo = not cfg.model and not cfg.data
    if demo:
        apply_demo_preset(cfg)
    elif not (cfg.model and cfg.data):
        raise runtime.UserError("give both --model and --data (or neither, for the demo)")
    out = runtime.out_dir(cfg.out, create=False)
    if demo:
        prepare_demo(cfg, rank)
    else:
        check_sources(cfg)  # before OUT is made: a mistyped --model leaves no empty folder
    out.mkdir(parents=True, exist_ok=True)
    RESUME_HINT = f"rerun the same command to continue from the last checkpoint in {out / 'checkpoints'}"
    random.seed(cfg.seed * 1000 + rank)
    np.random.seed(cfg.seed * 1000 + rank)
    torch.manual_seed(cfg.seed * 1000 + rank)
    spec_rng = np.random.default_rng([cfg.seed, rank, 0xC0DE])

    samples, missing = data.load_video_r1(cfg.data, cfg.video_root or None)
    n_videos = len({s.video for s in samples} | {p for _, p in missing})
    n_missing = len({p for _, p in missing})
    if n_missing > cfg.max_bad_fraction * max(n_videos, 1):
        raise runtime.UserError(f"stopping: {n_missing} of {n_videos} videos of {cfg.data} are missing (more than "
                                f"--max-bad-fraction {cfg.max_bad_fraction}); e.g. {missing[0][1]}")
    if not samples:
        raise runtime.UserError(f"no usable training samples in {cfg.data}")
    shard = samples[rank::world]
    clips = Clips(cfg, missing, n_videos)

    ckpt = claim_run_folder(cfg, rank)
    state = json.loads((ckpt / "state.json").read_text())["state"] if ckpt else {"stage": "sft", "step": 0}
    per_rank = (json.loads((ckpt / f"rank{rank}.json").read_text()),
                torch.load(ckpt / f"rank{rank}_rng.pt", weights_only=True)) if ckpt else None
    model, processor = load_model(cfg, device, weights=str(ckpt / "model") if ckpt else None)
    if policy.is_text_model(model) != (cfg.policy == "text"):
        raise runtime.UserError(f"--model {cfg.model} is a {'text-only LM' if policy.is_text_model(model) else 'VLM'}: "
                         f"use --policy {'text' if policy.is_text_model(model) else 'vlm'}")
    observer = Observer(cfg)
    if ckpt and rank == 0:
        _truncate_log(out / "log.jsonl", state)
    barrier()
    writer = _tensorboard(out) if rank == 0 else None

    eval_samples = []
    if cfg.eval_data:
        eval_samples, _ = data.load_vsibench(cfg.eval_data, cfg.eval_video_root or None)
    if eval_samples and rank == 0 and not (out / "eval_before.json").is_file():
        before = evaluate(cfg, model, processor, eval_samples, cfg.eval_limit, observer)
        (out / "eval_before.json").write_text(json.dumps(before))
    steps_this_run = 0

    # ---- stage 1: SFT warm-up on the chain-of-thought data (App. D: 1 epoch)
    sft_total = int(math.ceil(cfg.sft_epochs * (len(samples) // world) / cfg.sft_batch_size))
    if state["stage"] == "sft":
        sft_agent = None
        if cfg.agent:
            from extensions.robust_to import orchestrate
            sft_agent = orchestrate.Agent(model, processor, k=cfg.agent_k, max_subqueries=cfg.max_subqueries)
        params, opt, sched = make_optimizer(cfg, model, cfg.sft_lr, sft_total)
        cursor = Cursor(len(shard), cfg.seed * 1000 + 2 * rank)
        if ckpt:
            _load_optimizer(ckpt, opt, sched)
            cursor.epoch, cursor.pos = per_rank[0]["cursor"]["epoch"], per_rank[0]["cursor"]["pos"]
            set_rng_state(per_rank[0]["rng"], per_rank[1], spec_rng)
        bar = _bar(sft_total, state["step"], "SFT", rank)
        while state["step"] < sft_total:
            t0 = time.perf_counter()
            chunk = [shard[i] for i in cursor.take(cfg.sft_batch_size)]
            nll, n = (agent_sft_step(cfg, model, processor, chunk, clips, sft_agent) if sft_agent
                      else sft_step(cfg, model, processor, chunk, clips, observer))
            if sync_gradients(params, n, device) > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            state["step"] += 1
            rec = {"stage": "sft", "step": state["step"], "lr": sched.get_last_lr()[0],
                   "nll": _mean_over_ranks(nll, n, device), "bad_videos": len(clips.bad), "sec_step": time.perf_counter() - t0}
            _log_step(out, rec, writer, bar, rank)
            steps_this_run += 1
            if state["step"] % cfg.save_every == 0 or state["step"] == sft_total:
                save_checkpoint(cfg, rank, model, processor, opt, sched, dict(state),
                                _rank_state({"cursor": cursor.state()}, spec_rng))
            if cfg.stop_after and steps_this_run >= cfg.stop_after:
                log(f"--stop-after {cfg.stop_after}: exiting as if killed")
                return
        _close(bar)
        state = {"stage": "rl", "step": 0}
        ckpt = per_rank = None
        if eval_samples and rank == 0 and sft_total > 0:
            (out / "eval_after_sft.json").write_text(json.dumps(evaluate(cfg, model, processor, eval_samples,
                                                                         cfg.eval_limit, observer)))

    # ---- stage 2: RL (Alg. 2)
    ref_model = None
    if cfg.beta > 0 and cfg.lora_r == 0:  # the frozen reference: the policy as RL starts (with LoRA: adapters off)
        ref_dir = out / "reference"
        if rank == 0 and not (ref_dir / "config.json").is_file():
            save_model(model, processor, ref_dir)
        barrier()
        with runtime.no_hf_progress_bars():  # the policy just loaded, once more: no second bar
            ref_model = policy.frozen_copy(policy.load_policy(str(ref_dir), device=device)[0])
    rl = build_rl(cfg, rank, world, device, samples, clips, model, processor, ref_model, observer)
    if ckpt and state["stage"] == "rl":
        _load_optimizer(ckpt, rl.opt, rl.sched)
        rl.load(per_rank[0]["rl"])
        set_rng_state(per_rank[0]["rng"], per_rank[1], spec_rng)
    bar = _bar(cfg.rl_steps, state["step"], f"RL ({cfg.mode})", rank)
    while state["step"] < cfg.rl_steps:
        t0 = time.perf_counter()
        s = rl.step(state["step"], spec_rng)
        state["step"] += 1
        rec = {"stage": "rl", "step": state["step"], "lr": rl.sched.get_last_lr()[0]} | reduce_record(s, device, world)
        rec["bad_videos"] = len(clips.bad)
        rec["sec_step"] = time.perf_counter() - t0
        _log_step(out, rec, writer, bar, rank)
        steps_this_run += 1
        if state["step"] % cfg.save_every == 0 or state["step"] == cfg.rl_steps:
            save_checkpoint(cfg, rank, model, processor, rl.opt, rl.sched, dict(state),
                            _rank_state({"rl": rl.state()}, spec_rng))
        if cfg.stop_after and steps_this_run >= cfg.stop_after and state["step"] < cfg.rl_steps:
            log(f"--stop-after {cfg.stop_after}: exiting as if killed")
            return
    _close(bar)

    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))  # equal on every rank
    gathered = [(checksum, clips.bad)] * world
    if dist.is_initialized():
        dist.all_gather_object(gathered, (checksum, clips.bad))
    if rank == 0:
        save_model(model, processor, out / "final")
        bad = {path: why for _, b in gathered for path, why in b.items()}  # every rank's skipped videos
        summary = {"config": asdict(cfg), "buffer": rl.buffer.stats(), "bad_videos": len(bad),
                   "bad_video_files": dict(sorted(bad.items())[:50]), "rank_checksums": [c for c, _ in gathered]}
        if eval_samples:
            summary["before"] = json.loads((out / "eval_before.json").read_text())
            if (out / "eval_after_sft.json").is_file():
                summary["after_sft"] = json.loads((out / "eval_after_sft.json").read_text())
            summary["after"] = evaluate(cfg, model, processor, eval_samples, cfg.eval_limit, observer)
            b, a = summary["before"], summary["after"]
            m = summary.get("after_sft")
            log(f"accuracy on {a['n']} held-out questions (greedy; perturbed = PVRBench static corruption):")
            log(f"             before{'   after SFT' if m else ''}   after {cfg.mode} RL")
            for k in ("clean", "perturbed"):
                log(f"  {k:<10} {b[k]:6.3f}" + (f"   {m[k]:9.3f}" if m else "") + f"   {a[k]:12.3f}")
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        log(f"final weights in {out / 'final'}")
    barrier()
    if dist.is_initialized():
        dist.destroy_process_group()


def _rank_state(plain, spec_rng):
    rng_plain, rng_tensors = rng_state(spec_rng)
    return {**plain, "rng": rng_plain}, rng_tensors


def _mean_over_ranks(value, n, device):
    tot = all_sum([0.0 if value is None else value * n, float(n)], device)
    return tot[0] / tot[1] if tot[1] else None


def _load_optimizer(ckpt, opt, sched):
    st = torch.load(ckpt / "optimizer.pt", weights_only=True)
    opt.load_state_dict(st["optimizer"])
    sched.load_state_dict(st["scheduler"])


def _truncate_log(path, state):
    """On resume, drop log lines of steps after the checkpoint (they are redone)."""
    if not path.is_file():
        return
    order = {"sft": 0, "rl": 1}
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and
            (order[json.loads(ln)["stage"]], json.loads(ln)["step"]) <= (order[state["stage"]], state["step"])]
    path.write_text("".join(ln + "\n" for ln in keep))


def _tensorboard(out):
    try:
        from torch.utils.tensorboard import SummaryWriter
        return SummaryWriter(str(out / "tensorboard"))
    except Exception:  # noqa: BLE001 - optional
        return None


def _bar(total, initial, desc, rank):
    if rank != 0:
        return None
    try:
        from tqdm import tqdm
        return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)
    except ImportError:
        return None


def _close(bar):
    if bar is not None:
        bar.close()


def _log_step(out, rec, writer, bar, rank):
    if rank != 0:
        return
    with open(out / "log.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    if writer is not None:
        for k, v in rec.items():
            if isinstance(v, (int, float)) and k not in ("step",):
                writer.add_scalar(f"{rec['stage']}/{k}", v, rec["step"])
    if bar is not None:
        bar.update(1)
        keys = ("nll",) if rec["stage"] == "sft" else ("r_total", "acc_perturbed", "acc_clean", "rho")
        bar.set_postfix({k: round(rec[k], 3) for k in keys if rec.get(k) is not None})


if __name__ == "__main__":
    runtime.run(main, interrupted=lambda: RESUME_HINT)
