"""runtime.py: one-line errors, output-path and model-source checks, grouped help with defaults, quiet
third-party output, the OpenMP wait policy."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from machinery import runtime

ROOT = Path(__file__).resolve().parents[1]


def run_py(code, env=None):
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_run_prints_a_user_error_as_one_line_with_exit_code_2():
    code = ("from machinery import runtime\n"
            "def main():\n    raise runtime.UserError('bad.json: row 3 (id q7): field\\n solution: missing')\n"
            "runtime.run(main)")
    out = run_py(code)
    assert out.returncode == 2 and out.stderr == "error: bad.json: row 3 (id q7): field solution: missing\n"
    debug = run_py(code, env={"ROVA_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "UserError" in debug.stderr


def test_run_turns_ctrl_c_into_one_line_with_the_hint():
    out = run_py("from machinery import runtime\ndef main():\n    raise KeyboardInterrupt\n"
                 "runtime.run(main, interrupted=lambda: 'rerun the same command')")
    assert out.returncode == 130 and out.stderr.strip() == "interrupted: rerun the same command"


def test_an_interrupt_hint_block_names_how_to_continue_and_the_innermost_wins():
    out = run_py("from machinery import runtime\ndef main():\n    with runtime.interrupt_hint('outer'):\n"
                 "        with runtime.interrupt_hint('continue in OUT'):\n            raise KeyboardInterrupt\n"
                 "runtime.run(main, interrupted='the default')")
    assert out.returncode == 130 and out.stderr.strip() == "interrupted: continue in OUT"
    out = run_py("from machinery import runtime\ndef main():\n    with runtime.interrupt_hint('in OUT'):\n"
                 "        pass\n    raise KeyboardInterrupt\nruntime.run(main, interrupted='the default')")
    assert out.stderr.strip() == "interrupted: the default"


def test_out_dir_and_out_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(runtime.UserError, match="is a file"):
        runtime.out_dir(tmp_path / "f" / "sub")
    assert runtime.out_dir(tmp_path / "a" / "b").is_dir()
    assert not runtime.out_dir(tmp_path / "c", create=False).exists()
    with pytest.raises(runtime.UserError, match="unsupported extension '.txt'"):
        runtime.out_file(tmp_path / "x.txt", (".mp4",))
    with pytest.raises(runtime.UserError, match="is a folder"):
        runtime.out_file(tmp_path / "a", (".mp4",))
    with pytest.raises(runtime.UserError, match="is a file"):
        runtime.out_file(tmp_path / "f" / "x.mp4", (".mp4",))
    p = runtime.out_file(tmp_path / "new" / "x.mp4", (".mp4",))
    assert p.parent.is_dir() and not p.exists()  # the folder is made, nothing is written


def test_model_source_tells_paths_from_hub_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    assert runtime.model_source("ckpt") == {}
    for name, phrase in (("runs/nope", "no such folder"), ("./x", "no such folder"), ("a/b/c", "no such folder"),
                         (str(tmp_path), "no config.json")):
        with pytest.raises(runtime.UserError, match=phrase):
            runtime.model_source(name)
    monkeypatch.setattr(runtime, "_hub_reachable", lambda *a, **k: pytest.fail("no hub request for a path"))
    with pytest.raises(runtime.UserError):
        runtime.model_source("runs/also-missing")


def test_an_uncached_hub_id_offline_is_one_line():
    out = run_py("from machinery import runtime\nruntime.run(lambda: runtime.model_source('someorg/not-cached'))",
                 env={"HF_HUB_OFFLINE": "1"})
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "HF_HUB_OFFLINE=1" in lines[0] and "hf download" in lines[0]


def test_bitsandbytes_is_quiet_and_the_spin_count_is_set():
    out = run_py("from machinery import runtime; import os, peft, bitsandbytes; print(os.environ['GOMP_SPINCOUNT'])")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "gemm_4bit" not in out.stderr and "kernels" not in out.stderr
    assert out.stdout.strip() == runtime.GOMP_SPINCOUNT
    mine = run_py("from machinery import runtime; import os; print(os.environ['GOMP_SPINCOUNT'])",
                  env={"GOMP_SPINCOUNT": "7"})
    assert mine.stdout.strip() == "7"  # a user's own setting wins


def test_saving_a_checkpoint_draws_no_shard_bar(tmp_path, capfd):
    from machinery.model import policy
    from machinery.model import tiny as tiny_model
    tiny = tiny_model.build_tiny(tmp_path / "tiny")
    model, processor = policy.load_policy(str(tiny))
    capfd.readouterr()
    policy.save(model, processor, tmp_path / "ckpt")
    assert "Writing model shards" not in capfd.readouterr().err
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()


def test_help_is_grouped_and_shows_the_defaults():
    out = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    text = out.stdout
    heads = [f"\n{g}:\n" for g in ("model", "data", "output", "SFT", "RL", "curriculum", "distributed")]
    assert all(h in text for h in heads) and [text.index(h) for h in heads] == sorted(text.index(h) for h in heads)
    assert "--perceiver" not in text and "--agent-k" not in text  # an extension's flags: only in its own --help
    er = subprocess.run([sys.executable, "-m", "extensions.embodied_r.train", "--help"], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
    assert er.returncode == 0 and er.stdout.index("\ndistributed:\n") < er.stdout.index("\nEmbodied-R:\n")
    assert "--perceiver" in er.stdout and "--lora-r" in er.stdout
    flat = " ".join(text.split())
    assert "RL steps (App. D: 300) (default: 300)" in flat and "--overwrite" in flat and "--debug" in flat
    ev = subprocess.run([sys.executable, "eval_pvrbench.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
    assert ev.returncode == 0 and all(f"\n{g}:\n" in ev.stdout for g in ("benchmark", "model", "judge", "output"))
