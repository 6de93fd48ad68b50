"""parallel.py and training at scale on CPU (gloo): FSDP2 and DDP updates equal one process's, micro-batches
equal one big batch, kill + resume under FSDP2 is bit-identical, a checkpoint resumes only on its world size."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from machinery.model import parallel
from machinery.model import policy
from machinery.training import checkpoints
import train
from machinery.model import learner
from machinery.training import clips as clips_mod
from machinery.training import runs
import perturb

ROOT = Path(__file__).resolve().parents[1]
# a collective that only some ranks entered fails after ROVA_DIST_TIMEOUT seconds instead of hanging the suite
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ROVA_DIST_TIMEOUT": "90"}


@pytest.fixture(scope="module")
def assets(train_assets):   # (conftest.py: the tiny model and 8 synthetic clips)
    return train_assets


def torchrun(n, *argv, timeout=600, check=True, env=None):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n), *map(str, argv)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**ENV, **(env or {})})
    assert run.returncode == 0 or not check, run.stderr[-4000:]
    return run


def test_choose_picks_fsdp_for_full_fine_tuning_on_several_processes():
    assert parallel.choose("auto", 4, lora=False) == "fsdp"
    assert parallel.choose("auto", 4, lora=True) == "ddp"
    assert parallel.choose("auto", 1, lora=False) == "none"
    assert parallel.choose("ddp", 1, lora=True) == "none"
    with pytest.raises(Exception, match="LoRA and 4-bit run replicated"):
        parallel.choose("fsdp", 2, lora=True)
    with pytest.raises(Exception, match="--sharding must be one of"):
        parallel.choose("zero3", 2, lora=False)


def test_every_rank_runs_as_many_micro_batches_as_the_busiest():
    dev = torch.device("cpu")
    assert parallel.micro_batches(5, 2, dev) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert parallel.micro_batches(5, 0, dev) == [slice(0, 5)]
    assert parallel.micro_batches(0, 2, dev) == []
    seen = []
    total = parallel.backward_micro_batches(4, 3, lambda rows, den: seen.append((rows, den)), dev, count=7)
    assert total == 4 and seen == [(slice(0, 3), 7.0), (slice(3, 4), 7.0)]   # the step's denominator, summed
    assert parallel.backward_micro_batches(0, 3, lambda rows, w: seen.append(1), dev) == 0 and len(seen) == 2


@pytest.mark.parametrize("lora,norm", [(False, "sequence"), (True, "sequence"), (False, "token"), (False, "fixed")],
                         ids=["fsdp2", "ddp-lora", "fsdp2-token", "fsdp2-fixed"])
@pytest.mark.slow
def test_two_processes_end_with_the_weights_of_one(assets, tmp_path, lora, norm):
    """The same global batch on 1 process and on 2 (FSDP2 full fine-tuning, or DDP with LoRA), including an
    update in which rank 1's curriculum selected nothing: fp32 weights equal to 1e-6, whatever Eq. 7's loss_norm
    (token: the ranks' denominators differ; fixed: B x G per rank)."""
    root, tiny, data_json = assets
    extra = (["--lora"] if lora else []) + ["--loss-norm", norm]
    one, two = tmp_path / "one", tmp_path / "two"
    for out in (one, two):
        out.mkdir()
    subprocess.run([sys.executable, "tests/distributed_update.py", one, tiny, data_json, *extra], cwd=ROOT,
                   check=True, env=ENV, capture_output=True)
    torchrun(2, "tests/distributed_update.py", two, tiny, data_json, *extra)
    for ga, gb in zip(*(torch.load(d / "grads.pt", weights_only=True) for d in (one, two))):  # each update's
        assert ga.keys() == gb.keys() and ga
        assert max(((ga[k] - gb[k]).abs().max() / ga[k].abs().max().clamp(min=1e-12)).item() for k in ga) < 1e-5
    a = torch.load(one / "weights.pt", weights_only=True)
    b = torch.load(two / "weights.pt", weights_only=True)
    base = policy.load_policy(tiny)[0].state_dict()
    assert a.keys() == b.keys() and a
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    if not lora:
        assert max((a[k] - base[k]).abs().max().item() for k in a) > 1e-5, "the updates changed nothing"
    else:
        assert all("lora_" in k for k in a)


def args(assets, out, *extra):
    root, tiny, train_json = assets
    return ["--model", str(tiny), "--data", str(train_json), "--out", str(out), "--frames", "4",
            "--max-pixels", str(56 * 56), "--sft-epochs", "0.5", "--sft-batch-size", "2", "--rl-steps", "3",
            "--batch-size", "2", "--group-size", "2", "--max-new-tokens", "8", "--save-every", "2",
            "--micro-batch-size", "2", "--lr", "1e-3", "--sft-lr", "1e-3", "--mode", "dual", *extra]


def final_weights(out):
    from safetensors.torch import load_file
    (path,) = (out / "final").glob("*.safetensors")   # model.safetensors, or LoRA's adapter_model.safetensors
    return load_file(str(path))


# Where the kill -9 of each run in a chain lands (checkpoints.FAULT_POINTS), and what the folder must then hold.
# The saves: sft-0000002 (the end of SFT), rl-0000002, rl-0000003 (which prunes sft-0000002).
KILL_CHAIN = ["setup.locked", "save.begin", "save.rank_files:1", "save.weights", "save.marked", "save.renamed",
              "setup.decided", "prune.retired"]
assert {p.split(":")[0] for p in KILL_CHAIN} == set(checkpoints.FAULT_POINTS)
# DDP-LoRA differs from FSDP2 in what a save writes and a resume loads (the adapter only, loaded non-strictly),
# not in setup's lock and decision: its chain is the points of the weights' save and the prune.
LORA_CHAIN = ["save.weights", "save.marked", "save.renamed", "prune.retired"]
LEFT_BEHIND = {"save.marked": ".tmp-sft-0000002/COMPLETE", "save.renamed": "sft-0000002/COMPLETE",
               "prune.retired": ".trash-sft-0000002-*"}


@pytest.mark.parametrize("kind", ["fsdp2", "ddp-lora"])
@pytest.mark.slow
def test_a_kill_at_any_point_of_save_prune_and_setup_resumes_to_the_uninterrupted_weights(assets, tmp_path, kind):
    """torchrun, 2 processes: a run killed (SIGKILL, checkpoints.fault_point) at each named point of setup, save
    and prune, each rerun continuing the last, ends with the weights of an uninterrupted run, bit for bit; a
    half-written checkpoint (COMPLETE in its temporary folder) is never resumed from, and a checkpoint resumes
    only on its own number of processes."""
    a, b = tmp_path / "a", tmp_path / "b"
    extra = ["--lora-r", "4"] if kind == "ddp-lora" else []
    torchrun(2, "train.py", *args(assets, a, *extra))
    summary = json.loads((a / "summary.json").read_text())
    assert summary["config"]["sharding"] == "auto" and len(summary["rank_checksums"]) == 2
    for point in (KILL_CHAIN if kind == "fsdp2" else LORA_CHAIN):
        run = torchrun(2, "train.py", *args(assets, b, *extra), check=False, env={"ROVA_FAULT": point})
        assert run.returncode != 0 and f"killed at {point.split(':')[0]}" in run.stderr, run.stderr[-3000:]
        left = LEFT_BEHIND.get(point)
        assert not left or list((b / "checkpoints").glob(left)), (point, sorted((b / "checkpoints").iterdir()))
        if point == "save.renamed" and kind == "fsdp2":   # a checkpoint resumes only on its number of processes
            one = subprocess.run([sys.executable, "train.py", *args(assets, b)], cwd=ROOT, capture_output=True,
                                 text=True, env=ENV)
            assert one.returncode == 2 and "written by 2 processes and this run has 1" in one.stderr, one.stderr[-2000:]
    torchrun(2, "train.py", *args(assets, b, *extra))
    assert not list((b / "checkpoints").glob(".*")), "what killed saves left is removed"
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    base = policy.load_policy(assets[1])[0].state_dict()   # (LoRA: B starts at zero, the adapter is all it saves)
    changed = [k for k in wa if (k in base and not torch.equal(wa[k], base[k])) or ("lora_B" in k and wa[k].any())]
    assert changed, "training changed nothing"


@pytest.mark.parametrize("norm", ["sequence", pytest.param("token", marks=pytest.mark.slow),
                                  pytest.param("fixed", marks=pytest.mark.slow)])
def test_micro_batches_give_the_gradient_of_one_batch(assets, tmp_path, norm):
    """One process: an RL update in micro-batches of 1 and of 3 equals the update of all rows at once, whatever
    Eq. 7's loss_norm."""
    root, tiny, data_json = assets
    out = []
    for mb in (0, 1, 3):
        d = tmp_path / f"mb{mb}"
        d.mkdir()
        subprocess.run([sys.executable, "tests/distributed_update.py", d, tiny, data_json, "--micro-batch", str(mb),
                        "--loss-norm", norm], cwd=ROOT, check=True, env=ENV, capture_output=True)
        out.append(torch.load(d / "weights.pt", weights_only=True))
    for other in out[1:]:
        assert max((out[0][k] - other[k]).abs().max().item() for k in out[0]) <= 1e-6


def test_the_sft_optimizer_is_gone_before_rl(assets, tmp_path, monkeypatch):
    """No optimiser outlives its stage (AdamW's state is twice the trained weights)."""
    import gc
    import weakref
    made = []
    real = learner.Optim.make

    def spy(*a, **k):
        o = real(*a, **k)
        made.append(weakref.ref(o.opt))
        return o
    monkeypatch.setattr(learner.Optim, "make", spy)
    seen = {}
    real_rl = train.run_rl

    def check(*a, **k):
        gc.collect()
        seen["sft_alive"] = made[0]() is not None
        return real_rl(*a, **k)
    monkeypatch.setattr(train, "run_rl", check)
    train.main(args(assets, tmp_path / "o", "--rl-steps", "1"))
    assert len(made) == 2 and seen["sft_alive"] is False


@pytest.mark.parametrize("restart_lr", [0.0, 1e-4])
def test_the_schedule_restarts_at_the_answerability_part_from_its_own_peak(restart_lr):
    """SFT's cosine over its task steps (here 6 of 10, from 1e-3), then again over the answerability part from
    restart_lr (0: the SFT lr): hand-worked values of 0.5 (1 + cos(pi k / K)) times the peak."""
    model = torch.nn.Linear(2, 1)
    optim = learner.Optim.make(train.Config(), model, 1e-3, 10, torch.device("cpu"), restart=6, restart_lr=restart_lr)
    lrs = []
    for _ in range(10):
        lrs.append(optim.sched.get_last_lr()[0])
        model(torch.ones(1, 2)).sum().backward()
        optim.step(True)
    peak = restart_lr or 1e-3
    expected = [1e-3, 0.9330127e-3, 0.75e-3, 0.5e-3, 0.25e-3,
                0.0669873e-3, peak, 0.8535534 * peak, 0.5 * peak, 0.1464466 * peak]
    assert lrs == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_sft_micro_batches_give_the_gradient_of_one_batch(assets):
    """SFT's loss is the mean over every target token of the step, whatever the micro-batch size."""
    from machinery.datasets import data
    root, tiny, data_json = assets
    samples, _ = data.load_video_r1(data_json)
    model, processor = policy.load_policy(tiny)
    cfg = train.Config(frames=4, max_pixels=56 * 56)
    clips = clips_mod.Clips(cfg, [], len(samples))
    observer = train.Observer(cfg)
    grads, values = [], []
    for mb in (0, 1, 2):
        cfg.micro_batch_size = mb
        model.zero_grad(set_to_none=True)
        nll, tokens = train.sft_step(cfg, model, processor, samples[:3], clips, observer)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        values.append((nll, tokens))
    assert values[0][1] > 3 and all(abs(v[0] - values[0][0]) < 1e-6 and v[1] == values[0][1] for v in values)
    for g in grads[1:]:
        assert g.keys() == grads[0].keys()
        assert max((g[k] - grads[0][k]).abs().max().item() for k in g) < 1e-6


def test_a_model_too_large_for_the_gpu_fails_before_loading(assets, monkeypatch):
    """runs.check_memory (run on CUDA before anything is loaded): the planned and the available GiB."""
    root, tiny, data_json = assets
    cfg = train.parse_args(["--model", str(tiny), "--data", str(data_json), "--frames", "4",
                            "--max-pixels", str(56 * 56)])
    monkeypatch.setattr(parallel, "memory_available_gib", lambda device: 0.5)
    with pytest.raises(Exception, match=r"planned peak 1\.\d GiB per GPU .* exceeds the 0\.5 GiB available"):
        runs.check_memory(cfg, "fsdp", 4, torch.device("cpu"))
    monkeypatch.setattr(parallel, "memory_available_gib", lambda device: 80.0)
    runs.check_memory(cfg, "fsdp", 4, torch.device("cpu"))  # fits: no error


MISMATCH = """
import sys, time
sys.path.insert(0, ".")
import torch, torch.distributed as dist
from machinery import distributed
rank, world, device = distributed.setup_distributed()
if rank == 0:
    dist.all_reduce(torch.ones(3))   # rank 1 never enters this collective
else:
    time.sleep(300)
"""


@pytest.mark.slow
def test_a_collective_only_one_rank_entered_fails_instead_of_hanging(tmp_path):
    """ROVA_DIST_TIMEOUT bounds every collective of the process group (torch's default is 30 minutes on gloo)."""
    script = tmp_path / "mismatch.py"
    script.write_text(MISMATCH)
    run = torchrun(2, script, check=False, timeout=200, env={"ROVA_DIST_TIMEOUT": "5"})
    assert run.returncode != 0 and "Timed out waiting 5000ms" in run.stderr, run.stderr[-2000:]


# Every torchrun configuration a user may start, 2 processes: RL straight from a checkpoint (no SFT) in each mode
# under FSDP2, and LoRA under DDP; with the before/after evaluation, which rank 0 runs alone inside the gathered
# weights (the path that aborted with a collective mismatch), and, for rova, the buffer's re-evaluation each step;
# FSDP2 with the vision encoder frozen (freeze_vision: frozen and trained weights in one sharded model).
MATRIX = [("rova", "fsdp"), ("dual", "fsdp"), ("grpo", "fsdp"), ("grpo-aug", "fsdp"), ("rova", "ddp"),
          ("dual", "fsdp-frozen-vision")]


@pytest.mark.parametrize("mode,sharding", MATRIX, ids=[f"{m}-{s}" for m, s in MATRIX])
@pytest.mark.slow
def test_every_torchrun_configuration_runs(assets, tmp_path, mode, sharding):
    root, tiny, data_json = assets
    out = tmp_path / "run"
    extra = {"ddp": ["--lora-r", "4"], "fsdp-frozen-vision": ["--set", "freeze_vision=true", "--sft-epochs", "0.5",
                                                              "--sft-batch-size", "2", "--sft-lr", "1e-3"]}
    extra = extra.get(sharding, [])
    torchrun(2, "train.py", "--model", tiny, "--data", data_json, "--out", out, "--frames", "4",
             "--max-pixels", 56 * 56, "--sft-epochs", "0", "--rl-steps", "2", "--batch-size", "2", "--group-size", "2",
             "--max-new-tokens", "8", "--save-every", "1", "--mode", mode, "--reeval-period", "1",
             "--set", f"eval_data={data_json.parent / 'eval.jsonl'}",
             "--set", f"eval_video_root={data_json.parent / 'videos'}", "--set", "eval_limit=4", *extra, timeout=300)
    summary = json.loads((out / "summary.json").read_text())
    checksums = summary["rank_checksums"]
    assert len(checksums) == 2 and checksums[0] == checksums[1]   # replicas (DDP) / one sharded model (FSDP2)
    assert summary["before"]["n"] == summary["after"]["n"] == 4
    assert 0 <= summary["after"]["c_mean"] <= 1   # c of every corrupted clip: a forward on rank 0 alone, gathered
    rl = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines() if json.loads(x)["stage"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2]
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("rl-"))[-1] == "rl-0000002"
    if sharding == "fsdp-frozen-vision":   # the encoder's blocks as loaded, the rest trained
        from safetensors.torch import load_file
        final = load_file(str(out / "final" / "model.safetensors"))
        base = load_file(str(Path(tiny) / "model.safetensors"))
        vision = {k for k in final if "visual." in k and ".merger." not in k}
        moved = {k for k in final.keys() & base.keys() if not torch.equal(final[k], base[k].to(final[k].dtype))}
        assert vision and not moved & vision and moved, sorted(moved)[:5]
