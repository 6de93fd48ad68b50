"""train.py: each mode takes steps, torchrun DDP on CPU, exact resume, LoRA / 4-bit, bad data, a dead judge."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from machinery.model import policy
import train
from machinery.training import clips as clips_mod
from machinery.training import runs
import perturb

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def assets(train_assets):   # (conftest.py: the tiny model and 8 synthetic clips)
    return train_assets


def args(assets, out, *extra):
    root, tiny, train_json = assets
    return ["--model", str(tiny), "--data", str(train_json), "--out", str(out), "--frames", "4",
            "--max-pixels", str(56 * 56), "--sft-epochs", "0", "--rl-steps", "2", "--batch-size", "2",
            "--group-size", "2", "--max-new-tokens", "8", "--save-every", "1", *extra]


def records(out, stage="rl"):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()
            if json.loads(line)["stage"] == stage]


def weights(folder):
    files = sorted(Path(folder).glob("*.safetensors"))
    assert files, f"no safetensors in {folder}"
    out = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("mode", ["rova", "dual", "grpo", "grpo-aug"])
def test_each_mode_takes_steps(assets, tmp_path, mode):
    out = tmp_path / mode
    extra = ["--mode", mode, "--reeval-period", "1"] + (["--temporal-grpo", "2"] if mode == "dual" else [])
    train.main(args(assets, out, *extra))
    recs = records(out)
    assert [r["step"] for r in recs] == [1, 2]
    for key in ("r_total", "acc_perturbed", "rho", "discard_rate", "defer_rate", "buffer_size", "promoted",
                "evicted", "kl", "clip_fraction", "judge_missing", "sec_perturbation",
                "sec_self_assessment", "sec_alignment_reward", "sec_backward", "sec_memory_reevaluation"):
        assert key in recs[0], key
    assert recs[0]["sec_rollout"] > 0  # every branch in one generation call
    if mode == "grpo":  # single branch on the clean video, no curriculum, no corruption
        assert recs[0]["acc_perturbed"] is None and recs[0]["acc_clean"] is not None and recs[0]["rho"] == 1.0
        assert recs[0]["r_alignment"] == 0.0  # r^A = 0 without a clean branch
    if mode == "grpo-aug":  # single branch on the corrupted video, no curriculum, no alignment reward
        assert recs[0]["acc_clean"] is None and recs[0]["acc_perturbed"] is not None and recs[0]["rho"] == 1.0
        assert recs[0]["r_alignment"] == 0.0
    if mode == "dual":
        assert recs[0]["acc_clean"] is not None and recs[0]["rho"] == 1.0 and recs[0]["r_temporal"] is not None
    if mode == "rova":  # the untrained tiny model fails everything: deferred to the buffer, re-evaluated
        assert recs[0]["defer_rate"] + recs[0]["discard_rate"] + recs[0]["rho"] == pytest.approx(1.0)
    assert (out / "final" / "model.safetensors").is_file() and (out / "summary.json").is_file()
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())  # --keep-checkpoints 2 (default)
    assert (ckpts == ["rl-0000001", "rl-0000002"]
            and all((out / "checkpoints" / c / "COMPLETE").is_file() for c in ckpts))


def test_the_demo_runs_its_whole_path_in_miniature(tmp_path, capsys):
    """No --model, no --data: setup builds the tiny model and the synthetic benchmark under OUT (runs.Demo), SFT with
    the answerability warm-up (shown its clips by train.answerability_shown), RL, the after-SFT and after-RL checks
    (every held-out question under every subtype, with c's AUROC), the table, the curriculum's windows and its
    picture. 16 clips instead of 480, a quarter epoch, two RL steps."""
    out = tmp_path / "demo"
    train.main(["--out", str(out), "--sft-epochs", "0.25", "--rl-steps", "2", "--batch-size", "2", "--group-size", "2",
                "--max-new-tokens", "8"], demo_clips=16, eval_limit=4, answerability_epochs=0.25)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["model"] == str(out / "tiny") and (out / "final" / "config.json").is_file()
    assert "before" not in summary and not (out / "eval_before.json").exists()   # (the tiny model as built: random)
    assert [summary[k]["n"] for k in ("after_sft", "after")] == [4, 4]
    assert [summary[k]["n_perturbed"] for k in ("after_sft", "after")] == [4 * len(perturb.SUBTYPES)] * 2
    assert all("c_auroc" in summary[k] and 0 <= summary[k]["c_mean"] <= 1 for k in ("after_sft", "after"))
    printed = capsys.readouterr().out
    assert "after SFT" in printed and "after rova RL" in printed and "c AUROC" in printed and "deferred" in printed
    assert [w["steps"] for w in summary["windows"]] == [[1, 1], [2, 2]] and (out / "curriculum.png").is_file()
    labels = json.loads((out / "answerability_labels_rank0.json").read_text())
    assert len(labels) == 2 * len(train.data.load_video_r1(out / "synthetic" / "train.json")[0])   # clean + one spec
    assert [x["spec"] is None for x in labels[:2]] == [True, False] and {x["target"] for x in labels} <= {"YES", "NO"}
    assert perturb.PerturbSpec.from_dict(labels[1]["spec"]).subtype in perturb.SUBTYPES


def test_resume_gives_the_weights_of_an_uninterrupted_run(assets, tmp_path):
    """Killed in SFT, then in RL: the weights and rewards of an uninterrupted run (the SFT jitter drawn per
    showing, keyed by the step, draws the same again)."""
    common = ["--mode", "dual", "--rl-steps", "4", "--save-every", "2", "--sft-epochs", "0.5", "--sft-batch-size", "2",
              "--lr", "1e-3", "--sft-lr", "1e-3", "--set", "sft_jitter=0.3", "--set", "sft_jitter_fresh=true"]
    train.main(args(assets, tmp_path / "a", *common))
    train.main(args(assets, tmp_path / "b", *common), stop_after=2)   # 2 of 3 SFT steps, then "killed"
    train.main(args(assets, tmp_path / "b", *common, "--resume", "auto"), stop_after=3)   # then 1 SFT + 2 RL
    assert not (tmp_path / "b" / "final").exists()
    train.main(args(assets, tmp_path / "b", *common, "--resume", "auto"))
    a, b = weights(tmp_path / "a" / "final"), weights(tmp_path / "b" / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    base = weights(Path(assets[1]))
    assert any(not torch.equal(a[k], base[k]) for k in a if k in base), "training changed nothing"
    ra, rb = records(tmp_path / "a"), records(tmp_path / "b")
    assert [r["step"] for r in rb] == [1, 2, 3, 4] and [r["r_total"] for r in ra] == [r["r_total"] for r in rb]


def test_freeze_vision_trains_the_merger_and_language_model_and_resumes_exactly(assets, tmp_path):
    """freeze_vision: the vision encoder's blocks end as loaded, its merger and the language model move; a run
    killed in RL (the frozen weights are not in the checkpoint) resumes to the uninterrupted run's weights."""
    common = ["--mode", "dual", "--rl-steps", "2", "--sft-epochs", "0.5", "--sft-batch-size", "2", "--lr", "1e-3",
              "--sft-lr", "1e-3", "--set", "freeze_vision=true"]
    train.main(args(assets, tmp_path / "a", *common))
    train.main(args(assets, tmp_path / "b", *common), stop_after=3)   # SFT's 2 steps, 1 RL step, then "killed"
    train.main(args(assets, tmp_path / "b", *common, "--resume", "auto"))
    a, b, base = weights(tmp_path / "a" / "final"), weights(tmp_path / "b" / "final"), weights(Path(assets[1]))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    vision = [k for k in a if "visual." in k and ".merger." not in k]
    moved = {k for k in a if not torch.equal(a[k], base[k])}
    assert vision and not moved & set(vision)
    assert any(".merger." in k for k in moved) and any("visual." not in k for k in moved), sorted(moved)[:5]


def test_lora_and_4bit_take_a_step(assets, tmp_path):
    train.main(args(assets, tmp_path / "lora", "--mode", "grpo", "--rl-steps", "1", "--lora-r", "4", "--lr", "1e-2"))
    adapter = weights(tmp_path / "lora" / "final")
    assert adapter and all("lora_" in k for k in adapter)  # only the adapter is saved
    assert records(tmp_path / "lora")[0]["loss"] is not None  # the update ran (rewards of an untrained model tie)
    train.main(args(assets, tmp_path / "q4", "--mode", "grpo", "--rl-steps", "1", "--lora-r", "4", "--load-in-4bit"))
    assert (tmp_path / "q4" / "final" / "adapter_model.safetensors").is_file()
    assert records(tmp_path / "q4")[0]["loss"] is not None
    with pytest.raises(SystemExit):
        train.main(args(assets, tmp_path / "bad", "--load-in-4bit"))


def test_missing_and_corrupt_videos_are_skipped_and_counted(assets, tmp_path, capsys):
    root, _, train_json = assets
    rows = json.loads(Path(train_json).read_text())
    folder = tmp_path / "d"
    shutil.copytree(Path(train_json).parent / "videos", folder / "videos")
    shutil.copytree(Path(train_json).parent / "depth", folder / "depth")   # the clips' own depth, beside them
    clips = sorted({r["path"] for r in rows})
    (folder / clips[0]).write_bytes(b"not a video at all")    # corrupt
    (folder / clips[1]).unlink()                               # missing
    (folder / "train.json").write_text(json.dumps(rows))
    a = args(assets, tmp_path / "out", "--mode", "grpo", "--rl-steps", "4", "--set", "max_bad_fraction=0.6")
    a[a.index("--data") + 1] = str(folder / "train.json")
    train.main(a)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["bad_videos"] == 2 and records(tmp_path / "out")[-1]["step"] == 4  # each bad video once
    files = summary["bad_video_files"]
    assert sorted(Path(f).name for f in files) == sorted(Path(c).name for c in clips[:2])
    assert files[str(folder / clips[1])] == "missing" and "decoded" in files[str(folder / clips[0])]
    assert "skipping sample" in capsys.readouterr().out
    a[a.index("max_bad_fraction=0.6")] = "max_bad_fraction=0.0"
    with pytest.raises(train.cli.UserError, match="missing"):
        train.main(a)


def test_a_judge_that_fails_every_call_never_stops_training(assets, tmp_path, monkeypatch):
    class Dead:
        def __getattr__(self, name):
            def fail(*a, **k):
                raise ConnectionError("judge down")
            return fail

    monkeypatch.setattr(train.judges, "make_judge", lambda *a, **k: Dead())
    real_rollout = train.policy.rollout

    def well_formed(*a, **k):  # an untrained model writes no <think>/<answer>, and then no judge is asked
        out = real_rollout(*a, **k)
        out.texts = ["<think>the road turns</think><answer>A</answer>"] * len(out.texts)
        return out
    monkeypatch.setattr(train.policy, "rollout", well_formed)
    out = tmp_path / "dead"
    train.main(args(assets, out, "--mode", "dual"))
    recs = records(out)
    assert len(recs) == 2 and all(r["r_alignment"] == 0.0 for r in recs)
    assert sum(r["judge_missing"] for r in recs) > 0


def test_a_batch_larger_than_the_shard_repeats_samples_safely(assets, tmp_path):
    """The cursor wraps into the next epoch inside one batch: the same sample twice in a step."""
    out = tmp_path / "wrap"
    train.main(args(assets, out, "--mode", "dual", "--rl-steps", "1", "--batch-size", "40"))
    rec = records(out)[0]
    assert rec["samples"] == 40 and rec["rho"] == 1.0 and rec["loss"] is not None


# ----------------------------------------------------------------------------- a user's first hour, through the CLI

def cli(*argv, env=None, timeout=300):
    return subprocess.run([sys.executable, "train.py", *map(str, argv)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def one_line_error(run):
    """Exit code 2 and a single `error: ...` line on stderr, no traceback."""
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert run.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (run.returncode, run.stderr)
    return lines[0]


def test_a_rerun_never_deletes_a_finished_run(assets, tmp_path):
    out = tmp_path / "done"
    train.main(args(assets, out, "--mode", "grpo"))
    before = weights(out / "final")
    for extra in ([], ["--mode", "dual"], ["--resume", "auto"]):  # the same command, another config, --resume auto
        line = one_line_error(cli(*args(assets, out, "--mode", "grpo", *extra)))
        assert "finished run" in line and "--out NEW" in line and "--overwrite" in line
    after = weights(out / "final")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert (out / "summary.json").is_file() and (out / "checkpoints").is_dir()
    train.main(args(assets, out, "--mode", "dual", "--overwrite"))  # replacing it takes the explicit flag
    assert json.loads((out / "summary.json").read_text())["config"]["mode"] == "dual"


def test_an_unfinished_run_is_continued_when_its_config_matches_and_refused_otherwise(assets, tmp_path, capsys):
    out, common = tmp_path / "cut", ["--mode", "dual", "--rl-steps", "3"]
    train.main(args(assets, out, *common), stop_after=1)
    line = one_line_error(cli(*args(assets, out, *common, "--lr", "1e-3")))
    assert "unfinished run" in line and "--lr" in line and "rl-0000001" in line
    assert (out / "checkpoints" / "rl-0000001" / "COMPLETE").is_file()  # refused, nothing removed
    capsys.readouterr()
    train.main(args(assets, out, *common))  # the same command again: continues, no --resume needed
    assert "continuing the unfinished run" in capsys.readouterr().out
    assert [r["step"] for r in records(out)] == [1, 2, 3] and (out / "final").is_dir()


def test_every_mistake_is_one_line_with_exit_code_2(assets, tmp_path):
    root, tiny, train_json = assets
    run = cli("--model", tmp_path / "runs" / "nope", "--data", train_json, "--out", tmp_path / "o1")
    assert "no such folder" in one_line_error(run)  # a path: no hub request, no retries
    assert not (tmp_path / "o1").exists()  # and no empty run folder
    line = one_line_error(cli("--model", "someorg/not-in-the-cache", "--data", train_json, "--out", tmp_path / "o2"))
    assert "HF_HUB_OFFLINE" in line and "hf download" in line
    rows = json.loads(Path(train_json).read_text())
    del rows[2]["solution"]
    (tmp_path / "bad.json").write_text(json.dumps(rows))
    line = one_line_error(cli("--model", tiny, "--data", tmp_path / "bad.json", "--out", tmp_path / "o3"))
    assert "bad.json" in line and "row 2" in line and "solution" in line
    line = one_line_error(cli("--model", tiny, "--data", train_json, "--out", train_json))
    assert "is a file" in line
    debug = cli("--model", tmp_path / "nope", "--data", train_json, "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr  # --debug shows where it came from


def test_ctrl_c_says_how_to_continue_and_the_rerun_does(assets, tmp_path, capsys):
    import signal
    import time
    out = tmp_path / "int"
    a = args(assets, out, "--mode", "grpo", "--rl-steps", "500")
    # Ctrl-C's default action in the child, as from a terminal: a shell's background job (`.ci/run ... &`)
    # inherits SIGINT ignored, and then Python installs no KeyboardInterrupt handler and the run goes on
    proc = subprocess.Popen([sys.executable, "train.py", *a], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 240
    while not list((out / "checkpoints").glob("rl-*/COMPLETE")) and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted: rerun the same command") and "Traceback" not in err
    assert f"in {out / 'checkpoints'} (rl-" in last, last   # (the run's own checkpoint: runs.resume_hint)
    capsys.readouterr()
    train.main(a, stop_after=1)  # (stop_after changes no result: the same config)
    assert "continuing the unfinished run" in capsys.readouterr().out


def test_several_updates_per_generation_reuse_the_old_log_probs_and_the_clip_binds(assets, tmp_path, monkeypatch):
    """updates_per_generation = 2 (TRL's num_iterations): two optimiser steps on one generation's rollouts, both
    against the log-probs of the policy that generated them (F_theta_old) and the reference's, computed once. The
    second step's loss equals Eq. 7 written out here (TRL's loss_type="grpo": per-token clipped surrogate plus
    beta k3-KL, masked mean per completion, mean over completions), and its clip binds (clip_fraction > 0)."""
    import types

    from machinery.datasets import data

    root, tiny, train_json = assets
    cfg = train.parse_args(args(assets, tmp_path / "out", "--lr", "3e-2", "--micro-batch-size", "2"),
                           settings={"updates_per_generation": 2})
    device = torch.device("cpu")
    model, processor = runs.load_model(cfg, "none", 1, device, None)
    ref = policy.frozen_copy(policy.load_policy(tiny, dtype=torch.float32)[0], deep=False)
    samples, _ = data.load_video_r1(train_json)
    clips = clips_mod.Clips(cfg, [], len(samples))
    rl = train.build_rl(cfg, 0, 1, device, samples, clips, model, processor, ref)
    chosen = samples[:2]
    inputs = policy.make_inputs(processor, [data.build_messages(s) for s in chosen], [clips.get(s) for s in chosen])
    torch.manual_seed(0)
    rollout = policy.rollout(model, processor, inputs, n=2, max_new_tokens=6)
    selected = [types.SimpleNamespace(rows=slice(0, 2), rewards=[1.0, 0.0]),
                types.SimpleNamespace(rows=slice(2, 4), rewards=[0.0, 2.0])]
    ids, mask, x = rollout.completion_ids, rollout.completion_mask, rollout.prompt_inputs
    model.train()
    with torch.no_grad():
        old = policy.token_logprobs(model, x, ids, mask)
        ref_logp = policy.token_logprobs(ref, x, ids, mask)
    seen, step, ref_calls = [], rl.optim.step, []
    real_ref = policy.reference_logprobs

    def after_step(trained):
        step(trained)
        with torch.no_grad():
            seen.append(policy.token_logprobs(model, x, ids, mask))
    monkeypatch.setattr(rl.optim, "step", after_step)
    monkeypatch.setattr(policy, "reference_logprobs", lambda *a, **k: ref_calls.append(1) or real_ref(*a, **k))
    stats, n = rl.update([train.Draw(selected, selected, rollout)])

    def eq7(logp):   # written out independently of grpo.grpo_loss
        a1, a2 = 0.5 / (0.5 ** 0.5 + 1e-4), 1 / (2 ** 0.5 + 1e-4)   # Eq. 8 by hand: rewards (1, 0) and (0, 2)
        a = torch.tensor([a1, -a1, -a2, a2]).unsqueeze(1)
        r = torch.exp(logp - old)
        per_token = (-torch.min(r * a, r.clamp(0.8, 1.2) * a)
                     + 0.01 * (torch.exp(ref_logp - logp) - (ref_logp - logp) - 1))
        m = mask.float()
        clipped = (((r < 0.8) & (a < 0)) | ((r > 1.2) & (a > 0))).float()
        return ((per_token * m).sum(1) / m.sum(1)).mean(), (clipped * m).sum() / m.sum()
    loss1, clip1 = eq7(old)
    loss2, clip2 = eq7(seen[0])
    assert n == 4 and len(seen) == 2 and len(ref_calls) == 2   # two micro-batches, the reference asked once each
    assert clip1 == 0 and clip2 > 0 and stats["clip_fraction"] == pytest.approx(float(clip2) / 2, abs=1e-6)
    assert stats["loss"] == pytest.approx((float(loss1) + float(loss2)) / 2, abs=1e-5)


def test_promotions_leave_the_fresh_draws_and_their_specs_aligned_across_modes(assets, tmp_path, monkeypatch):
    """The k-th fresh sample of a run gets the same video and the same corruption spec in every mode: a promoted
    sample comes back with its stored spec and draws none (rova draws fewer fresh samples per step, not others).
    Every sample is deferred here (the accuracy rule, a_min above 1) and every re-evaluation promotes
    (reeval_period 1), except the last step's: no step would be left to train what it promotes."""
    fresh, real = [], train.RL.corrupt_videos

    def corrupt_videos(self, todo, spec_rng):
        items = real(self, todo, spec_rng)
        fresh.extend((it.sample.id, json.dumps(it.spec.to_dict(), sort_keys=True)) for it in items if not it.promoted)
        return items
    monkeypatch.setattr(train.RL, "corrupt_videos", corrupt_videos)
    monkeypatch.setattr(train.RL, "assess_entries", lambda self, entries: ["informative"] * len(entries))
    draws = {}
    for mode in ("dual", "rova"):
        fresh.clear()
        out = tmp_path / mode
        train.main(args(assets, out, "--mode", mode, "--rl-steps", "3", "--reeval-period", "1", "--a-min", "1.5"),
                   assess="accuracy", fill_rounds=0)   # (a step that selects too few draws more: the next test)
        draws[mode] = list(fresh)
        if mode == "rova":
            recs = records(out)
            assert [r["promoted"] for r in recs] == [2, 0, 0] and [r["promoted_trained"] for r in recs] == [0, 2, 0]
            assert json.loads((out / "summary.json").read_text())["promotions_untrained"] == 0
    assert len(draws["rova"]) < len(draws["dual"]) and draws["rova"] == draws["dual"][:len(draws["rova"])]


def test_a_rova_step_is_app_g_s_by_default(assets, tmp_path, monkeypatch):
    """App. G's step (fill_rounds 0, the default): a ROVA step rolls out and assesses batch_size fresh samples and
    trains the ones it selects, however few; rho is the share of them selected."""
    assert train.Config().fill_rounds == 0
    decisions = iter(["discard", "train", "train", "defer", "train", "discard"])
    monkeypatch.setattr(train.RL, "assess", lambda self, c, *a, **k: SimpleNamespace(decision=next(decisions),
                                                                                   difficulty="informative"))
    out = tmp_path / "app_g"
    train.main(args(assets, out, "--mode", "rova", "--rl-steps", "3", "--lr", "1e-3"), assess="accuracy")
    recs = records(out)
    assert [r["samples"] for r in recs] == [2, 2, 2] and [r["selected"] for r in recs] == [1, 1, 1]
    assert [r["rho"] for r in recs] == [0.5, 0.5, 0.5] and [r["updates"] for r in recs] == [1, 2, 3]


def test_a_rova_step_draws_until_its_batch_is_selected_and_the_schedule_counts_updates(assets, tmp_path,
                                                                                      monkeypatch):
    """fill_rounds > 0 (this project's addition): a ROVA step whose selection is short of batch_size draws more
    from the stream, so every step trains a full batch and makes an update; the cosine schedule advances only with
    an update (a step that trains nothing anywhere leaves it where it was)."""
    decisions = iter(["discard", "train", "train", "defer", "train"] * 20)

    def assess(self, c, *a, **k):
        return SimpleNamespace(decision=next(decisions), difficulty="informative")
    monkeypatch.setattr(train.RL, "assess", assess)
    out = tmp_path / "fill"
    train.main(args(assets, out, "--mode", "rova", "--rl-steps", "3", "--lr", "1e-3"), assess="accuracy",
               fill_rounds=4)
    recs = records(out)
    assert [r["selected"] for r in recs] == [2, 2, 2] and [r["updates"] for r in recs] == [1, 2, 3]
    # the draws: [discard train] [train] | [defer train] [discard] [train] | [train defer] [train]
    assert [r["samples"] for r in recs] == [3, 4, 3] and [r["discarded"] + r["deferred"] for r in recs] == [1, 2, 1]
    lrs = [r["lr"] for r in recs]
    assert lrs[0] > lrs[1] > lrs[2] == 0.0
    # Every sample deferred and nothing to fill with (fill_rounds 0): no update, and the schedule stands still.
    monkeypatch.undo()
    out = tmp_path / "none"
    train.main(args(assets, out, "--mode", "rova", "--rl-steps", "2", "--a-min", "1.5", "--lr", "1e-3"),
               assess="accuracy", fill_rounds=0)
    assert [(r["selected"], r["updates"], r["lr"]) for r in records(out)] == [(0, 0, 1e-3), (0, 0, 1e-3)]


def test_the_accuracy_rule_re_assesses_with_g_rollouts(assets, tmp_path, monkeypatch):
    """assess=accuracy, reassess=rule: a buffered sample is re-assessed from G perturbed rollouts
    (reeval_rollouts 0), the same estimate as its first assessment, not from 2."""
    ns, real = [], train.RL._rollout
    monkeypatch.setattr(train.RL, "_rollout", lambda self, samples, views, n: ns.append(n) or real(self, samples,
                                                                                                   views, n))
    out = tmp_path / "out"
    train.main(args(assets, out, "--mode", "rova", "--reeval-period", "1", "--a-min", "1.5", "--group-size", "3"),
               assess="accuracy", reassess="rule", fill_rounds=0)
    # step 1: both branches of 2 videos; its re-evaluation, 3 each; step 2 (the last: no re-evaluation)
    assert ns == [[3] * 4, 3, [3] * 4]


def test_reassess_verdict_re_assesses_with_one_forward_per_entry(assets, tmp_path, monkeypatch):
    """reassess=verdict beside assess=accuracy: Eq. 5's re-assessment is the answerability forward alone (App.
    G's cost), no rollouts; NO keeps the entry in the buffer."""
    ns, confs, real = [], [], train.RL._rollout
    monkeypatch.setattr(train.RL, "_rollout", lambda self, samples, views, n: ns.append(n) or real(self, samples,
                                                                                                   views, n))
    monkeypatch.setattr(train.RL, "confidences", lambda self, views, samples: confs.append(len(samples))
                        or [0.2] * len(samples))   # NO
    out = tmp_path / "out"
    train.main(args(assets, out, "--mode", "rova", "--reeval-period", "1", "--group-size", "3"), fill_rounds=0)
    assert train.Config().reassess == "verdict"   # the default (App. G's cost)
    assert ns == [[3] * 4, [3] * 4]   # the two steps' branches; nothing at the re-evaluation
    assert confs == [2, 2, 2] and records(out)[-1]["buffer_size"] == 4   # step 1, its re-evaluation, step 2


def test_alg2_literal_order_trains_every_fresh_sample_then_assesses_it(assets, tmp_path, monkeypatch):
    """assess_after_update (Alg. 2 as printed): l.5's GRPO step on every fresh sample, then l.6's
    self-assessment by the updated policy, which only fills the buffer; the per-category counts add up."""
    order, update = [], train.RL.update
    monkeypatch.setattr(train.RL, "update", lambda self, *a: order.append("update") or update(self, *a))
    monkeypatch.setattr(train.RL, "confidences", lambda self, views, samples: order.append("assess")
                        or [0.2] * len(samples))   # NO: difficult
    out = tmp_path / "out"
    train.main(args(assets, out, "--mode", "rova", "--reeval-period", "5"), assess_after_update=True, assess="verdict")
    recs = records(out)
    assert order == ["update", "assess"] * 2
    assert [(r["rho"], r["defer_rate"], r["buffer_size"]) for r in recs] == [(1.0, 1.0, 2), (1.0, 1.0, 4)]
    for r in recs:
        cats = ("lighting", "occlusion", "camera", "weather")
        for key, total in (("samples", "samples"), ("trained", "selected"), ("deferred", "deferred")):
            assert sum(r[f"cat_{c}_{key}"] for c in cats) == r[total]


def test_snapshots_hold_the_weights_part_way(assets, tmp_path):
    out = tmp_path / "out"
    train.main(args(assets, out, "--mode", "grpo", "--rl-steps", "3"), snapshot_every=1)
    assert sorted(p.name for p in (out / "snapshots").iterdir()) == ["step_1", "step_2"]
    policy.load_policy(str(out / "snapshots" / "step_2"), dtype=torch.float32)   # a model folder, as final/ is
    assert set(weights(out / "snapshots" / "step_1")) == set(weights(out / "final"))


def test_temporal_corruption_permutes_the_perturbed_frames_under_the_same_specs(assets, tmp_path):
    """temporal_corruption = 1 is Eq. 2 as written: every perturbed clip's frames permuted (Eq. 1) before the
    masks, under the same subtypes and seeds as at 0 (the share is decided from each spec's own seed, so the
    spec stream is the same at any share); it is refused beside T-GRPO's shuffled group."""
    import numpy as np

    from machinery.datasets import data
    import perturb

    root, tiny, train_json = assets
    samples, _ = data.load_video_r1(train_json)
    model, processor = policy.load_policy(tiny, dtype=torch.float32)
    items = {}
    for share in (0.0, 1.0):
        cfg = train.parse_args(args(assets, tmp_path / str(share)), settings={"temporal_corruption": share})
        clips = clips_mod.Clips(cfg, [], len(samples))
        rl = train.build_rl(cfg, 0, 1, torch.device("cpu"), samples, clips, model, processor, None)
        items[share] = rl.corrupt_videos([(s, None, False) for s in samples[:4]], np.random.default_rng(0))
    for a, b in zip(items[0.0], items[1.0]):
        assert not a.spec.shuffle and b.spec.shuffle and (a.spec.subtype, a.spec.seed) == (b.spec.subtype, b.spec.seed)
        order = perturb.temporal_permutation(len(a.clean), b.spec.seed)
        assert np.array_equal(b.clean, a.clean)
        assert np.array_equal(b.pert, train.perturbed(clips, a.sample, a.clean, b.spec))
        assert not np.array_equal(b.pert, a.pert) and not np.array_equal(order, np.arange(len(order)))
    graded = [b for b in items[1.0] if b.spec.subtype in ("fog", "rain", "snow", "dusk", "shadow")]
    assert graded and all(not np.array_equal(b.pert, perturb.apply(b.clean, b.spec)) for b in graded)   # own depth
    with pytest.raises(SystemExit):
        train.parse_args(args(assets, tmp_path / "x", "--temporal-grpo", "2"), settings={"temporal_corruption": 0.5})


@pytest.mark.parametrize("c, rates", [(0.2, (0.0, 1.0, 0.0)), (0.6, (1.0, 0.0, 0.0)), (0.9, (0.0, 0.0, 1.0))])
def test_the_verdict_rule_selects_from_the_answerability_confidence_alone(assets, tmp_path, monkeypatch, c, rates):
    """assess=verdict (App. C.2): NO -> deferred, YES with c > tau -> discarded, else trained, whatever the
    rollouts' accuracy; the buffer is re-assessed from the answerability forward alone (no rollouts)."""
    calls = []
    real = train.RL._rollout
    monkeypatch.setattr(train.RL, "confidences", lambda self, views, samples: [c] * len(samples))
    monkeypatch.setattr(train.RL, "_rollout", lambda self, *a: calls.append(1) or real(self, *a))
    out = tmp_path / "out"
    train.main(args(assets, out, "--mode", "rova", "--reeval-period", "1"), assess="verdict", fill_rounds=0)
    recs = records(out)
    assert [(r["rho"], r["defer_rate"], r["discard_rate"]) for r in recs] == [rates, rates]
    # one rollout call per step, none to re-assess
    assert len(calls) == 2 and (c != 0.2 or recs[-1]["buffer_size"] == 4)


def test_the_answerability_warm_up_labels_every_clip_clean_and_corrupted_and_resumes(assets, tmp_path):
    """answerability_epochs: after the task SFT, Fig. 10's prompt on every training clip clean and under one
    corruption, trained toward YES / NO; a run killed inside it resumes with the same labels to the weights of
    an uninterrupted run."""
    from machinery.datasets import data

    n = len(data.load_video_r1(assets[2])[0])
    common = ["--mode", "rova", "--rl-steps", "1", "--save-every", "2", "--sft-epochs", "0.5", "--sft-batch-size",
              "2", "--sft-lr", "1e-3"]
    task = -(-n // 4)   # ceil(0.5 n / 2)
    train.main(args(assets, tmp_path / "a", *common), answerability_epochs=1.0)
    train.main(args(assets, tmp_path / "b", *common), answerability_epochs=1.0, stop_after=task + 2)
    labels = json.loads((tmp_path / "b" / "answerability_labels_rank0.json").read_text())
    train.main(args(assets, tmp_path / "b", *common, "--resume", "auto"), answerability_epochs=1.0)
    # (1 example + 1 task per step)
    assert len(records(tmp_path / "a", "sft")) == task + 2 * n and len(labels) == 2 * n
    assert [x["spec"] is None for x in labels] == [True, False] * n and {x["target"] for x in labels} <= {"YES", "NO"}
    assert json.loads((tmp_path / "a" / "answerability_labels_rank0.json").read_text()) == labels
    a, b = weights(tmp_path / "a" / "final"), weights(tmp_path / "b" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_answerability_targets_follow_the_sft_models_own_answers(assets, tmp_path, monkeypatch):
    """The rule, fixed before measuring: YES where the model's greedy answer on that clip is right, NO where
    it is wrong (here the model is made to answer right on clean clips and wrong on corrupted ones)."""
    import types

    from machinery.datasets import data

    samples, _ = data.load_video_r1(assets[2])
    cfg = train.parse_args(args(assets, tmp_path / "out"))
    model, processor = policy.load_policy(assets[1], dtype=torch.float32)

    def rollout(model, processor, inputs, n, **kw):
        videos = inputs["video_grid_thw"].shape[0]
        return types.SimpleNamespace(texts=[f"<answer>{samples[k // 2].answer if k % 2 == 0 else 'zzz'}</answer>"
                                            for k in range(seen["k"], seen["k"] + videos)])
    seen = {"k": 0}
    real = rollout

    def counted(*a, **kw):
        out = real(*a, **kw)
        seen["k"] += len(out.texts)
        return out
    monkeypatch.setattr(policy, "rollout", counted)
    run = types.SimpleNamespace(cfg=cfg, rank=0, out=tmp_path, shard=samples,
                                clips=clips_mod.Clips(cfg, [], len(samples)),
                                model=model, processor=processor, observer=train.Observer(cfg))
    warm_up = train.warmup.AnswerabilityWarmUp(run, {})
    shown = train.answerability_shown(run, warm_up, 2)
    labels = warm_up.labels
    assert len(shown) == 2
    assert all(x in labels and (x["spec"] is None) == (v is run.clips.get(s)) for s, x, v, _ in shown)
    assert all(m == train.buffer.answerability_messages([train.data.question_text(s)])[0] for s, _, _, m in shown)
    assert [x["target"] for x in labels] == ["YES", "NO"] * len(samples)
    assert [x["id"] for x in labels[::2]] == [s.id for s in samples]


def test_loss_norm_sets_what_a_steps_sum_is_divided_by():
    """loss_norm, through grpo.count, the sum over processes (Learner.totals, as RL.update takes it) and
    grpo.agg_loss: sequence divides Eq. 7's sum by the completions kept (a full-size update however few), fixed by
    batch_size x group_size (2 of 8 kept: a quarter of the update), token by the kept completions' tokens."""
    import grpo
    from machinery.model import learner

    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])   # the 2 completions kept of B x G = 4 x 2
    per_token = torch.tensor([[2.0, 4.0, 9.0], [6.0, 9.0, 9.0]])   # token means 3 and 6 (9: not a token)
    for norm, want in (("sequence", (3 + 6) / 2), ("fixed", (3 + 6) / 8), ("token", (2 + 4 + 6) / 3)):
        trained, denominator = learner.Learner(None, None, torch.device("cpu"), 0).totals(
            2, grpo.count(norm, mask, 4 * 2))
        halves = [grpo.agg_loss(per_token[rows], mask[rows], norm, denominator).item() for rows in (slice(0, 1),
                                                                                                  slice(1, 2))]
        assert trained == 2 and sum(halves) == pytest.approx(want)   # two micro-batches' terms add up to L
    with pytest.raises(SystemExit):
        train.parse_args(["--set", "loss_norm=mean"])


@pytest.mark.parametrize("settings", [("loss_norm=fixed", "advantage=per_component"), ("loss_norm=token",)])
def test_the_loss_and_advantage_readings_train(assets, tmp_path, settings):
    out = tmp_path / "out"
    train.main(args(assets, out, "--mode", "dual", *[a for s in settings for a in ("--set", s)]))
    rl = records(out)
    assert len(rl) == 2 and all(r["loss"] == r["loss"] for r in rl if "loss" in r)   # finite (not NaN)
    config = json.loads((out / "summary.json").read_text())["config"]
    assert [f"{k}={config[k]}" for k in ("loss_norm", "advantage") if f"{k}={config[k]}" in settings] == \
        list(settings)


def test_sft_jitter_is_a_fixed_photometric_draw_per_clip():
    frames = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 3)).astype(np.uint8)
    a, b = train.jitter(frames, 0.3, [0, 5]), train.jitter(frames, 0.3, [0, 5])
    assert (a == b).all() and (a != train.jitter(frames, 0.3, [0, 6])).any()   # per clip, the same every epoch
    assert (train.jitter(frames, 0.0, [0, 5]) == frames).all()                    # strength 0: the clip itself
    # contrast c and gain g from U(0.7, 1.3): the mean moves by (g - 1) x mean at most (up to clipping)
    x = frames.astype(np.float64)
    c, g = np.random.default_rng([0, 5]).uniform(0.7, 1.3, 2)
    expected = np.clip((x - x.mean()) * c + x.mean() * g, 0, 255)
    assert np.abs(a - expected).max() <= 1.0


@pytest.mark.parametrize("fresh", [False, True])
def test_sft_jitter_is_drawn_anew_at_each_showing_only_when_fresh(assets, monkeypatch, fresh):
    """sft_jitter_fresh keys a clip's draw by the SFT step (the same key again on a resumed run's step)."""
    from machinery.datasets import data
    from machinery.model import learner
    samples, _ = data.load_video_r1(assets[2])
    cfg = train.Config(frames=4, max_pixels=56 * 56, sft_jitter=0.3, sft_jitter_fresh=fresh)
    drawn = []
    monkeypatch.setattr(train, "jitter", lambda frames, strength, seed: drawn.append(list(seed)) or frames)
    monkeypatch.setattr(learner, "sft_backward", lambda *a: (0.0, 1))
    monkeypatch.setattr(policy, "make_inputs", lambda *a: None)   # no model: only the draws' keys matter here
    clips = clips_mod.Clips(cfg, [], len(samples))
    for step in (1, 2, 2):
        train.sft_step(cfg, None, None, samples[:1], clips, train.Observer(cfg), step)
    assert (drawn[0] != drawn[1]) == fresh and drawn[1] == drawn[2]
    assert drawn[0][:2] == train.seeds.Seeds(0).sft_jitter(samples[0].id)


def test_a_before_after_check_of_no_questions_prints_no_table(assets, tmp_path):
    """eval_limit 0 checks no question: the run ends with its summary and no table (it raised on the empty one)."""
    root, _, train_json = assets
    out = tmp_path / "out"
    train.main(args(assets, out, "--mode", "grpo"), eval_data=str(train_json.parent / "eval.jsonl"),
               eval_video_root=str(train_json.parent / "videos"), eval_limit=0)
    summary = json.loads((out / "summary.json").read_text())
    assert "after" not in summary and (out / "final").is_dir()
