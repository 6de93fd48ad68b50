"""Two GRPO updates of one fixed global batch, split over however many processes run this (tests/test_parallel.py).

    python tests/distributed_update.py OUT TINY DATA [--lora] [--micro-batch K] [--loss-norm N]   # one process
    torchrun --nproc_per_node 2 tests/distributed_update.py OUT TINY DATA     # FSDP2 (DDP with --lora)

Every rank builds the same global batch (3 prompts x G = 2 greedy completions, fixed advantages) and trains
its own rows of it through train.RL.backward (micro-batches of 2), divided by the step's denominator and Optim.step: in the first update
rank 0 has rows 0-3 and rank 1 rows 4-5; in the second rank 0 has all six and rank 1 none (its curriculum
selected nothing). The full weights after both updates are written to OUT/weights.pt by rank 0. Eq. 7 is
normalised by --loss-norm (default sequence); fixed divides by B x G x W = 4 prompts x G, however many ranks.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from machinery import cli  # noqa: E402, I001

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from machinery import distributed  # noqa: E402
from machinery.datasets import data  # noqa: E402
from machinery.model import parallel  # noqa: E402
from machinery.model import policy  # noqa: E402
import grpo  # noqa: E402
import train  # noqa: E402
from machinery.training import clips as clips_mod  # noqa: E402
from machinery.training import runs  # noqa: E402
import perturb  # noqa: E402


def gathered_grads(model, lora):
    """Every trainable parameter's gradient, in full (FSDP2 shards gathered), by name."""
    out = {}
    for name, p in parallel.unwrap(model).named_parameters():
        if p.requires_grad and p.grad is not None:
            g = p.grad
            out[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
    return out


def option(name, default):
    """The value after `name` on the command line, else `default`."""
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main():
    out, tiny, data_json = sys.argv[1:4]
    lora = "--lora" in sys.argv
    micro, norm = option("--micro-batch", "2"), option("--loss-norm", "sequence")
    rank, world, device = distributed.setup_distributed()
    cfg = train.parse_args(["--model", tiny, "--data", data_json, "--out", out, "--frames", "4", "--max-pixels",
                            str(56 * 56), "--group-size", "2", "--micro-batch-size", micro, "--lr", "1e-4",
                            "--lora-r", "4" if lora else "0", "--batch-size", str(4 // world),
                            "--set", f"loss_norm={norm}"])
    sharding = parallel.choose(cfg.sharding, world, lora)
    torch.manual_seed(0)  # the same initial adapters on every rank (LoRA)
    model, processor = runs.load_model(cfg, sharding, world, device, None)
    for m in model.modules():  # LoRA's dropout draws differ with the split of the rows: off, to compare
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    ref = None
    if not lora:
        ref = policy.frozen_copy(policy.load_policy(tiny, device=device, dtype=torch.float32)[0], deep=False)
        if sharding == "fsdp":
            parallel.shard(ref, device)
    train_model = parallel.replicate(model, device) if sharding == "ddp" else model
    samples, _ = data.load_video_r1(data_json)
    clips = clips_mod.Clips(cfg, [], len(samples))
    rl = train.build_rl(cfg, rank, world, device, samples, clips, model, processor, ref, train_model=train_model)

    chosen = samples[:3]
    inputs = policy.make_inputs(processor, [data.build_messages(s) for s in chosen], [clips.get(s) for s in chosen])
    with parallel.gathered(model):
        rollout = policy.rollout(model, processor, inputs, n=2, max_new_tokens=6, do_sample=False)
    adv = torch.tensor([1.0, 0.5, -0.5, -1.0, 2.0, 1.5])  # rows 2b, 2b+1: prompt b (identical greedy completions)
    splits = ([[0, 1, 2, 3], [4, 5]], [[0, 1, 2, 3, 4, 5], []])  # update 2: rank 1 selects nothing
    grads = []
    for split in splits:
        mine = list(range(6)) if world == 1 else split[rank]
        masks = rollout.completion_mask[torch.as_tensor(mine)] if mine else None
        total, denominator = rl.learner.totals(len(mine), grpo.count(cfg.loss_norm, masks,
                                                                     cfg.batch_size * cfg.group_size))
        assert total == 6, total
        rl.backward(rollout, mine, adv[mine], denominator)
        grads.append(gathered_grads(model, lora))
        rl.optim.step(total > 0)

    weights = parallel.full_state_dict(model)
    if rank == 0:
        trainable = {n for n, p in parallel.unwrap(model).named_parameters() if p.requires_grad}
        torch.save({k: v for k, v in weights.items() if k in trainable}, Path(out) / "weights.pt")
        torch.save(grads, Path(out) / "grads.pt")
    if dist.is_initialized():
        dist.barrier()   # rank 1 must not tear gloo down while rank 0 is still saving (an abort at exit otherwise)
        dist.destroy_process_group()
        cli.leave()   # (as runs.finish: a rank can abort in the interpreter's teardown after all is written)


if __name__ == "__main__":
    main()
