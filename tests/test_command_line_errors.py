"""The command lines' refusals, as a new user's first tries meet them: each mistake is one line (`error: ...`), exit
code 2, no traceback, found before any work, and leaves no folder behind; Ctrl-C's line names only what exists."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import train
from machinery import cli
from machinery.training import runs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def assets(tmp_path_factory, tiny_path, synthetic_factory):
    synth = synthetic_factory(n=4, seed=1, num_frames=4, size=56, eval_fraction=0.5)
    return tmp_path_factory.mktemp("command_line"), tiny_path, synth


def script(name, *argv):
    return subprocess.run([sys.executable, name, *map(str, argv)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def one_line(run):
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert run.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr and "usage:" not in run.stderr
    return lines[0]


def bad_rows(assets):
    """The training file with row 1's solution removed."""
    root, _, synth = assets
    rows = json.loads((synth / "train.json").read_text())
    del rows[1]["solution"]
    path = root / "bad.json"
    path.write_text(json.dumps(rows))
    return path


@pytest.mark.parametrize("extra, phrases", [
    (("--eta", "0,7"), ("--eta '0,7'", "decimal point", "has no subtype")),           # a decimal comma: not 7.0
    (("--eta", "1.5"), ("--eta '1.5'", "outside [0, 1]")),
    (("--eta", "0.7,fog=high"), ("--eta '0.7,fog=high'", "'X,subtype=Y,...'")),
    (("--rl-step", "5"), ("unrecognized arguments: --rl-step",)),                      # no abbreviations
    (("--set", "gradient_checkpointing=ture"), ("'ture' is not a boolean",)),          # not quietly False
    (("--mode", "rova", "--lr"), ("--lr: expected one argument",)),                     # argparse's own: one line
])
def test_train_command_line_mistakes_are_one_line_before_any_work(assets, tmp_path, extra, phrases):
    root, tiny, synth = assets
    out = tmp_path / "run"
    line = one_line(script("train.py", "--model", tiny, "--data", synth / "train.json", "--out", out, *extra))
    assert all(p in line for p in phrases), line
    assert "parse_eta" not in line and not out.exists()


def test_a_refused_start_leaves_no_folder(assets, tmp_path, tiny_factory):
    root, tiny, synth = assets
    out = tmp_path / "run"
    line = one_line(script("train.py", "--model", tiny, "--data", tmp_path / "missing.json", "--out", out))
    assert "missing.json" in line and not out.exists()
    # data mistakes come first: a model not in the cache and a bad row -> the row is what is reported
    line = one_line(script("train.py", "--model", "someorg/not-in-the-cache", "--data", bad_rows(assets), "--out", out))
    assert "row 1" in line and "solution" in line and not out.exists()
    # refused once the model is loaded (a text-only LM; after the loading bar): the folder it made is removed
    text_lm = tiny_factory("qwen2")
    run = script("train.py", "--model", text_lm, "--data", synth / "train.json", "--out", out)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 2 and "Traceback" not in run.stderr and last.startswith("error: ") and "text-only" in last
    assert not out.exists()
    # a folder that was there before a refused start stays
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert script("train.py", "--model", text_lm, "--data", synth / "train.json", "--out", out).returncode == 2
    assert (out / "notes.txt").read_text() == "mine"


def test_no_folder_if_refused_removes_only_what_it_made(tmp_path):
    made, there = tmp_path / "made", tmp_path / "there"
    there.mkdir()
    for folder in (made, there):
        with pytest.raises(cli.UserError), cli.no_folder_if_refused(folder):
            (folder / "sub").mkdir(parents=True)
            raise cli.UserError("refused")
    assert not made.exists() and (there / "sub").is_dir()
    with pytest.raises(KeyboardInterrupt), cli.no_folder_if_refused(made):   # Ctrl-C is not a refusal
        made.mkdir()
        raise KeyboardInterrupt
    assert made.is_dir()


def test_eval_data_mistakes_come_first_and_its_flags_are_one_line(assets, tmp_path):
    root, tiny, synth = assets
    out = tmp_path / "ev"
    bad = tmp_path / "test.jsonl"
    rows = [json.loads(ln) for ln in (synth / "eval.jsonl").read_text().splitlines()]
    del rows[0]["question"]
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # a VSI-Bench file needs the depth model by default (offline and not cached here): the row is reported first
    line = one_line(script("eval_pvrbench.py", "--benchmark", f"vsibench={bad}", "--model", tiny, "--out", out,
                           "--depth-cache", tmp_path / "empty-cache"))
    assert "test.jsonl" in line and "question" in line, line
    for extra, phrase in ((("--eta", "0,7"), "decimal point"), (("--lim", "3"), "unrecognized arguments: --lim"),
                          (("--eta", "2"), "outside [0, 1]")):
        line = one_line(script("eval_pvrbench.py", "--benchmark", f"synthetic={synth}", "--model", tiny,
                               "--out", out, *extra))
        assert phrase in line and "parse_eta" not in line, line
    assert not out.exists()


def test_ctrl_c_before_the_first_checkpoint_names_nothing_that_does_not_exist(tmp_path):
    cfg = SimpleNamespace(out=str(tmp_path / "run"), save_every=50)
    hint = runs.resume_hint(cfg, train.RESUME)
    assert hint() == "no checkpoint saved yet (one every 50 steps): rerun the same command to start again"
    ckpt = tmp_path / "run" / "checkpoints" / "rl-0000050"
    ckpt.mkdir(parents=True)
    assert "no checkpoint" in hint()   # (not complete: no COMPLETE marker, no state)
    out = subprocess.run([sys.executable, "-c", "from machinery import cli\ndef main():\n"
                          "    with cli.interrupt_hint(lambda: 'asked when Ctrl-C comes'):\n"
                          "        raise KeyboardInterrupt\ncli.run(main, interrupted='the default')"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 130 and out.stderr.strip() == "interrupted: asked when Ctrl-C comes"


def test_set_booleans_are_strict():
    for text, value in (("true", True), ("1", True), ("On", True), ("false", False), ("0", False), ("NO", False)):
        assert cli.strict_bool(text) is value
    for text in ("ture", "", "2", "yes please"):
        with pytest.raises(ValueError, match="not a boolean"):
            cli.strict_bool(text)
    cfg = train.parse_args(["--set", "gradient_checkpointing=false"])
    assert cfg.gradient_checkpointing is False


def test_every_parser_refuses_abbreviations():
    """Each command line in the project is cli.ArgumentParser (no abbreviations, one-line errors) or, in the
    developer scripts that do not import the machinery, passes allow_abbrev=False."""
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    calls = []
    for name in files:
        src = (ROOT / name).read_text()
        calls += [(name, m.group(0)) for m in re.finditer(r"\bargparse\.ArgumentParser\([^)]*", src)]
    assert calls and all("allow_abbrev=False" in call for _, call in calls), [c for c in calls
                                                                              if "allow_abbrev=False" not in c[1]]
    with pytest.raises(SystemExit):
        cli.ArgumentParser().parse_args(["--x"])
