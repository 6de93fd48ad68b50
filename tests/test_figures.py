"""The figures docs/ shows in marked blocks are what their scripts print (benchmarks/figures.py): a live block
that differs from its command's output now, or a recorded one that differs from the output saved when it was
measured, fails here with the command that rewrites it."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import figures  # noqa: E402


def test_every_block_shows_what_its_command_prints():
    assert figures.problems() == []


def test_a_hand_edit_of_a_block_is_caught(tmp_path, monkeypatch):
    """A block whose text is not its command's output (a figure typed in, or left from an older run) is
    reported as stale, and --update puts the command's output back."""
    page = tmp_path / "page.md"
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    monkeypatch.setattr(figures, "BLOCKS", {"hello": figures.Block("page.md", ("-c", "print('figure 42')"), True)})
    page.write_text("# a page\n")
    assert figures.problems() == ["page.md: no block hello (python benchmarks/figures.py --update hello)"]
    figures.main(["--update", "hello"])
    assert figures.problems() == [] and "figure 42" in page.read_text()
    page.write_text(page.read_text().replace("figure 42", "figure 41"))
    assert figures.problems() == ["page.md: block hello is stale (python benchmarks/figures.py --update hello)"]
    assert subprocess.run([sys.executable, "benchmarks/figures.py", "--check"], cwd=ROOT).returncode == 0
