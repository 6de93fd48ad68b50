"""How the policy is spread over processes under torchrun: FSDP2, DDP or one process, and what follows from it.

    sharding = parallel.choose(cfg.sharding, world, lora=cfg.lora_r > 0)
    model = parallel.shard(model, device)            # "fsdp": torch's FSDP2, in place
    with parallel.gathered(model):                    # rollouts: all-gather once, decode locally
        out = policy.rollout(model, ...)
    for part in parallel.micro_batches(n_rows, micro_batch_size, device):   # None: a zero-weight stand-in
        ...

Modes (docs/DESIGN.md, "Training at scale"):
- ``fsdp``: full fine-tuning with ``torch.distributed.fsdp.fully_shard`` (FSDP2). Every decoder layer and every
  vision block is its own unit, the root (embeddings, LM head, final norm, the vision tower's patch embedding and
  merger) last. The weights stay fp32 and sharded (the master copy the optimiser updates: App. D's lr of 1e-5
  would leave most bf16 weights unchanged); forward and backward run in ``param_dtype`` (bf16 on GPUs) and
  gradients are reduce-scattered in fp32. AdamW's states are as sharded as the weights.
- ``ddp``: LoRA (and 4-bit) on several processes: every rank holds the frozen base model and the adapters;
  ``DistributedDataParallel`` all-reduces the adapters' gradients.
- ``none``: one process, nothing to synchronise.
``auto`` picks fsdp for full fine-tuning on more than one process or on a GPU, ddp for LoRA on more than one,
else none (one CPU process: the demo and the tests, fp32 throughout).

Exact gradients with uneven curricula: the curriculum selects a different number of completions on each rank
(possibly none), but FSDP2 and DDP need every rank to run the same forward/backward passes. So every rank runs
as many micro-batches as the busiest one (a rank with fewer runs zero-weight ones), and each micro-batch's loss is
divided by the step's denominator summed over every rank (Eq. 7's: grpo.agg_loss in train.RL.backward) and its
gradient scaled by W (learner.Learner.backward), so that the gradient averaged over ranks by FSDP2/DDP is the
step's, as one big batch on one process would give.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch
import torch.distributed as dist

from machinery import cli, distributed
from machinery.model import policy

MODES = ("auto", "fsdp", "ddp", "none")


def choose(requested: str, world: int, lora: bool, load_in_4bit: bool = False, cuda: bool = False) -> str:
    """The sharding mode for `requested` (one of MODES) on `world` processes. Full fine-tuning on a GPU is FSDP2
    even on one (its mixed precision keeps the fp32 master weights that bf16 AdamW would lose)."""
    if requested not in MODES:
        raise cli.UserError(f"--sharding must be one of {', '.join(MODES)}, got {requested!r}")
    if requested == "auto":
        if lora or load_in_4bit:
            return "ddp" if world > 1 else "none"
        return "fsdp" if (world > 1 or cuda) else "none"
    if requested == "fsdp" and (lora or load_in_4bit):
        raise cli.UserError("--sharding fsdp trains every weight (full fine-tuning); LoRA and 4-bit run "
                            "replicated: --sharding ddp (or auto)")
    if requested == "ddp" and world == 1:
        return "none"
    return requested


def units(model):
    """The modules that become FSDP2 units: those transformers says must not be split (decoder layers, vision
    blocks: the model's `_no_split_modules`), in module order."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    if not names:
        raise ValueError(f"{type(model).__name__} names no _no_split_modules: cannot choose FSDP2 units")
    return [m for m in model.modules() if type(m).__name__ in names]


def shard(model, device, dtype=None):
    """FSDP2 over this process group, in place: each unit, then the root. The model must hold fp32 weights
    (the sharded master copy); `dtype` (default policy.compute_dtype(device)) is what they are gathered in.
    `generate` goes through the root's hooks (transformers encodes the video outside forward())."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    # transformers returns logits[:, -k:], a view: FSDP2 warns that an in-place op on it would skip a hook;
    # nothing here writes to the model's outputs in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    if not dist.is_initialized():  # one process (python train.py on one GPU): a group of one
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mixed = MixedPrecisionPolicy(param_dtype=dtype or policy.compute_dtype(device), reduce_dtype=torch.float32)
    for unit in units(model):
        fully_shard(unit, mesh=mesh, mp_policy=mixed)
    fully_shard(model, mesh=mesh, mp_policy=mixed)
    register_fsdp_forward_method(model, "generate")
    return model


def replicate(model, device):
    """DDP over the trainable parameters (LoRA adapters); the model itself stays usable for generate()."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def unwrap(model):
    """The model under a DDP wrapper (generate, save, peft's disable_adapter live there)."""
    return getattr(model, "module", model)


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def release(model):
    """Free a sharded model's gathered root weights (FSDP2 keeps a root unsharded after a forward, expecting its
    backward: the frozen reference never has one)."""
    if model is not None and is_sharded(model):
        model.reshard()


def _fsdp_modules(model):
    from torch.distributed.fsdp import FSDPModule
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(*models):
    """Generation phases under FSDP2: every unit all-gathered once (a collective: every rank enters, in the
    same order), no resharding after each forward, so that decoding a rollout token by token, or a forward on
    one rank only (the demo's evaluation), runs locally. Resharded at exit. A no-op for unsharded models.

    Inside, generate() runs without the forward hooks that `shard` registers for it (the weights are already
    gathered): its wrapper's post-forward comes after generate's own forward calls have set the root idle, so
    it resharded the root after every generate(), and the next forward all-gathered again, a collective that
    only the evaluating rank entered (torch 2.14's FSDP2)."""
    groups = [_fsdp_modules(m) for m in models if m is not None]
    for mods in groups:
        for m in mods:
            m.set_reshard_after_forward(False)
        for m in mods:
            m.unshard()
    try:
        with _unhooked_generate(models):
            yield
    finally:
        for mods in groups:
            for m in mods:
                m.reshard()
                m.set_reshard_after_forward(True)


@contextmanager
def _unhooked_generate(models):
    """The class's generate() on each model that `shard` gave a hooked one (see `gathered`)."""
    hooked = [m for m in models if m is not None and "generate" in vars(m)]
    for m in hooked:
        vars(m)["_fsdp_generate"] = vars(m).pop("generate")
    try:
        yield
    finally:
        for m in hooked:
            m.generate = vars(m).pop("_fsdp_generate")


def all_max(value: int, device) -> int:
    return int(distributed.all_max_floats([int(value)], device)[0])


def micro_batches(n_rows: int, size: int, device) -> list:
    """This rank's rows in micro-batches of `size` (0: all at once), as slices, padded with None up to the
    busiest rank's count: every rank runs the same number of forward/backward passes."""
    size = size if size > 0 else max(n_rows, 1)
    mine = [slice(i, min(i + size, n_rows)) for i in range(0, n_rows, size)]
    return mine + [None] * (all_max(len(mine), device) - len(mine))


def world() -> int:
    """W, the processes whose gradients FSDP2 and DDP average (1 without a process group)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def backward_micro_batches(n_rows: int, micro_batch_size: int, backward, device, count: float | None = None) -> float:
    """Gradient accumulation over micro-batches, every rank running as many as the busiest.

    `backward(rows, denominator)` backpropagates the loss of this rank's `rows` (a slice; None: a stand-in, since
    this rank has fewer micro-batches than another, whose loss it multiplies by 0) normalised by `denominator`: the
    sum over every rank of `count` (this rank's; None: its rows), times W = world() since FSDP2 and DDP average the
    ranks' gradients (SFT's NLL: learner.sft_backward).
    Returns sum_r n_r (0: nothing was trained anywhere, and no backward ran)."""
    total, denominator = distributed.all_sum([float(n_rows), float(n_rows if count is None else count)], device)
    if total == 0 or denominator == 0:
        return 0.0
    for rows in micro_batches(n_rows, micro_batch_size, device):
        backward(rows, denominator)
    return total


def full_state_dict(model) -> dict:
    """The full (unsharded) state dict on CPU, on rank 0 (others get {}); a collective under FSDP2. LoRA:
    the whole peft model (policy.save keeps only the adapter)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model = unwrap(model)
    if not is_sharded(model):
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def checksum(model, device) -> float:
    """sum of every trainable weight, in float64, over all ranks' shards: equal on every rank by construction
    under FSDP2, and a check that replicas agree otherwise."""
    local = 0.0
    for p in unwrap(model).parameters():
        if p.requires_grad:
            t = p.detach()
            t = t.to_local() if hasattr(t, "to_local") else t
            local += float(t.double().sum())
    if is_sharded(unwrap(model)):
        return distributed.all_sum([local], device)[0]
    return local


# --------------------------------------------------------------------------- checkpoints (torch.distributed.checkpoint)

def _options(strict=True):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(ignore_frozen_params=True, strict=strict)  # LoRA: the adapters; full FT: every weight


@contextmanager
def _one_process_is_fine():
    """DCP warns that it assumes one process when there is no process group: that is what a plain run is."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def save_state(folder, model, optimizer):
    """The trainable weights and the optimiser's state with torch.distributed.checkpoint: each rank writes its
    own shard (FSDP2) or rank 0 the replicated tensors (DDP, one process); a collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    weights, optim = get_state_dict(unwrap(model), optimizer, options=_options())
    with _one_process_is_fine():
        dcp.save({"model": weights, "optimizer": optim}, checkpoint_id=str(folder))


def load_state(folder, model, optimizer):
    """Load save_state's checkpoint in place, each tensor onto this rank's own device and shard (DCP reshards
    when the checkpoint was written with another number of processes)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    weights, optim = get_state_dict(unwrap(model), optimizer, options=_options())
    state = {"model": weights, "optimizer": optim}
    with _one_process_is_fine():
        dcp.load(state, checkpoint_id=str(folder))
    keys = set_state_dict(unwrap(model), optimizer, model_state_dict=state["model"],
                          optim_state_dict=state["optimizer"], options=_options(strict=False))
    trainable = {n for n, p in unwrap(model).named_parameters() if p.requires_grad}
    lost = [k for k in keys.missing_keys if k in trainable] + list(keys.unexpected_keys)
    if lost:  # (the frozen weights are not in the checkpoint: they come from the model as loaded)
        raise RuntimeError(f"{folder}: the checkpoint does not match the model's trainable weights ({lost[:3]})")


def memory_available_gib(device):
    """The device's total memory in GiB (None on CPU)."""
    if device.type != "cuda":
        return None
    return torch.cuda.mem_get_info(device)[1] / 2 ** 30
