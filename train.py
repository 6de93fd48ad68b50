"""ROVA training (Alg. 2): an SFT warm-up on chain-of-thought data, then dual-branch GRPO with the
self-reflective, difficulty-aware curriculum and the temporal memory buffer.

    python train.py                                   # the CPU demo: tiny model + synthetic benchmark
    torchrun --nproc_per_node=4 train.py --model Qwen/Qwen2.5-VL-7B-Instruct \\
        --data data/Video-R1-COT-outdoor.json --video-root data/Video-R1-data --out runs/rova --judge openai:gpt-4o
    python train.py --model ... --lora-r 64 --load-in-4bit   # one smaller GPU
    torchrun --nproc_per_node=4 train.py ... --rollout-engine vllm   # rollouts on a colocated vLLM engine per GPU

One RL step (`RL.step`) follows App. G's order, the one that saves cost: corrupt each video by a spec drawn for
it (dynamic protocol, Sec. 3.1); roll out G on the clean and G on the perturbed video (Alg. 2 l.3); self-assess
every sample (Eq. 3, l.6), discard confident easy ones, defer difficult ones to the buffer (l.7-10), and draw more
from the stream until batch_size are selected; rewards (Alg. 1) and the GRPO update (Eq. 7-8) for the selected
only; every `reeval_period` steps re-evaluate the buffer on regenerated videos (Eq. 5-6, l.12-21). Baselines:
`--mode dual` naive dual-branch (no curriculum; App. G Eq. 12), `--mode grpo` standard GRPO on clean videos (Eq.
11), `--mode grpo-aug` GRPO on corrupted videos (Sec. 1's "generic data augmentation"); for a --seed every mode
draws the same corruption specs and data order.

Distributed (machinery/model/parallel.py): FSDP2 for full fine-tuning, DDP for LoRA; each rank has its own data
shard and buffer, and the gradient is the mean over every rank's trained completions. An extension (extensions/)
writes its own main from these pieces: parse_args with its Config subclass, runs.setup with what its policy sees of
a clip, and train() with its RL subclass's phases.
"""
from __future__ import annotations

from machinery import cli  # noqa: I001 - first: it sets the OpenMP wait policy before torch loads (GOMP_SPINCOUNT)
import gc
import json
import math
import textwrap
import time
from collections import defaultdict, namedtuple
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import buffer
import grpo
import judge as judges
import perturb
from machinery import distributed, seeds, steplog
from machinery.datasets import answers, data, synthetic
from machinery.model import engine, learner, parallel, policy
from machinery.training import checkpoints, records, runs, warmup
from machinery.training.clips import Observer, jitter

option = runs.arg   # a Config field: a flag in its group, or a setting (--set NAME=VALUE); extensions use it too
MODES = ("rova", "dual", "grpo", "grpo-aug")

GROUPS = {  # --help shows the flags in these groups, in this order
    "model": "the policy and how it is trained (full fine-tune, LoRA, 4-bit)",
    "data": "training data and how videos are read (Sec. 5.1, App. D)",
    "output": "the run folder: logs, checkpoints, resuming",
    "SFT": "the supervised warm-up (Sec. 5.1, App. D)",
    "RL": "dual-branch GRPO (Alg. 1-2, Eq. 7-10, App. D)",
    "curriculum": "self-assessment and the memory buffer (Sec. 3.2, Eq. 3-6, Alg. 2 l.6-21)",
    "distributed": "torchrun --nproc_per_node=N train.py ...: NCCL on GPUs, gloo on CPU, one data shard and "
                   "buffer per rank, gradients averaged over every rank's trained completions",
}


@dataclass
class Config(runs.RunConfig):
    """Every default is App. D's unless said otherwise; each field with a group is a command-line flag (the
    run's plumbing, its folder, process layout, demo and caches, is runs.RunConfig's)."""
    # model
    model: str = option("", "policy: any AutoModelForImageTextToText path or hub id (Qwen2.5-VL, Qwen2-VL, "
                            "Qwen3-VL); empty with --data empty: the demo's tiny model", "model")
    lora_r: int = option(0, "LoRA rank on the language model (0: full fine-tune)", "model")
    load_in_4bit: bool = option(False, "NF4 4-bit base weights (needs --lora-r > 0)", "model")
    micro_batch_size: int = option(8, "rows per forward/backward: a step's completions (RL) or samples (SFT) are "
                                      "accumulated in micro-batches of this many; 0: all at once", "model")
    # data
    data: str = option("", "training data, Video-R1 JSON (Sec. 5.1: a Video-R1-260k subset, `python -m "
                           "machinery.datasets.subset make-subset`); empty: the demo", "data")
    video_root: str = option("", "folder the data's video paths are relative to (default: the JSON's folder)", "data")
    frames: int = option(16, "frames per video (App. D: 16 in training)", "data")
    max_pixels: int = option(128 * 28 * 28, "pixels per frame (App. D: 128x28x28 in training)", "data")
    seed: int = option(0, "seed of data order, corruption specs and sampling", "data")
    depth_model: str = option("auto", "depth of the depth-graded corruptions: auto (a clip's own, the synthetic "
                              "benchmark's; else Depth-Anything-V2-Small-hf, cached per clip: depth.py), proxy "
                              "(perturb.py's, no model), or a depth-estimation model's hub id or folder", "data")
    # SFT
    sft_epochs: float = option(1.0, "SFT warm-up epochs on `process` + `solution` (App. D: 1)", "SFT")
    sft_batch_size: int = option(8, "videos per SFT step per process", "SFT")
    sft_lr: float = option(1e-5, "AdamW learning rate of SFT, cosine schedule (App. D: 1e-5)", "SFT")
    sft_jitter: float = option(0.0, "SFT clips' photometric jitter, contrast and brightness each scaled by U(1 - x, "
                               "1 + x): the lighting invariance a pretrained VLM has and a tiny model lacks (0: none)")
    sft_jitter_fresh: bool = option(False, "sft_jitter drawn anew at each showing of a clip (else once per clip)")
    # RL
    mode: str = option("rova", "rova (full) | dual (alignment, no curriculum) | grpo (single branch, clean videos) | "
                               "grpo-aug (single branch, corrupted videos) (Table 3, 13; App. G)", "RL", MODES)
    rl_steps: int = option(300, "RL steps (App. D: 300)", "RL")
    batch_size: int = option(4, "videos per RL step per process (Table 14: N = 4 per GPU)", "RL")
    group_size: int = option(8, "G: rollouts per video and branch (App. D: 8)", "RL")
    temporal_grpo: int = option(0, "G~: add T-GRPO's group of this many rollouts on the shuffled video (Video-R1; "
                                   "App. D: G~ = 4); 0: off", "RL")
    eta: str = option("0.7", "perturbation intensity: a number (App. D: 0.7), or per subtype, e.g. '0.7,fog=0.4' "
                             "(the first number is the other subtypes')", "RL")
    lr: float = option(1e-5, "AdamW learning rate of RL, cosine schedule (App. D: 1e-5)", "RL")
    clip_eps: float = option(0.2, "PPO clip epsilon of Eq. 7 (App. D: 0.2)", "RL")
    beta: float = option(0.01, "KL coefficient of Eq. 7 (App. D: 0.01)", "RL")
    alpha_r: float = option(0.3, "reasoning-consistency weight of the alignment reward (App. D: 0.3)", "RL")
    alpha_a: float = option(0.7, "answer-consistency weight of the alignment reward (App. D: 0.7)", "RL")
    w_format: float = option(1.0, "weight of the format reward (App. D: w_F = 1)", "RL")
    w_acc: float = option(1.0, "weight of the accuracy reward (App. D: w_Acc = 1)", "RL")
    max_grad_norm: float = option(1.0, "gradient norm clip (App. D: 1.0)", "RL")
    judge: str = option("local", "alignment judge: local | openai:MODEL | hf:PATH (App. C.1; the paper's GPT-4o)", "RL")
    max_new_tokens: int = option(256, "tokens per rollout", "RL")
    rollout_engine: str = option("hf", "rollouts by hf (transformers generate, shared prefix) or vllm (a colocated "
                                 "vLLM engine per rank, synced after every update: requirements-vllm.txt)", "RL")
    engine_max_gap: float = option(0.05, "--rollout-engine vllm: the largest mean |engine - policy| log-prob gap per "
                                   "trained token (the policy's from a forward without dropout, both at temperature "
                                   "1: vLLM's raw log-probs, whatever the sampling temperature); above it on 3 steps "
                                   "in a row the run stops: the engine is not sampling from the trained policy (0: "
                                   "never stops)")
    # curriculum
    tau: float = option(0.8, "confidence threshold: easy samples with c > tau are discarded (Sec. 3.2, App. D)",
                        "curriculum")
    a_min: float = option(0.3, "perturbed accuracy below a_min: difficult (App. D)", "curriculum")
    a_max: float = option(0.85, "perturbed accuracy at least a_max (and answers agree): easy (App. D)", "curriculum")
    buffer_capacity: int = option(1000, "memory buffer size |M|_max (App. D: 1000)", "curriculum")
    n_max: int = option(3, "re-evaluations before eviction N_max (App. D: 3; the paper also writes K_max = 537)",
                        "curriculum")
    reeval_period: int = option(50, "re-evaluate the buffer every this many steps (App. D, App. G: 50)", "curriculum")
    # settings without a flag of their own (readings and plumbing): --set NAME=VALUE
    weight_decay: float = option(0.0, "AdamW weight decay")
    top_p: float = option(1.0, "nucleus sampling of rollouts")
    temperature: float = option(1.0, "sampling temperature of rollouts")
    unanswerable_below: float = option(0.5, "difficult below this P(YES) on Fig. 10's prompt (Sec. 3.2; 0: off)")
    reeval_rollouts: int = option(0, "perturbed rollouts per buffered sample re-assessed by the accuracy rule (0: G)")
    answerability_epochs: float = option(0.0, "epochs of an answerability warm-up after SFT (0: none): Fig. 10's "
                                         "prompt on each training clip, clean and corrupted, YES where SFT is right")
    answerability_lr: float = option(0.0, "peak lr of the answerability warm-up's restarted cosine (0: sft_lr)")
    assess: str = option("accuracy", "Eq. 3's rule (--mode rova): accuracy (Sec. 3.2: the G perturbed rollouts' "
                         "accuracy and their agreement with the clean ones, a_min / a_max, c > tau discards easy ones, "
                         "the answerability verdict a veto) or verdict (App. C.2: Fig. 10's verdict alone; NO -> "
                         "defer, YES with c > tau -> discard, else train)", choices=buffer.ASSESS_RULES)
    random_keep: float = option(0.87, "assess=random (Fig. 4c's control): the share trained, the rest discarded at "
                                "random (set it to a ROVA run's measured rho)")
    reassess: str = option("verdict", "Eq. 5's re-assessment of a buffered sample on its regenerated video: rule (by "
                           "`assess`) or verdict (one answerability forward per entry, App. G's cost, 1.5% of a step "
                           "in Table 14: YES with c' <= tau promotes, NO keeps, YES with c' > tau evicts)",
                      choices=("rule", "verdict"))
    assess_after_update: bool = option(False, "Alg. 2's literal order: every fresh sample gets its GRPO step (l.5) "
                                       "before the self-assessment (l.6), which then only fills the buffer; default "
                                       "App. G's order (assessed first, only the selected trained)")
    temporal_corruption: float = option(0.0, "share of the perturbed clips whose frames are also permuted before the "
                                        "masks (Eq. 2: V' = {f_pi(t) (.) P_t}; 1: Eq. 2 as written; 0: spatial only)")
    loss_norm: str = option("sequence", "Eq. 7's normalisation over a step's trained completions: sequence (each "
                            "completion's token mean, then the mean over the completions the curriculum kept: a "
                            "full-size update however few; DeepSeekMath, TRL loss_type='grpo'), fixed (the same sum "
                            "over batch_size x group_size per rank: the update shrinks with the completions kept; Dr. "
                            "GRPO's constant denominator) or token (every kept token's loss over their number, DAPO)",
                       choices=grpo.LOSS_NORMS)
    advantage: str = option("summed", "Eq. 8 on R_j, the components added first (summed: App. H.1's 'single combined "
                            "reward') or per_component (format, accuracy, alignment and any other term each normalised "
                            "in its group, then added with its weight: App. H.1's multi-component reading)",
                       choices=grpo.ADVANTAGES)
    fill_rounds: int = option(0, "--mode rova: more draws from the stream while a step's selection is short of "
                              "batch_size (this project's addition, not App. G's: each draw costs its rollouts and "
                              "self-assessment; 0, App. G's step: a step rolls out and assesses batch_size samples "
                              "and trains the ones it selects)")
    updates_per_generation: int = option(1, "mu: optimiser steps on each step's rollouts (TRL's num_iterations); at 1 "
                                         "the ratio of Eq. 7 is 1 and its clip never binds (as in Video-R1)")


DEMO = runs.DEMO   # the CPU demo's preset (no --model, no --data)


def parse_args(argv=None, settings=None, config=Config, groups=None, demo=None, check=None) -> Config:
    """The command line -> a `config` (Config, or an extension's subclass whose own flags are in `groups`, added
    to GROUPS); with neither --model nor --data the demo preset (DEMO, or `demo`) replaces the defaults.
    `settings`: values for fields without a flag; `check(ap, cfg)`: a subclass's own validation."""
    demo = DEMO if demo is None else demo
    ap = runs.config_parser(config, {**GROUPS, **(groups or {})}, description=__doc__.split("\n\n")[0],
                               usage="%(prog)s [--model M --data D.json --video-root DIR] [options]",
                               epilog=textwrap.fill("The demo (no --model, no --data) changes these defaults: "
                                                    + ", ".join(f"{k}={v}" for k, v in demo.items()) + ".", 100))
    cfg, _ = runs.parse_config(ap, config, argv, settings, demo)
    _check_config(ap, cfg)
    if check:
        check(ap, cfg)
    return cfg


def _check_config(ap, cfg):
    try:
        perturb.parse_eta(cfg.eta)
    except ValueError as e:
        ap.error(f"--{e}")   # (--eta '0,7': expected ...)
    unknown = {f for f in cfg.demo_families.split(",") if f} - set(synthetic.SYNTH_FAMILIES)
    if unknown:
        ap.error(f"demo_families: unknown {sorted(unknown)}; valid: {', '.join(synthetic.SYNTH_FAMILIES)}")
    if cfg.load_in_4bit and cfg.lora_r <= 0:
        ap.error("--load-in-4bit trains LoRA adapters: give --lora-r > 0")
    for name, lo, hi in (("temporal_grpo", 0, None), ("updates_per_generation", 1, None),
                         ("temporal_corruption", 0, 1)):
        if not lo <= getattr(cfg, name) <= (float("inf") if hi is None else hi):
            ap.error(f"{name} must be {f'>= {lo}' if hi is None else f'in [{lo}, {hi}]'}, got {getattr(cfg, name)}")
    if cfg.temporal_corruption and cfg.temporal_grpo:
        ap.error("temporal_corruption with --temporal-grpo: T-GRPO compares the ordered clip with a shuffled one, "
                 "and a temporally corrupted clip is already shuffled (the same permutation); use one of them")
    if bool(cfg.model) != bool(cfg.data):
        raise cli.UserError("give both --model and --data (or neither, for the demo)")


# ----------------------------------------------------------------------------- SFT (Sec. 5.1)

def sft_step(cfg, model, processor, batch, clips, observer, step=1):
    """Supervised warm-up on Video-R1's chain of thought: -log p(process + solution | prompt, video). `step`: the
    SFT step's number, the key of the draws made anew at each showing of a clip."""
    items = [(s, observer(s, sft_view(cfg, s, f, step))) for s in batch if (f := clips.get(s)) is not None]
    inputs = observer.inputs(processor, [data.build_messages(s) for s, _ in items], [f for _, f in items]) \
        if items else None
    return learner.sft_backward(cfg, model, processor, inputs, [data.sft_target(s) for s, _ in items],
                                (observer, batch[0]))


def sft_view(cfg, sample, frames, step):
    """What SFT shows of a clip: the clip, under sft_jitter (drawn once per clip, or at each showing:
    sft_jitter_fresh)."""
    if cfg.sft_jitter > 0:
        seed = seeds.Seeds(cfg.seed).sft_jitter(sample.id, step if cfg.sft_jitter_fresh else None)
        frames = jitter(frames, cfg.sft_jitter, seed)
    return frames


# ----------------------------------------------------------------------------- RL (Alg. 2)

@dataclass
class Item:
    """One video of an RL step, filled phase by phase (Alg. 2's per-sample state)."""
    sample: data.Sample
    spec: perturb.PerturbSpec        # V~: regenerates the corrupted video (Eq. 4)
    promoted: bool                   # from the buffer's promotion queue (Alg. 2 l.17): not re-assessed
    clean: Any                       # what the policy sees of the clean video
    pert: Any                        # ... of the trained branch's video (the clean one itself for --mode grpo)
    shuffled: Any = None             # ... of T-GRPO's shuffled video (Eq. 1)
    texts: list = field(default_factory=list)        # the trained branch's G rollouts
    acc: list = field(default_factory=list)          # their r^Acc (Eq. 10)
    rows: slice | None = None                        # their rows in the step's rollout
    clean_texts: list | None = None                  # the clean anchor's G rollouts (dual-branch modes)
    clean_acc: list | None = None
    shuffled_acc: list | None = None
    decision: str = "train"                          # Sec. 3.2: train | discard | defer
    rewards: list = field(default_factory=list)
    comp: dict = field(default_factory=dict)         # the reward's components (grpo.total_reward)


Draw = namedtuple("Draw", "items selected rollout")   # samples of a step assessed together, and their rollouts
Actor = namedtuple("Actor", "model processor observer device train_model")   # Alg. 2's F_theta (+ DDP's wrapper)
Stream = namedtuple("Stream", "rank shard by_id clips")   # Alg. 2's D on a rank: its samples, all by id, the clips


def completion_tokens(parts):
    """Each trained completion's token count over the step's parts [(rollout, rows, advantages)]; None: none."""
    tokens = [rollout.completion_mask[torch.as_tensor(rows)].sum(1) for rollout, rows, _ in parts if rows]
    return torch.cat(tokens) if tokens else None


def add_term(it, term):
    """A term beyond Alg. 1's added to each rollout's R_j, and listed in comp["extra"] (Eq. 8 per component, App. H.1,
    normalises their sum as one component)."""
    it.rewards = [r + t for r, t in zip(it.rewards, term)]
    it.comp["extra"].append(list(term))


class RL:
    """One rank's RL stage (Alg. 2): its cursor, buffer, promotion queue and the step's phases (an extension's own)."""

    def __init__(self, cfg, actor: Actor, ref_model, judge, optim, stream: Stream):
        """Alg. 2's inputs (ref_model: the KL's reference, None with LoRA, whose reference is an adapter of the policy
        itself, or with no KL; judge: None when not asked)."""
        self.cfg, self.judge, self.optim = cfg, judge, optim
        self.model, self.processor, self.observer, self.device, train_model = actor
        self.rank, self.shard, self.by_id, self.clips = stream
        self.learner = learner.Learner(self.model, self.processor, self.device, cfg.micro_batch_size, cfg.temperature,
                                       cfg.beta, train_model, ref_model,
                                       blank=(cfg, self.observer, self.shard[0] if self.shard else None))
        self.cursor = seeds.Cursor(len(self.shard), seeds.Seeds(cfg.seed, self.rank).rl_order)
        self.buffer = buffer.MemoryBuffer(cfg.buffer_capacity, cfg.n_max, cfg.reeval_period)
        self.queue: list = []  # (sample id, spec dict) promoted by the buffer, trained first (Alg. 2 l.17)
        self.dual, self.on_corrupted = cfg.mode in ("rova", "dual"), cfg.mode != "grpo"  # grpo: clean videos (Eq. 11)
        self.timer = steplog.Timer()

    @staticmethod
    def needs_judge(cfg):
        """The alignment reward's judge (App. C.1) is asked in the dual-branch modes."""
        return cfg.mode in ("rova", "dual")

    def step(self, step, spec_rng):
        """One RL step: Alg. 2 in App. G's order, in draws from the stream until batch_size samples are selected
        (next_samples; the extra assessments count in the step's cost)."""
        self.timer = steplog.Timer()
        literal = self.cfg.assess_after_update                           # Alg. 2's order: l.5 before l.6
        draws, todo = [], self.next_samples()
        with self.learner.generating():                                   # (FSDP2: the weights gathered once)
            while todo:
                with self.timer("perturbation"):
                    items = self.corrupt_videos(todo, spec_rng)           # Sec. 3.1, Eq. 1-2 (l.2)
                rollout = self.dual_rollouts(items)                       # l.3
                with self.timer("self_assessment"):
                    selected = items if literal else self.select(items, step)  # Eq. 3, l.6-10
                draws.append(Draw(items, selected, rollout))
                todo = self.next_samples(draws)
        items, selected = [it for d in draws for it in d.items], [it for d in draws for it in d.selected]
        with self.timer("alignment_reward"):
            missing = self.rewards(selected)                              # Alg. 1 (selected only: App. G)
        with self.timer("backward"):
            loss_stats, n_rows = self.update(draws)                       # Eq. 7-8
        if literal:
            with self.learner.generating(), self.timer("self_assessment"):
                self.select(items, step)                                  # l.6-10 by the updated policy
        with self.timer("memory_reevaluation"):
            promoted, evicted = self.reevaluate(step)                     # Eq. 5-6, l.12-21
        return self.record(items, selected, loss_stats, n_rows, missing=missing, promoted=promoted, evicted=evicted)

    def next_samples(self, draws=()):
        """The buffer's promoted samples first (with their stored spec), then the shard in order; after a draw, more
        while a ROVA step selected fewer than batch_size (fill_rounds draws at most; Alg. 2's literal order none)."""
        todo, short = [], self.cfg.batch_size - sum(len(d.selected) for d in draws)
        if draws and (self.cfg.mode != "rova" or self.cfg.assess_after_update or len(draws) > self.cfg.fill_rounds):
            return []
        while self.queue and not draws and len(todo) < self.cfg.batch_size:
            sid, spec = self.queue.pop(0)
            todo.append((self.by_id[sid], perturb.PerturbSpec.from_dict(spec), True))
        return todo + [(self.shard[i], None, False) for i in self.cursor.take(max(0, short - len(todo)))]

    def corrupt_videos(self, todo, spec_rng):
        """Sec. 3.1, Eq. 2: a spec per video (in every mode: one spec stream per seed), a share
        `temporal_corruption` of them with Eq. 1's permutation first (by the spec's own seed); Eq. 1 alone for
        T-GRPO's group."""
        items = []
        for s, spec, promoted in todo:
            frames = self.clips.get(s)
            if frames is None:
                continue
            spec = spec or self.fresh_spec(spec_rng)
            pert = perturbed(self.clips, s, frames, spec) if self.on_corrupted else frames
            it = Item(s, spec, promoted, clean=frames, pert=pert)
            if self.cfg.temporal_grpo:  # alone for --mode grpo
                shuffled = perturb.PerturbSpec(spec.subtype if self.on_corrupted else None, spec.eta, spec.seed, True,
                                               dict(spec.params) if self.on_corrupted else {})
                it.shuffled = perturbed(self.clips, s, frames, shuffled)
            items.append(it)
        return items

    def fresh_spec(self, spec_rng):
        spec = perturb.sample_spec(spec_rng, eta=self.cfg.eta)
        share = self.cfg.temporal_corruption
        if share and np.random.default_rng([spec.seed, 0xE2]).random() < share:   # Eq. 2: f_pi(t) (.) P_t
            spec = dataclasses.replace(spec, shuffle=True)
        return spec

    def _rollout(self, samples, views, n):
        messages = [data.build_messages(s) for s in samples]   # (the engine's prompts; inputs: the policy's)
        return self.learner.rollout(self.observer.inputs(self.processor, messages, views), n, self.cfg.max_new_tokens,
                                    self.cfg.top_p, messages, views)

    def dual_rollouts(self, items):
        """Alg. 2 l.3: G rollouts on the clean video (the anchor, no gradient; dual-branch modes) and G on the
        perturbed one (+ G~ on the shuffled one), with each one's accuracy (Eq. 10), in one generation call."""
        if not items:
            return None
        G, k = self.cfg.group_size, self.cfg.temporal_grpo
        branches = [("clean", G)] * self.dual + [("pert", G)] + [("shuffled", k)] * bool(k)   # (Item's view, rollouts)
        videos = [(it, name, n) for name, n in branches for it in items]   # branch by branch, as generated
        with self.timer("rollout"):
            out = self._rollout([it.sample for it, _, _ in videos], [getattr(it, name) for it, name, _ in videos],
                                [n for _, _, n in videos])
        for (it, name, n), end in zip(videos, np.cumsum([n for _, _, n in videos])):   # each video's rows, in order
            rows = slice(int(end) - n, int(end))
            acc = self.accuracy(out.texts[rows], it.sample)
            if name == "pert":
                it.rows, it.texts, it.acc = rows, out.texts[rows], acc
            elif name == "clean":
                it.clean_texts, it.clean_acc = out.texts[rows], acc
            else:
                it.shuffled_acc = acc
        return out

    @staticmethod
    def accuracy(texts, s):
        return [grpo.accuracy_reward(t, s.answer, s.problem_type, s.source) for t in texts]

    def confidences(self, views, samples):
        """c of Eq. 3 for each perturbed video: the policy's P(YES) on the answerability prompt."""
        return confidences(self.model, self.processor, self.observer, samples, views)

    def select(self, items, step):
        """Eq. 3, Alg. 2 l.6-10 (--mode rova): self-assess each new sample; a confident easy one is
        discarded, a difficult one deferred to the buffer with its spec (Eq. 4); returns the rest."""
        judged = [it for it in items if self.cfg.mode == "rova" and not it.promoted]
        if judged:
            conf = self.confidences([it.pert for it in judged], [it.sample for it in judged])
            for it, c in zip(judged, conf):
                a = self.assess(c, it.acc, answers.each(it.texts, it.sample), answers.each(it.clean_texts, it.sample),
                                key=it.spec.seed)
                it.decision = a.decision
                if a.decision == "defer":  # Alg. 2 l.7-8, Eq. 4
                    self.buffer.add(it.sample.id, it.spec.to_dict(), step)
        return [it for it in items if it.decision == "train"]

    def assess(self, c, acc=None, answers=None, clean_answers=None, key=0):
        """Eq. 3's verdict by the rule `assess`: accuracy (the rollouts' against the ground truth, the verdict a veto:
        buffer.self_assess), verdict (App. C.2's answerability verdict and c alone) or random."""
        if self.cfg.assess != "accuracy":   # random: Fig. 4c's control (key: the spec's seed)
            return buffer.self_assess_verdict(c, tau=self.cfg.tau) if self.cfg.assess == "verdict" else \
                buffer.self_assess_random(key, self.cfg.random_keep)
        return buffer.self_assess(acc, c, answers, clean_answers, tau=self.cfg.tau, a_min=self.cfg.a_min,
                                  a_max=self.cfg.a_max, unanswerable_below=self.cfg.unanswerable_below)

    def weights(self):
        """(w_format, w_acc, w_alignment) of Alg. 1 l.13 (App. D: 1, 1, 1); a subclass may stage them."""
        return self.cfg.w_format, self.cfg.w_acc, 1.0

    def rewards(self, selected):
        """Alg. 1 l.13 for each selected sample's rollouts: R_j = w_F r^F + w_Acc r^Acc + r^A (its components in
        `comp`), then R_j's terms beyond Alg. 1's (T-GRPO's bonus; an extension's own), each added by add_term.
        Returns the judge's missing verdicts."""
        w_f, w_a, w_al = self.weights()
        missing = 0
        for it in selected:
            s = it.sample
            it.rewards, it.comp = grpo.total_reward(  # w_al r^A = (w_al alpha_r) Sim^r + (w_al alpha_a) Sim^a
                it.texts, s.answer, s.problem_type, reference_texts=it.clean_texts if self.dual else None,
                judge=self.judge if self.dual else None, w_format=w_f, w_acc=w_a, alpha_r=w_al * self.cfg.alpha_r,
                alpha_a=w_al * self.cfg.alpha_a, source=s.source)
            it.comp["extra"] = []
            if self.cfg.temporal_grpo:
                it.comp["temporal"] = grpo.temporal_reward(it.acc, it.shuffled_acc)
                add_term(it, it.comp["temporal"])
            missing += it.comp["judge_missing"]
        return missing

    def advantages(self, selected):
        """Eq. 8 for the selected samples' groups, per completion: of R_j (summed), or of each component, weighted
        and added (per_component, App. H.1; "other": the sum of R_j's terms beyond Alg. 1's, comp["extra"])."""
        if not selected:
            return torch.zeros(0)
        if self.cfg.advantage == "summed":
            return grpo.group_advantages([it.rewards for it in selected]).view(-1)
        w_f, w_a, _ = self.weights()   # (alignment's weight is already in its alphas)
        comps = {k: [it.comp[k] for it in selected] for k in ("format", "accuracy", "alignment")}
        comps["other"] = [[sum(t) for t in zip(*it.comp["extra"], [0.0] * len(it.rewards))] for it in selected]
        weights = {"format": w_f, "accuracy": w_a, "alignment": 1.0, "other": 1.0}
        return grpo.component_advantages(comps, weights).view(-1)

    def update(self, draws):
        """Eq. 7-8 on the perturbed branch of each draw's selected samples (group advantages of their rewards), one sum
        over every draw divided once by the step's denominator (grpo.count, summed over the processes); mu =
        updates_per_generation optimiser steps on these rollouts (TRL's num_iterations: F_theta_old of Eq. 7
        generated them, so the clip binds from the second). Returns (the loss stats' means over the trained
        completions and the mu steps, this process's trained completions)."""
        cfg, mu = self.cfg, self.cfg.updates_per_generation
        parts = self.learner.pad([self.trained_part(d) for d in draws], draws=1 + cfg.fill_rounds)   # as many on all
        n_rows = sum(len(rows) for _, rows, _ in parts)
        trained, denominator = self.learner.totals(n_rows, grpo.count(cfg.loss_norm, completion_tokens(parts),
                                                                      cfg.batch_size * cfg.group_size))
        go = trained > 0 and denominator > 0   # (no process trains anything: no backward, no optimiser step)
        kept, sums = [({} if mu > 1 else None) for _ in parts], defaultdict(float)
        self.learner.engine_sleep()
        for _ in range(mu):
            for (rollout, rows, adv), keep in zip(parts if go else [], kept):
                for key, v in self.backward(rollout, rows, adv, denominator, keep).items():
                    sums[key] += v / (n_rows * mu)
            self.optim.step(go)
        return {**sums, "engine_logprob_gap": self.learner.engine_sync()}, n_rows

    def trained_part(self, draw):
        """A draw's part of the update: (its rollout, the selected samples' rows in it, their advantages, Eq. 8)."""
        return draw.rollout, [r for it in draw.selected for r in range(it.rows.start, it.rows.stop)], \
            self.advantages(draw.selected)

    def backward(self, rollout, rows, adv, denominator, kept=None, weight=1.0):
        """Eq. 7's gradient on the completions `rows` of `rollout` (advantages `adv`), times `weight`, micro-batch by
        micro-batch: the log-probs, Eq. 7's summand per token, its normalisation into the micro-batch's term of the
        step's loss (`denominator`: the step's, see grpo.count), backward. `kept`: the old and reference log-probs
        of several updates per generation. Returns the stats' sums over the trained completions."""
        cfg, sums = self.cfg, defaultdict(float)
        for mb in self.learner.micro_batches(rollout, rows, adv, kept):
            logp, old, ref = self.learner.logprobs(mb, kept)                        # log F_theta, F_theta_old, F_ref
            per_token, stats = grpo.token_losses(logp, old, ref, mb.adv, mb.mask, cfg.clip_eps, cfg.beta)   # Eq. 7
            loss = grpo.agg_loss(per_token, mb.mask, cfg.loss_norm, denominator)    # its term of the step's loss
            self.learner.backward(weight * loss, mb, logp)
            stats["loss"] = grpo.agg_loss(per_token.detach(), mb.mask, "sequence").item()   # (the log's)
            for key, v in stats.items():
                sums[key] += v * mb.n
        return sums

    def reevaluate(self, step):
        """Eq. 5-6, Alg. 2 l.12-21 (--mode rova, when due): re-assess the buffer, queue what it promotes.
        Batched as a step's rollouts: batch_size x group_size sequences per generate call."""
        if self.cfg.mode != "rova" or step + 1 >= self.cfg.rl_steps:  # the last step's promotions: never trained
            return 0, 0
        due = self.buffer.due(step + 1)  # per rank: its buffer may be full, or empty
        if not self.learner.anywhere(due):
            return 0, 0
        with self.learner.generating():  # every rank enters, each re-evaluates its own buffer
            if not due:
                return 0, 0
            per_entry = self.reeval_rollouts() or 1   # sequences per entry
            up, out = self.buffer.reevaluate(self.assess_entries,
                                             max(1, self.cfg.batch_size * self.cfg.group_size // per_entry))
        self.queue.extend((e.sample_id, e.spec) for e in up)
        return len(up), len(out)

    def assess_entries(self, entries):
        """Eq. 5 / Alg. 2 l.15: d' of buffered samples on their regenerated videos, from one answerability forward
        (+ reeval_rollouts rollouts each for the rule); an unreadable video: an exception (the buffer evicts it)."""
        out, todo = [], []
        for entry in entries:
            s = self.by_id[entry.sample_id]
            frames = self.clips.get(s)
            out.append(None if frames is not None else FileNotFoundError(f"video of {s.id} is unreadable"))
            if frames is not None:
                view = self.observer(s, perturbed(self.clips, s, frames, perturb.PerturbSpec.from_dict(entry.spec)))
                todo.append((len(out) - 1, s, view))
        if todo:
            conf = self.confidences([v for _, _, v in todo], [s for _, s, _ in todo])
            for (i, _, _), d in zip(todo, self.reassessed(todo, conf)):
                out[i] = d
        return out

    def reassessed(self, todo, conf):
        """d' of each (index, sample, view) of `todo` from its c' and, unless the verdict alone decides, from
        reeval_rollouts rollouts on its view."""
        k = self.reeval_rollouts()
        if not k:
            return [buffer.self_assess_verdict(c, tau=self.cfg.tau).difficulty for c in conf]
        texts = self._rollout([s for _, s, _ in todo], [v for _, _, v in todo], k).texts
        return [self.assess(c, self.accuracy(texts[n * k:(n + 1) * k], s)).difficulty
                for n, ((_, s, _), c) in enumerate(zip(todo, conf))]

    def reeval_rollouts(self):
        """Rollouts per buffered sample at re-assessment: 0 when the verdict alone decides (one forward per entry,
        App. G), else reeval_rollouts (0: G, as at its first assessment)."""
        if self.cfg.assess != "accuracy" or self.cfg.reassess == "verdict":
            return 0
        return self.cfg.reeval_rollouts or self.cfg.group_size

    def record(self, items, selected, loss_stats, n_rows, *, missing=0, promoted=0, evicted=0, extra=None):
        """The step's log record (records.step_record; `extra`: more per-rollout values)."""
        w_f, w_a, w_al = self.weights()
        per_rollout = {**records.values(items, selected, self.on_corrupted), **(extra or {})}
        return records.step_record(items, selected, loss_stats, n_rows, per_rollout, buffer_size=len(self.buffer),
                                   seconds=self.timer.seconds, weights=(w_f, w_a, w_al if self.dual else 0.0),
                                   categories=perturb.CATEGORIES, category_of=perturb.CATEGORY_OF, missing=missing,
                                   promoted=promoted, evicted=evicted)

    def state(self):
        """This rank's RL state for a checkpoint (JSON): the data cursor, the buffer, the promotion queue."""
        return {"cursor": self.cursor.state(), "buffer": self.buffer.state_dict(), "queue": self.queue}

    def load(self, st):
        self.cursor.load(st["cursor"])
        self.buffer.load_state_dict(st["buffer"])
        self.queue = [tuple(q) for q in st["queue"]]


# ----------------------------------------------------------------------------- the before/after check

def accuracy_check(run, name=None, batch_size=16):
    """The demo's before/after check on the first eval_limit held-out questions under Sec. 4's static protocol, one
    corruption per (video, subtype): eval_assign cycle gives the k-th question the k-th of the 12 subtypes, all gives
    every question every subtype. Greedy accuracy clean and corrupted (runs.greedy_scores), and how much the
    self-assessment knows there: the AUROC of c (Eq. 3, the policy's P(YES) on each corrupted clip) for the greedy
    answer on it being right. Run by rank 0 (under FSDP2 the others wait with the weights gathered); written to
    OUT/`name` if given."""
    with parallel.gathered(run.model):
        if not run.eval_samples or run.rank != 0:
            return None
        clean, corrupted = [], []
        for k, s in enumerate(run.eval_samples[:run.cfg.eval_limit]):
            if (frames := run.clips.checked(s)) is not None:
                clean.append((s, frames))
                subtypes = perturb.SUBTYPES if run.cfg.eval_assign == "all" else \
                    [perturb.SUBTYPES[k % len(perturb.SUBTYPES)]]
                corrupted += [(s, perturbed(run.clips, s, frames, perturb.static_spec(
                    data.video_identity(s), subtype, eta=run.cfg.eta))) for subtype in subtypes]
        right = runs.greedy_scores(run, corrupted, batch_size)
        c = [x for k in range(0, len(corrupted), batch_size) for x in confidences(
            run.model, run.processor, run.observer, [s for s, _ in corrupted[k:k + batch_size]],
            [run.observer(s, v) for s, v in corrupted[k:k + batch_size]])]
        result = {"clean": mean(runs.greedy_scores(run, clean, batch_size)), "perturbed": mean(right),
                  "n": len(clean), "n_perturbed": len(corrupted), "c_auroc": runs.auroc(c, right), "c_mean": mean(c)}
    if name:
        (run.out / name).write_text(json.dumps(result))
    return result


def mean(values):
    return float(np.mean(values)) if len(values) else None


def confidences(model, processor, observer, samples, views):
    """c of Eq. 3 for each sample's corrupted clip, as the policy is shown it (`views`): the policy's P(YES) on Fig.
    10's answerability prompt about the sample's question, from one forward pass."""
    messages = buffer.answerability_messages([data.question_text(s) for s in samples])
    return buffer.answerability(model, observer.inputs(processor, messages, views), policy.tokenizer_of(processor))


def perturbed(clips, sample, frames, spec):
    """V~ (Eq. 4): a clip under `spec`, with its depth (Sec. 3.1's depth-conditioned perturbations)."""
    return perturb.apply(frames, spec, clips.depth_map(sample, frames))


# ----------------------------------------------------------------------------- main

def run_sft(run, state, ckpt, per_rank, sft_step=sft_step):
    """Stage 1: the SFT warm-up on the chain-of-thought data (App. D: 1 epoch), then, with
    answerability_epochs, the answerability warm-up on its labels (one optimiser; the cosine schedule restarts
    for the answerability part, which at the tail of SFT's would train at almost no learning rate).
    `sft_step(cfg, model, processor, batch, clips, observer, step) -> (NLL, tokens)`: one SFT step. Returns False if
    killed."""
    cfg = run.cfg
    per_rank_n = len(run.samples) // run.world
    task, half = int(math.ceil(cfg.sft_epochs * per_rank_n / cfg.sft_batch_size)), max(1, cfg.sft_batch_size // 2)
    total = task + int(math.ceil(cfg.answerability_epochs * 2 * per_rank_n / half))
    optim = learner.Optim.make(cfg, run.model, cfg.sft_lr, total, run.device, restart=task if total > task else 0,
                               restart_lr=cfg.answerability_lr)
    cursor = seeds.Cursor(len(run.shard), seeds.Seeds(cfg.seed, run.rank).sft_order)
    warm_up = warmup.AnswerabilityWarmUp(run, per_rank[0] if ckpt else {})
    if ckpt:
        run.resume(per_rank, optim, ckpt)
        cursor.load(per_rank[0]["cursor"])
    run.log.open_bar(total, state["step"], "SFT")
    while state["step"] < total:
        t0 = time.perf_counter()
        if state["step"] < task:
            batch = [run.shard[i] for i in cursor.take(cfg.sft_batch_size)]
            nll, n = sft_step(cfg, run.train_model, run.processor, batch, run.clips, run.observer, state["step"] + 1)
        else:   # half answerability, half the task (replayed: alone, the model forgets it)
            task_batch = [run.shard[i] for i in cursor.take(cfg.sft_batch_size - half)]
            nll, n = warm_up.step(answerability_shown(run, warm_up, half), task_batch)
        nll = distributed.mean_over_ranks(nll, n, run.device)  # None: no rank had a readable video
        optim.step(nll is not None)
        state["step"] += 1
        run.log({"stage": "sft", "step": state["step"], "lr": optim.sched.get_last_lr()[0], "nll": nll,
                 "bad_videos": len(run.clips.bad), "sec_step": time.perf_counter() - t0})
        if state["step"] % cfg.save_every == 0 or state["step"] == total:
            run.checkpoint(state, optim, {"cursor": cursor.state(), **warm_up.state()})
        if run.killed():
            return False
    run.log.close_bar()
    del optim  # no optimiser state is kept past its stage (AdamW's is twice the trained weights)
    gc.collect()
    if total > 0:
        accuracy_check(run, "eval_after_sft.json")
    return True


def answerability_shown(run, warm_up, n):
    """The answerability warm-up's next n examples (machinery/training/warmup.py), each clip as shown: clean, or under
    this run's spec of it (one per clip, seeded by (seed, rank, index): the same on a rerun), with Fig. 10's prompt.
    Labelled once, after the task SFT, from every readable clip of the shard, clean and corrupted."""
    def shown(s, spec, frames):   # (spec: a dict; None: the clean clip)
        return frames if spec is None else perturbed(run.clips, s, frames, perturb.PerturbSpec.from_dict(spec))
    if warm_up.labels is None:
        streams, examples = seeds.Seeds(run.cfg.seed, run.rank), []
        for i, s in enumerate(run.shard):
            if (frames := run.clips.get(s)) is not None:
                spec = perturb.sample_spec(np.random.default_rng(streams.answerability_spec(i)), eta=run.cfg.eta)
                examples += [(s, None, frames), (s, spec.to_dict(), shown(s, spec.to_dict(), frames))]
        warm_up.label(examples)
    return [(s, x, shown(s, x["spec"], f), buffer.answerability_messages([data.question_text(s)])[0])
            for s, x in warm_up.batch(n) if (f := run.clips.get(s)) is not None]


def build_rl(cfg, rank, world, device, samples, clips, model, processor, ref_model, rl=RL, observer=None,
             train_model=None):
    """This rank's RL stage (`rl`: RL or a subclass): its shard, the alignment judge (App. C.1; verdicts cached
    on disk, so a resumed run asks nothing twice), AdamW with the cosine schedule over rl_steps."""
    judge = judges.make_judge(cfg.judge, cache=cfg.judge_cache or str(Path(cfg.out) / "judge_cache.sqlite")) \
        if rl.needs_judge(cfg) else None
    optim = learner.Optim.make(cfg, model, cfg.lr, cfg.rl_steps * cfg.updates_per_generation, device)
    return rl(cfg, Actor(model, processor, observer or Observer(cfg), device, train_model), ref_model, judge, optim,
              Stream(rank, samples[rank::world], {s.id: s for s in samples}, clips))


def run_rl(run, state, ckpt, per_rank, rl=RL):
    """Stage 2: RL (Alg. 2). Returns the RL object, or None if killed."""
    cfg = run.cfg
    rl = build_rl(cfg, run.rank, run.world, run.device, run.samples, run.clips, run.model, run.processor,
                  runs.reference_model(run), rl, run.observer, run.train_model)
    if ckpt and per_rank:
        run.resume(per_rank, rl.optim, ckpt)
        rl.load(per_rank[0]["rl"])
    rl.learner.engine = engine.make(cfg, run.model, run.processor, run.device, run.rank)   # the (resumed) weights
    run.log.open_bar(cfg.rl_steps, state["step"], f"RL ({cfg.mode})")
    while state["step"] < cfg.rl_steps:
        t0 = time.perf_counter()
        s = rl.step(state["step"], run.spec_rng)
        state["step"] += 1
        run.log({"stage": "rl", "step": state["step"], "lr": rl.optim.sched.get_last_lr()[0],
                 "updates": rl.optim.updates}
                | distributed.reduce_record(s, run.device, run.world)
                | {"bad_videos": len(run.clips.bad), "sec_step": time.perf_counter() - t0})
        if state["step"] % cfg.save_every == 0 or state["step"] == cfg.rl_steps:
            run.checkpoint(state, rl.optim, {"rl": rl.state()})
        if cfg.snapshot_every and state["step"] % cfg.snapshot_every == 0 and state["step"] < cfg.rl_steps:
            run.save_model(run.out / "snapshots" / f"step_{state['step']}")
        if run.killed() and state["step"] < cfg.rl_steps:
            return None
    run.log.close_bar()
    return rl


def train(run, ckpt, rl=RL, sft_step=sft_step):
    """Both stages in `run` (runs.setup), from its checkpoint `ckpt` if any: the before check, SFT, RL (`rl`: RL
    or a subclass), the final weights and the after check."""
    state = json.loads((ckpt / "state.json").read_text())["state"] if ckpt else {"stage": "sft", "step": 0}
    per_rank = checkpoints.load_rank_state(ckpt, run.rank)
    n_params = sum(p.numel() for p in run.model.parameters())
    if rl.needs_judge(run.cfg) and (note := judges.stand_in_note(run.cfg.judge, n_params)):
        cli.log(note)   # (the default offline judge on a real model)
    if run.cfg.eval_before and not (run.out / "eval_before.json").is_file():
        accuracy_check(run, "eval_before.json")
    if state["stage"] == "sft":
        if not run_sft(run, state, ckpt, per_rank, sft_step):
            return
        state, ckpt, per_rank = {"stage": "rl", "step": 0}, None, None
    rl = run_rl(run, state, ckpt, per_rank, rl)
    if rl is not None:
        runs.finish(run, rl.buffer.stats(), len(rl.queue), accuracy_check(run))   # (queued: never trained)


RESUME = "rerun the same command to continue from the last checkpoint"   # Ctrl-C's line (before OUT is known)


def main(argv=None, **settings):
    """Train (Alg. 2). `settings`: values for Config fields without a flag."""
    cfg = parse_args(argv, settings)
    with cli.interrupt_hint(runs.resume_hint(cfg, RESUME)):
        run, ckpt = runs.setup(cfg, observer=Observer(cfg))
        train(run, ckpt)


if __name__ == "__main__":
    cli.run(main, interrupted=RESUME)
