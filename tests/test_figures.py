"""The figures docs/ shows in marked blocks are what their scripts print (tools/figures.py): a live block
that differs from its command's output now, or a recorded one that differs from the output saved when it was
measured, fails here with the command that rewrites it."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import figures  # noqa: E402


@pytest.mark.slow
def test_every_block_shows_what_its_command_prints():
    assert figures.problems() == []


def test_a_hand_edit_of_a_block_is_caught(tmp_path, monkeypatch):
    """A block whose text is not its command's output (a figure typed in, or left from an older run) is
    reported as stale, and --update puts the command's output back."""
    page = tmp_path / "page.md"
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    monkeypatch.setattr(figures, "BLOCKS", {"hello": figures.Block("page.md", ("-c", "print('figure 42')"), True)})
    page.write_text("# a page\n")
    assert figures.problems() == ["page.md: no block hello (python tools/figures.py --update hello)"]
    figures.main(["--update", "hello"])
    assert figures.problems() == [] and "figure 42" in page.read_text()
    page.write_text(page.read_text().replace("figure 42", "figure 41"))
    assert figures.problems() == ["page.md: block hello is stale (python tools/figures.py --update hello)"]
    assert figures.main(["--check"]) == 1


def test_a_figure_outside_the_blocks_needs_its_date():
    """A measured figure (time, size, rate, ratio, percentage) written by hand is a record of one day: it is
    reported unless a date covers it (its paragraph, the paragraph leading its list or table, a heading);
    settings in code, the paper's own figures and the blocks' output are not measurements of ours."""
    page = "\n".join([
        "# Page",                                                       # 1
        "",
        "The demo took 9 min on 2 cores.",                              # 3: undated
        "",
        "The step took 1.5 s (2026-12-01).",                            # 5: dated itself
        "",
        "Measured on 2026-11-30:",                                      # 7: leads the list and the table
        "- rollouts 2.01x faster",
        "",
        "| run | speed |",
        "| --- | --- |",
        "| a | 12% |",
        "",
        "A later paragraph at 30%.",                                    # 14: a paragraph does not inherit
        "",
        "Settings: `latency=0.2 s`, the paper's drop (Table 2: 45%), a quote \"~10% of its split\", A100-80GB.",
        "",
        "## Older runs (2026-11-29)",
        "",
        "It ran 53 min.",                                               # 20: its heading's date
        "",
        "## Newer",
        "",
        "It ran 40 min.",                                               # 24: the dated heading's section ended
        "",
        "<!-- figures:x -->", "```text", "took 7 s", "```", "<!-- /figures:x -->",
    ])
    assert figures.undated(page) == [(3, "9 min"), (14, "30%"), (24, "40 min")]


def test_a_block_a_script_writes_as_markdown(tmp_path, monkeypatch):
    """A section a script writes into the page itself (reproduce.py's results, between its own marks, not
    fenced) is checked the same way against what the script prints."""
    page = tmp_path / "page.md"
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    monkeypatch.setattr(figures, "BLOCKS", {"results": figures.Block(
        "page.md", ("-c", "print('| a | 0.5 |')"), True, marks=("<!-- r:begin -->", "<!-- r:end -->"), fence=False)})
    page.write_text("# Results\n\n<!-- r:begin -->\n| a | 0.4 |\n<!-- r:end -->\n\nAfter.\n")
    assert figures.problems() == ["page.md: block results is stale (python tools/figures.py --update results)"]
    figures.main(["--update", "results"])
    assert page.read_text() == "# Results\n\n<!-- r:begin -->\n| a | 0.5 |\n<!-- r:end -->\n\nAfter.\n"
    assert figures.problems() == []
