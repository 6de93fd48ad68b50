"""extensions/embodied_r/train.py on a tiny VLM: the staged reward weights and the consistency reward
(--policy vlm), and the text demo's shared benchmark."""
import json
from pathlib import Path

import pytest

from machinery.model import tiny as tiny_model
import train
from machinery.training import runs
from extensions.embodied_r import train as er


@pytest.fixture(scope="module")
def assets(tmp_path_factory, tiny_path, synthetic_factory):
    synth = synthetic_factory(n=8, seed=1, num_frames=4, size=56, eval_fraction=0.25)
    return tmp_path_factory.mktemp("er_train"), tiny_path, synth / "train.json"


def args(assets, out, *extra):
    root, tiny, train_json = assets
    return ["--model", str(tiny), "--data", str(train_json), "--out", str(out), "--frames", "4", "--policy", "vlm",
            "--max-pixels", str(56 * 56), "--sft-epochs", "0", "--rl-steps", "2", "--batch-size", "2",
            "--group-size", "2", "--max-new-tokens", "8", "--save-every", "1", *extra]


def records(out, stage="rl"):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()
            if json.loads(line)["stage"] == stage]


def test_reward_weights_schedule_and_the_consistency_reward(assets, tmp_path):
    out = tmp_path / "w"
    er.main(args(assets, out, "--mode", "grpo-aug", "--reward-weights", "1=7:3:0,2-=1:7:2"))
    recs = records(out)
    # the shard is read in its first epoch here: 7:3:0 normalised; no consistency reward asked
    assert recs[0]["w_format"] == pytest.approx(0.7) and recs[0]["w_acc"] == pytest.approx(0.3)
    assert recs[0]["w_consistency"] == 0 and recs[0]["r_consistency"] is None
    out2 = tmp_path / "c"
    er.main(args(assets, out2, "--mode", "grpo", "--reward-weights", "1:7:2"))
    rec = records(out2)[0]
    assert rec["w_consistency"] == pytest.approx(0.2) and rec["r_consistency"] is not None  # judged (local judge)
    with pytest.raises(SystemExit):
        er.parse_args(["--reward-weights", "7:x:0"])




def test_the_text_demo_reuses_the_vlm_demos_benchmark(tmp_path, monkeypatch):
    """`python -m extensions.embodied_r.train` after `python train.py`: the same 960 clips are not rendered twice."""
    monkeypatch.chdir(tmp_path)
    made = []

    def make_synthetic(out, **kw):   # its summary.json only (the demo checks its settings)
        made.append(Path(out))
        Path(out).mkdir(parents=True)
        summary = {"n_clips": kw["n"], "frames": kw["num_frames"], **{k: kw[k] for k in ("seed", "size", "turn")}}
        (Path(out) / "summary.json").write_text(json.dumps(summary | {"families": kw["families"]}))
    monkeypatch.setattr(train.synthetic, "make_synthetic", make_synthetic)
    monkeypatch.setattr(tiny_model, "build_tiny", lambda out, **kw: Path(out).mkdir(parents=True) or
                        (Path(out) / "config.json").write_text("{}"))
    vlm, text = train.parse_args([]), er.parse_args([])
    runs.prepare_demo(vlm, 0)
    runs.prepare_demo(text, 0, er.demo(text))
    assert made == [Path("runs/rova/synthetic")] and text.out == er.TEXT_DEMO_OUT and text.perceiver == "cv"
    assert text.data == vlm.data == str(Path("runs/rova/synthetic") / "train.json")


def test_the_text_policy_refuses_a_rollout_engine_in_one_line_before_any_work(tmp_path):
    """--policy text (the default) prompts the LM with the perceiver's text, which the engine never gets: refused
    by the flag check (one line, exit 2, nothing written); --policy vlm rolls out as train.py does, on the engine."""
    import subprocess
    import sys
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "extensions.embodied_r.train", "--out", str(out), "--rollout-engine",
                           "vllm"], cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True,
                          timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "error: --rollout-engine vllm: --policy text" in lines[-1], done.stderr
    assert not out.exists()
    assert er.parse_args(["--policy", "vlm", "--rollout-engine", "vllm", "--out", str(out)]).rollout_engine == "vllm"
