"""A training run's plumbing (train.py's stages run inside it): its config's plumbing fields (`RunConfig`) and a
config dataclass as the command line (nanoGPT/CleanRL style), the demo's model and data, the training data and
its clip reader, the process (torchrun's rank and device), the run folder (claimed: continued, refused or
started), the policy loaded as it is trained (FSDP2-sharded, DDP-replicated, LoRA, 4-bit; the memory plan
checked first), the frozen reference, and the `Run` both stages share: checkpoints (torch.distributed.checkpoint,
every rank's RNGs and data cursor), the final weights, the step log; the demo's before/after check and the
run's end (summary.json).
"""
from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from machinery import cli, distributed, hub, seeds, steplog
from machinery.corruption import depth as depths
from machinery.datasets import answers, data, synthetic
from machinery.model import memory, parallel, policy
from machinery.model import tiny as tiny_model
from machinery.training import checkpoints, report
from machinery.training.clips import Clips


def arg(default, help_, group=None, choices=None):
    """A config field: a command-line flag in `group`, or (group None) a setting that only code changes
    (the demo preset, an extension, a test) or --set NAME=VALUE; `choices`: its only values (parse_config)."""
    return field(default=default, metadata={"help": help_, "group": group, "choices": choices})


@dataclass
class RunConfig:
    """A training run's plumbing, beneath train.Config (whose fields are the paper's): the run folder, the
    process layout, the demo and its before/after check, caches. Each field with a group is a command-line flag."""
    # output
    out: str = arg("runs/rova", "output folder: log.jsonl, checkpoints/, final/. A finished run in it is never "
                                "replaced without --overwrite; an unfinished one with the same config is "
                                "continued", "output")
    resume: str = arg("", "auto: continue from the last complete checkpoint in OUT even if the config differs; or "
                          "a checkpoint folder", "output")
    overwrite: bool = arg(False, "replace whatever run OUT holds, finished or not (the demo's model and benchmark "
                                 "are kept)", "output")
    save_every: int = arg(50, "checkpoint every this many steps (SFT and RL)", "output")
    # distributed
    sharding: str = arg("auto", "auto | fsdp | ddp | none: auto is FSDP2 for full fine-tuning on GPUs or on more "
                                "than one process, DDP for LoRA / 4-bit on more than one, none for one CPU process",
                        "distributed")
    # settings without a flag of their own: --set NAME=VALUE
    max_bad_fraction: float = arg(0.1, "stop when more than this share of videos is missing or unreadable")
    snapshot_every: int = arg(0, "also save the full weights to OUT/snapshots/step_N every this many RL steps "
                              "(0: never), to evaluate a run part-way")
    gradient_checkpointing: bool = arg(True, "activation checkpointing (on GPUs only)")
    freeze_vision: bool = arg(False, "the vision encoder's blocks stay as loaded, its merger and the language model "
                              "train (Qwen2.5-VL's fine-tuning scripts' tune_mm_vision=False)")
    eval_data: str = arg("", "VSI-Bench-format file of the before/after check: clean and perturbed accuracy before "
                         "and after training (the demo's: its held-out questions; PVRBench itself: eval_pvrbench.py)")
    eval_video_root: str = arg("", "video root of --eval-data (default: its folder)")
    eval_limit: int = arg(96, "questions of --eval-data in the before/after report")
    eval_before: bool = arg(True, "the report's first column: the model as loaded, before SFT (the demo's tiny model "
                            "as built has random weights: it has none)")
    eval_assign: str = arg("cycle", "the before/after report's corrupted clips (eval_pvrbench.py's --assign): cycle "
                           "(the k-th question under the k-th of the 12 subtypes) or all (every question under every "
                           "subtype: Table 2's Avg., 12 times the answers)", choices=("cycle", "all"))
    demo_clips: int = arg(480, "clips of the demo's synthetic benchmark")
    demo_families: str = arg("", "the demo benchmark's question families, a comma list of synthetic.SYNTH_FAMILIES "
                             "(default all)")
    demo_turn: str = arg("0.035,0.05", "the demo benchmark's yaw rate of a turning clip, LOW,HIGH in rad/frame")
    video_cache: int = arg(64, "decoded clips kept in memory per process")
    lora_dropout: float = arg(0.05, "--lora-r: dropout on the adapters' input (peft's lora_dropout)")
    vllm_gpu_memory_utilization: float = arg(0.3, "--rollout-engine vllm: the GPU's share the engine takes while "
                                             "generating (weights + KV cache; asleep during the update)")
    vllm_max_model_len: int = arg(0, "--rollout-engine vllm: the engine's context length (0: the model's)")
    depth_cache: str = arg("", "folder of --depth-model's cached maps (default: depth.default_cache(), "
                               "~/.cache/rova/depth)")
    judge_cache: str = arg("", "SQLite verdict cache (default: OUT/judge_cache.sqlite)")
    keep_checkpoints: int = arg(2, "complete checkpoints kept (older ones are deleted)")
    stop_after: int = arg(0, "testing: exit (as if killed) after this many steps of this run, no final save")


# ----------------------------------------------------------------------------- a dataclass as the command line

def config_parser(config, groups, *, plumbing="output", **kwargs):
    """An argparse parser for the dataclass `config` (nanoGPT/CleanRL style: the dataclass holds the
    defaults and the help): a field whose metadata names one of `groups` is the flag --field-name (typed,
    booleans as --x/--no-x), in that group; every other field is a setting for --set NAME=VALUE. --debug
    and --set go into the group `plumbing`."""
    from dataclasses import fields

    ap = cli.ArgumentParser(formatter_class=cli.HelpFormatter, **kwargs)
    parts = {name: ap.add_argument_group(name, text) for name, text in groups.items()}
    for f in fields(config):
        if f.metadata.get("group") is None:
            continue
        flag, group, help_ = "--" + f.name.replace("_", "-"), parts[f.metadata["group"]], f.metadata["help"]
        if str(f.type) == "bool":
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_)
        else:
            group.add_argument(flag, type=_KINDS.get(str(f.type), str), default=f.default, help=help_)
    cli.add_debug_flag(parts[plumbing])
    names = [f.name for f in fields(config) if f.metadata.get("group") is None]
    parts[plumbing].add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                                 help=f"a setting without a flag of its own ({', '.join(names[:4])}, ...; "
                                      "docs/DESIGN.md); repeatable")
    return ap


_KINDS = {"int": int, "float": float, "bool": cli.strict_bool}
_KIND_NAMES = {"int": "an integer", "float": "a number", "bool": "a boolean (true/false, 1/0)"}


def parse_config(ap, config, argv=None, settings=None, demo=None):
    """(config, whether it is the demo's): `ap` (config_parser) applied to `argv`. `demo`: defaults that replace
    the dataclass's when neither --model nor --data is given (flags given explicitly still win; fields without a
    flag are set unless --set or `settings` names them). `settings`: values for fields without a flag. A field
    with `choices` (arg) holding another value is one line's error."""
    from dataclasses import fields

    args = vars(ap.parse_args(argv))
    chosen = _demo_defaults(args, demo)
    if chosen:
        ap.set_defaults(**{k: v for k, v in chosen.items() if k in args})
        args = vars(ap.parse_args(argv))
    args.pop("debug")  # read by cli.run
    kinds = {f.name: str(f.type) for f in fields(config) if f.metadata.get("group") is None}
    given = {**_settings(ap, kinds, args.pop("set")), **(settings or {})}
    unset = {k: v for k, v in chosen.items() if k in kinds and k not in given}
    cfg = config(**{**args, **unset, **given})
    for f in fields(config):
        if f.metadata.get("choices") and getattr(cfg, f.name) not in f.metadata["choices"]:
            ap.error(f"{f.name} must be one of {', '.join(f.metadata['choices'])}, got {getattr(cfg, f.name)!r}")
    return cfg, bool(chosen)


def _demo_defaults(args, demo):
    """The demo's defaults when neither --model nor --data is given, else none."""
    if not demo:
        return {}
    return {} if args["model"] or args["data"] else dict(demo)


def _settings(ap, kinds, items):
    """--set NAME=VALUE pairs -> {name: typed value}."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or name not in kinds:
            ap.error(f"--set {item!r}: expected NAME=VALUE with NAME one of {', '.join(kinds)}")
        try:
            out[name] = _KINDS.get(kinds[name], str)(value)
        except ValueError:
            ap.error(f"--set {item!r}: {value!r} is not {_KIND_NAMES[kinds[name]]}")
    return out


# Config fields that change nothing a run computes: an unfinished run continues across a change of these (and of a
# Config subclass's `not_results`, a ClassVar).
NOT_RESULT_KEYS = ("out", "resume", "overwrite", "stop_after", "save_every", "snapshot_every", "keep_checkpoints",
                   "video_cache", "max_bad_fraction", "judge_cache", "depth_cache")
RUN_FILES = ("log.jsonl", "eval_before.json", "eval_after_sft.json", "summary.json")
RUN_FOLDERS = ("checkpoints", "reference", "final", "snapshots", "tensorboard")  # (the demo's tiny/, synthetic/ kept)


# The CPU demo's preset (train.DEMO; no --model, no --data): what a 2-core laptop trains in about ten minutes to
# show ROVA's effect; flags given still win. Its benchmark is synthetic.DEMO_BENCHMARK (the next action, turns down
# to slight ones) at its per-subtype intensities (synthetic.DEMO_ETA). SFT: 20 epochs at lr 1e-3, each clip's
# contrast and brightness scaled by U(0.85, 1.15) drawn anew at each showing (none of the benchmark's corruptions
# is seen in SFT), the vision encoder kept as built (the merger and the language model learn). Then one epoch of
# the answerability warm-up (Fig. 10's question; machinery/training/warmup.py) at a tenth of SFT's peak lr, so that
# the confidence c of Eq. 3 means something; its verdict does not also veto (unanswerable_below 0). Then App. D's
# 300 ROVA steps in App. G's order (each step assesses the batch_size samples it draws and trains those selected)
# at lr 1e-4, re-evaluating the buffer every 10 steps, and the before/after check of every held-out question under
# every subtype (eval_assign all). docs/RESULTS.md ("The demo") and experiments/demo_spread.py: its figures over
# seeds, beside standard GRPO's.
_BENCH = synthetic.DEMO_BENCHMARK
DEMO = dict(frames=_BENCH["num_frames"], max_pixels=_BENCH["size"] ** 2, sft_epochs=20.0, sft_batch_size=16,
            sft_lr=1e-3, sft_jitter=0.15, sft_jitter_fresh=True, freeze_vision=True, lr=1e-4, rl_steps=300,
            batch_size=4, group_size=8, max_new_tokens=64, save_every=50, reeval_period=10, unanswerable_below=0.0,
            answerability_epochs=1.0, answerability_lr=1e-4, video_cache=4096, eval_limit=240, eval_assign="all",
            eval_before=False, eta=synthetic.DEMO_ETA, micro_batch_size=0, demo_clips=_BENCH["n"],
            demo_families=",".join(_BENCH["families"]), demo_turn=",".join(map(str, _BENCH["turn"])))


@dataclass(frozen=True)
class Demo:
    """What a script's demo (no --model, no --data) builds under OUT: its tiny model (tiny.build_tiny's `arch`
    and `extra_texts`, in OUT/`folder`) and the synthetic benchmark (in `synthetic`; default OUT/synthetic)."""
    folder: str = "tiny"
    arch: str = "qwen2_5_vl"
    extra_texts: tuple = ()
    synthetic: str = ""


def prepare_demo(cfg, rank, demo=Demo()):
    """No --model and no --data: the tiny model and the synthetic benchmark under OUT (built once)."""
    out = Path(cfg.out)
    tiny, synth = out / demo.folder, Path(demo.synthetic) if demo.synthetic else out / "synthetic"
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        if not (tiny / "config.json").is_file():
            cli.log(f"demo: building the tiny model in {tiny}")
            with hub.no_hf_progress_bars():
                tiny_model.build_tiny(tiny, arch=demo.arch, extra_texts=demo.extra_texts)
        make_demo_benchmark(cfg, synth)
    distributed.barrier()
    cfg.model = str(tiny)
    use_demo_benchmark(cfg, synth)


def demo_benchmark(cfg):
    """The demo's synthetic.make_synthetic arguments: its settings' (train.DEMO's: synthetic.DEMO_BENCHMARK), the
    seed and frame size DEMO_BENCHMARK's."""
    return dict(n=cfg.demo_clips, seed=synthetic.DEMO_BENCHMARK["seed"], num_frames=cfg.frames,
                size=synthetic.DEMO_BENCHMARK["size"], turn=synthetic.parse_turn(cfg.demo_turn),
                families=[f for f in cfg.demo_families.split(",") if f] or None)


def make_demo_benchmark(cfg, synth):
    """OUT/synthetic rendered once; one rendered with other settings (an older demo's) is refused, not reused."""
    wanted = demo_benchmark(cfg)
    if not (synth / "summary.json").is_file():
        cli.log(f"demo: rendering the synthetic benchmark ({cfg.demo_clips} clips) in {synth}")
        synthetic.make_synthetic(synth, **wanted)
        return
    built, wanted = synthetic_settings(json.loads((synth / "summary.json").read_text())), synthetic_settings(wanted)
    if built != wanted:
        raise cli.UserError(f"{synth} was rendered with other settings ({built}) than this demo's ({wanted}): "
                            f"remove it, or give another --out")


def synthetic_settings(kw):
    """synthetic.make_synthetic's arguments, defaults filled in, from themselves or from the summary.json they
    wrote: two benchmarks with equal ones hold the same bytes."""
    if "n_clips" in kw:   # a summary
        kw = dict(n=kw["n_clips"], seed=kw["seed"], num_frames=kw["frames"], size=kw["size"], families=kw["families"],
                  turn=kw.get("turn", synthetic.TURN))
    return dict(n=kw["n"], seed=kw["seed"], num_frames=kw["num_frames"], size=kw["size"],
                families=tuple(kw.get("families") or synthetic.SYNTH_FAMILIES),
                turn=tuple(kw.get("turn", synthetic.TURN)))


def use_demo_benchmark(cfg, synth):
    cfg.data = str(synth / "train.json")
    if not cfg.eval_data:   # (--set eval_data=FILE: the check on other questions, e.g. a validation split)
        cfg.eval_data, cfg.eval_video_root = str(synth / "eval.jsonl"), str(synth / "videos")


def check_sources(cfg):
    """Every model the run will load exists (locally, in the cache or on a reachable hub): one line before
    anything is loaded (after the data's own checks, so that a data mistake is the one reported; --depth-model's
    check follows in setup, once the data says whether `auto` needs the model)."""
    hub.model_source(cfg.model)
    hub.check_hf_flags({"--judge": cfg.judge})


def load_data(cfg, rank, world, read_kwargs=None):
    """The training samples (all, and this rank's shard) and the clip reader (`read_kwargs`: video.read_frames
    arguments, a frame sampler); too many missing videos stop."""
    samples, missing = data.load_video_r1(cfg.data, cfg.video_root or None)
    n_videos = len({s.video for s in samples} | {p for _, p in missing})
    n_missing = len({p for _, p in missing})
    if n_missing > cfg.max_bad_fraction * max(n_videos, 1):
        raise cli.UserError(f"stopping: {n_missing} of {n_videos} videos of {cfg.data} are missing (more than "
                            f"max_bad_fraction {cfg.max_bad_fraction}: --set max_bad_fraction=X); e.g. "
                            f"{missing[0][1]}")
    if not samples:
        raise cli.UserError(f"no usable training samples in {cfg.data}")
    return samples, samples[rank::world], Clips(cfg, missing, n_videos, read_kwargs)


@dataclass
class Run:
    """What both stages share: the config, this process, the model, the data, the log."""
    cfg: Any                         # train.Config (or an extension's subclass)
    rank: int
    world: int
    device: Any
    out: Path
    model: Any
    processor: Any
    observer: Any
    samples: list
    shard: list
    clips: Clips
    spec_rng: Any
    log: steplog.StepLog
    eval_samples: list
    sharding: str = "none"           # parallel.choose: fsdp | ddp | none
    train_model: Any = None          # what forward/backward go through (the DDP wrapper), else the model
    steps_this_run: int = 0

    def checkpoint(self, state, optim, plain):
        """Weights and optimiser state with torch.distributed.checkpoint (each rank its shard), every rank's
        RNGs, data cursor and schedule: parallel.save_state, checkpoints.save_checkpoint."""
        rng_plain, rng_tensors = seeds.rng_state(self.spec_rng)
        checkpoints.save_checkpoint(self.out, self.rank, dict(state), asdict(self.cfg), (
            {**plain, "rng": rng_plain, "scheduler": optim.sched.state_dict()}, rng_tensors),
            lambda folder: parallel.save_state(folder / "state", self.model, optim.opt),
            keep=self.cfg.keep_checkpoints, world=self.world)

    def resume(self, per_rank, optim, ckpt):
        parallel.load_state(ckpt / "state", self.model, optim.opt)
        optim.sched.load_state_dict(per_rank[0]["scheduler"])
        seeds.set_rng_state(per_rank[0]["rng"], per_rank[1], self.spec_rng)

    def save_model(self, folder):
        """The full weights (gathered from every rank's shard under FSDP2) as safetensors, on rank 0."""
        weights = parallel.full_state_dict(self.model) if self.sharding == "fsdp" else None
        if self.rank == 0:
            policy.save(parallel.unwrap(self.model), self.processor, folder, state_dict=weights,
                        dtype=policy.compute_dtype(self.device) if self.sharding == "fsdp" else None)

    def killed(self):
        """--stop-after (testing): exit as if killed after that many steps of this run."""
        self.steps_this_run += 1
        if self.cfg.stop_after and self.steps_this_run >= self.cfg.stop_after:
            cli.log(f"stop_after {self.cfg.stop_after}: exiting as if killed")
            checkpoints.release(self.out)
            return True
        return False


def reference_model(run):
    """The frozen reference of Eq. 7's KL: the policy as RL starts (with --beta 0 none is loaded). Saved once in
    OUT/reference (a resumed run loads it back); under FSDP2 sharded like the policy, in the compute dtype (forward
    only). With LoRA, None: the reference lives in the policy itself (lora_reference)."""
    if run.cfg.beta <= 0:
        return None
    ref_dir = run.out / "reference"
    if run.cfg.lora_r > 0:
        lora_reference(run, ref_dir)
        return None
    if not (ref_dir / "config.json").is_file():
        run.save_model(ref_dir)
    distributed.barrier()
    with hub.no_hf_progress_bars():  # the policy just loaded, once more: no second bar
        ref = policy.load_policy(str(ref_dir), device=run.device, dtype=policy.compute_dtype(run.device))[0]
    if run.sharding == "fsdp":
        parallel.shard(ref, run.device)
    return policy.frozen_copy(ref, deep=False)


def lora_reference(run, ref_dir):
    """LoRA's reference as RL starts: the adapters SFT trained, copied into a frozen second adapter of the policy
    (policy.add_reference_adapter; saved once in `ref_dir`, so a resumed run adds it back before its checkpoint
    fills it). Adapters still untrained (no SFT): none, the adapters off are the policy itself (exact and free)."""
    model, saved = parallel.unwrap(run.model), (ref_dir / "adapter_config.json").is_file()
    distributed.barrier()   # (every rank has looked before rank 0 writes)
    if not saved:
        if policy.adapters_untrained(model):   # (the same weights on every rank: the same answer)
            return
        if run.rank == 0:
            policy.save_reference_adapter(model, ref_dir)
        distributed.barrier()
    policy.add_reference_adapter(model, ref_dir)


def setup(cfg, *, observer, text_policy=False, policy_flag="", demo=Demo(), read_kwargs=None):
    """The process, the run folder (claimed: continue, refuse or start), the model and the data. `observer`: what
    the policy sees of a clip; `text_policy`: the script trains a text-only LM, not a VLM (a model of the other
    kind is refused: check_policy_kind; `policy_flag`: the flag that switches); `demo`: what the demo builds;
    `read_kwargs`: video.read_frames arguments (a frame sampler)."""
    rank, world, device = distributed.setup_distributed()
    out = cli.out_dir(cfg.out, create=False)
    with cli.no_folder_if_refused(out):   # a start refused below leaves no folder it made
        built = not cfg.model   # the demo: its model and data built here
        if built:
            depths.check_source(cfg.depth_model, cfg.depth_cache, needs_model=False)   # (the demo's clips have depth)
            prepare_demo(cfg, rank, demo)
        streams = seeds.Seeds(cfg.seed, rank)
        random.seed(streams.process)
        np.random.seed(streams.process)
        torch.manual_seed(streams.process)
        spec_rng = np.random.default_rng(streams.rl_specs)
        samples, shard, clips = load_data(cfg, rank, world, read_kwargs)   # data errors first
        eval_samples = data.load_vsibench(cfg.eval_data, cfg.eval_video_root or None)[0] if cfg.eval_data else []
        if not built:
            check_sources(cfg)
        depths.check_source(cfg.depth_model, cfg.depth_cache,   # auto: real footage needs the recommended model
                            needs_model=any(depths.own_depth_file(s.video) is None for s in samples))
        out.mkdir(parents=True, exist_ok=True)
        ckpt = checkpoints.claim_run_folder(out, asdict(cfg), rank, resume=cfg.resume, overwrite=cfg.overwrite,
                                            ignore=NOT_RESULT_KEYS + getattr(cfg, "not_results", ()), files=RUN_FILES,
                                            folders=RUN_FOLDERS, log=cli.log, world=world)
        sharding = parallel.choose(cfg.sharding, world, cfg.lora_r > 0, cfg.load_in_4bit, device.type == "cuda")
        model, processor = load_model(cfg, sharding, world, device, ckpt)
        check_policy_kind(cfg.model, model, text_policy, policy_flag)
    if ckpt and rank == 0:
        checkpoints.truncate_log(out / "log.jsonl", json.loads((ckpt / "state.json").read_text())["state"])
    distributed.barrier()
    run = Run(cfg, rank, world, device, out, model, processor, observer, samples, shard, clips, spec_rng,
              steplog.StepLog(out, rank, {"sft": ("nll",), "rl": ("r_total", "acc_perturbed", "acc_clean", "rho")}),
              eval_samples, sharding, parallel.replicate(model, device) if sharding == "ddp" else model)
    return run, ckpt


def resume_hint(cfg, resume):
    """Ctrl-C's line once OUT is known (cli.interrupt_hint), worked out when it comes: `resume` and the
    checkpoint a rerun continues from, or that none was saved yet."""
    def hint():
        saved = checkpoints.complete_checkpoints(Path(cfg.out) / "checkpoints")
        if saved:
            return f"{resume} in {saved[-1].parent} ({saved[-1].name})"
        return f"no checkpoint saved yet (one every {cfg.save_every} steps): rerun the same command to start again"
    return hint


def check_policy_kind(name, model, text_policy, flag=""):
    """The loaded model is the kind the script trains (a VLM, or with `text_policy` a text-only LM); the other kind
    is refused in one line (setup removes the run folder it made), naming `flag` and the value that takes it."""
    if policy.is_text_model(model) != text_policy:
        kind, wants = ("a text-only LM", "a vision-language model") if not text_policy else ("a VLM", "a text-only LM")
        fix = f" (or {flag} {'vlm' if text_policy else 'text'})" if flag else ""
        raise cli.UserError(f"--model {name} is {kind}; this run trains {wants}{fix}")


def check_memory(cfg, sharding, world, device):
    """Fail fast when memory.plan's per-GPU peak for this run exceeds the GPU (before anything is loaded)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(cfg.model, **hub.model_source(cfg.model))
    mode = "fsdp" if sharding == "fsdp" else ("qlora" if cfg.load_in_4bit else "lora" if cfg.lora_r else "ddp")
    total = parallel.memory_available_gib(device)
    engine_gib = cfg.vllm_gpu_memory_utilization * total if cfg.rollout_engine == "vllm" else 0.0
    plan = memory.plan(config, mode, world if mode == "fsdp" else 1, batch_size=cfg.batch_size,
                       group_size=cfg.group_size, temporal_grpo=cfg.temporal_grpo,
                       branches=2 if cfg.mode in ("rova", "dual") else 1, frames=cfg.frames, max_pixels=cfg.max_pixels,
                       max_new_tokens=cfg.max_new_tokens, micro_batch_size=cfg.micro_batch_size,
                       lora_r=cfg.lora_r or 64, reference=cfg.beta > 0, reference_root_gathered=False,
                       gradient_checkpointing=cfg.gradient_checkpointing, engine_gib=engine_gib)
    memory.check_fits(plan, total)


def load_model(cfg, sharding, world, device, ckpt):
    """The policy as this run trains it: fp32 master weights sharded by FSDP2 (each rank loads the model, then
    keeps its shard), or the model as loaded (LoRA, one process). A resumed run loads the weights of an RL
    checkpoint's stage from the checkpoint itself (Run.resume); here, the stage's starting weights. A model the
    plan says cannot fit on this GPU stops here, with the planned and the available memory."""
    if device.type == "cuda":
        check_memory(cfg, sharding, world, device)
    model, processor = policy.load_checkpoint(
        cfg.model, None, lora_r=cfg.lora_r, lora_dropout=cfg.lora_dropout, load_in_4bit=cfg.load_in_4bit, device=device,
        gradient_checkpointing=cfg.gradient_checkpointing and device.type == "cuda",
        dtype=torch.float32 if sharding == "fsdp" else None)
    if cfg.freeze_vision:
        policy.freeze_vision_encoder(model)
    if sharding == "fsdp":
        parallel.shard(model, device)
    return model, processor


# ----------------------------------------------------------------------------- the before/after check

def greedy_scores(run, shown, batch_size=16):
    """A quick check for the demo, run by rank 0 (under FSDP2, inside the caller's parallel.gathered): the score of
    the greedy answer to each (sample, clip) of `shown`, clean or corrupted. The benchmark's own aggregation
    (per-task means, categories, reasoning quality) is eval_pvrbench.py's."""
    scores = []
    for k in range(0, len(shown), batch_size):
        samples, views = zip(*shown[k:k + batch_size])
        inputs = run.observer.inputs(run.processor, [data.build_messages(s) for s in samples],
                                     [run.observer(s, v) for s, v in zip(samples, views)])
        out = policy.rollout(run.model, run.processor, inputs, n=1, max_new_tokens=run.cfg.max_new_tokens,
                             do_sample=False)
        scores += [answers.score_sample(t, s) for t, s in zip(out.texts, samples)]
    return scores


def auroc(scores, right):
    """The area under the ROC curve of `scores` for telling the questions answered right (`right` >= 0.5) from the
    others: the Mann-Whitney U over the product of the two counts (ties count half; 0.5: no information). None when
    every answer is right, or none is."""
    from scipy.stats import mannwhitneyu

    pos = [c for c, r in zip(scores, right) if r >= 0.5]
    neg = [c for c, r in zip(scores, right) if r < 0.5]
    if not pos or not neg:
        return None
    return float(mannwhitneyu(pos, neg).statistic / (len(pos) * len(neg)))


def finish(run, buffer_stats, queued, after):
    """The final weights, summary.json (every rank's skipped videos and weight checksum; `queued`: this rank's
    promoted samples never trained) and the before/after table (`after`: the final check, on rank 0)."""
    checksum = parallel.checksum(run.model, run.device)  # replicas (DDP): equal on every rank
    mine = (checksum, run.clips.bad, queued)
    gathered = [mine] * run.world
    if dist.is_initialized():
        dist.all_gather_object(gathered, mine)
    run.save_model(run.out / "final")
    if run.rank == 0:
        bad = {path: why for _, b, _ in gathered for path, why in b.items()}  # every rank's skipped videos
        summary = {"config": asdict(run.cfg), "buffer": buffer_stats, "bad_videos": len(bad),
                   "bad_video_files": dict(sorted(bad.items())[:50]), "rank_checksums": [c for c, _, _ in gathered],
                   "promotions_untrained": sum(q for _, _, q in gathered)}
        if run.eval_samples and after and after["n"]:   # (eval_limit 0: no questions checked, no table)
            for key, name in (("before", "eval_before.json"), ("after_sft", "eval_after_sft.json")):
                if (run.out / name).is_file():
                    summary[key] = json.loads((run.out / name).read_text())
            summary["after"] = after
            print_table(summary, run.cfg.mode)
            summary["windows"] = report.show(run.out, run.cfg.mode)
        (run.out / "summary.json").write_text(json.dumps(summary, indent=1))
        cli.log(f"final weights in {run.out / 'final'}")
    distributed.barrier()
    checkpoints.release(run.out)
    if dist.is_initialized():
        dist.destroy_process_group()
        # Even so, a rank can abort afterwards in the interpreter's teardown ('terminate called without an active
        # exception': a C++ thread of a process group that FSDP2's modules keep alive, destroyed at exit), and the
        # launcher then fails a run whose every file is written (seen twice on a loaded 2-core machine, in a
        # 2-process test). Everything is saved and every collective is over: leave without the teardown.
        cli.leave()


def print_table(summary, mode):
    """The before/after report: a column per check made (before SFT, after SFT, after RL)."""
    columns = [(name, summary[key]) for name, key in (("before", "before"), ("after SFT", "after_sft"),
                                                      (f"after {mode} RL", "after")) if summary.get(key)]
    a = summary["after"]
    every = a.get("n_perturbed", a["n"]) > a["n"]
    cli.log(f"accuracy on {a['n']} held-out questions (greedy), clean and under PVRBench's static corruptions "
            f"({a.get('n_perturbed', a['n'])} corrupted clips: "
            f"{'each question under every subtype' if every else 'one subtype per question, in turn'}):")
    widths = [max(9, len(name)) for name, _ in columns]
    cli.log(" " * 11 + "".join(f"   {name:>{w}}" for (name, _), w in zip(columns, widths)))
    for k in ("clean", "perturbed"):
        cli.log(f"  {k:<9}" + "".join(f"   {_cell(x.get(k), w)}" for (_, x), w in zip(columns, widths)))
    if "c_auroc" in a:   # (Eq. 3's confidence c on each corrupted clip, checked against the greedy answer there)
        cli.log(f"  {'c AUROC':<9}" + "".join(f"   {_cell(x.get('c_auroc'), w)}" for (_, x), w in
                                              zip(columns, widths)))
        cli.log("  (c AUROC: how well the self-assessment c, P(YES) on each corrupted clip, tells the questions "
                "answered right there from the others; 0.5: not at all)")


def _cell(value, width):
    return f"{'-' if value is None else format(value, '.3f'):>{width}}"
