"""extensions/embodied_r/eval.py: eval_pvrbench.py with Embodied-R's parts: the semantic-bias filter (--debias),
a text-only model reading a perceiver's text of each video (--perceiver), and the entry point's own --help."""
import subprocess
import sys
from pathlib import Path

import pytest

from machinery.datasets import data
from extensions.embodied_r import eval as er_eval
from extensions.embodied_r import perceive

ROOT = Path(__file__).resolve().parents[3]


def test_debias_drops_the_questions_a_blind_model_answers(tmp_path, synthetic_factory):
    synth = synthetic_factory(n=8, seed=3, num_frames=4, size=56, eval_fraction=0.5)
    samples, _ = data.load_vsibench(synth / "eval.jsonl", synth / "videos")
    mc = [s for s in samples if s.problem_type == "multiple choice"]
    assert mc, "the synthetic eval split has multiple-choice questions"
    asked = []

    def blind(xs):  # answers the first MC question right, the others wrong, and one not at all
        asked.extend(s.id for s in xs)
        return [s.answer if s.id == mc[0].id else (None if k == 1 else "Z") for k, s in enumerate(xs)]
    kept, report = er_eval.debias({"synthetic": samples}, blind, tmp_path / "cache.jsonl", "scripted")
    assert [s.id for s in kept["synthetic"]] == [s.id for s in samples if s.id != mc[0].id]
    assert report["checked"] == len(mc) and report["dropped"] == 1 and sorted(asked) == sorted(s.id for s in mc)
    asked.clear()
    again, report2 = er_eval.debias({"synthetic": samples}, blind, tmp_path / "cache.jsonl", "scripted")
    assert asked == [] and report2 == report and [s.id for s in again["synthetic"]] == [s.id for s in kept["synthetic"]]


def test_debias_flag_end_to_end_with_a_local_text_only_model(tmp_path, tiny_path, synthetic_factory):
    tiny = tiny_path
    synth = synthetic_factory(n=4, seed=4, num_frames=4, size=56, eval_fraction=0.5)
    out = er_eval.main(["--model", str(tiny), "--benchmark", f"synthetic={synth}", "--out", str(tmp_path / "eval"),
                        "--subtypes", "fog", "--judge", "none", "--frames", "4", "--max-new-tokens", "4",
                        "--debias", str(tiny)])
    assert out["debias"]["model"] == str(tiny) and out["debias"]["checked"] >= 1
    assert (tmp_path / "eval" / "debias").is_dir()


def test_eval_runs_a_text_model_through_the_perceiver(tmp_path, scripted, tiny_factory, tiny_path, synthetic_factory):
    tiny = tiny_factory("qwen2", extra_texts=perceive.tokenizer_corpus())
    vlm = tiny_path
    synth = synthetic_factory(n=8, seed=1, num_frames=4, size=56, eval_fraction=0.25)
    base = ["--benchmark", f"synthetic={synth}", "--subtypes", "fog,night", "--judge", "none", "--frames", "4",
            "--max-new-tokens", "6"]
    out = er_eval.main(["--model", str(tiny), "--perceiver", "scripted", "--out", str(tmp_path / "eval"), *base])
    assert out["n_samples"] > 0 and out["n_errors"] == 0
    assert Path(out["config"]["run_dir"], "config.json").read_text().count("scripted") == 1
    n_calls = len(scripted.calls)
    assert n_calls > 0
    with pytest.raises(er_eval.cli.UserError, match="give --perceiver"):
        er_eval.main(["--model", str(tiny), "--out", str(tmp_path / "eval2"), *base])
    with pytest.raises(er_eval.cli.UserError, match="is a VLM"):
        er_eval.main(["--model", str(vlm), "--perceiver", "scripted", "--out", str(tmp_path / "eval3"), *base])
    # the core alone refuses the text-only model in one line, pointing to the extensions' entry points
    with pytest.raises(er_eval.cli.UserError, match=r"text-only LM.*python -m extensions\.<name>\.eval"):
        er_eval.ev.main(["--model", str(tiny), "--out", str(tmp_path / "eval4"), *base])


def test_help_lists_the_core_flags_and_embodied_rs():
    out = subprocess.run([sys.executable, "-m", "extensions.embodied_r.eval", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0
    for flag in ("--model", "--benchmark", "--judge", "--perceiver", "--perception-cache", "--debias",
                 "--frame-sampler", "--keyframe-eps", "\nEmbodied-R:\n"):
        assert flag in out.stdout
    assert "--agent-k" not in out.stdout
