"""seeds.Seeds, the one table of a run's random streams: distinct where they must be, and what the code uses."""
import re
import sys
from pathlib import Path

from machinery import seeds

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import layout_targets  # noqa: E402  (the project's own files: git ls-files)


def test_the_data_orders_of_every_rank_are_distinct_streams():
    for seed in (0, 1, 7):
        orders = [getattr(seeds.Seeds(seed, r), name) for r in range(8) for name in ("sft_order", "rl_order")]
        assert len(set(orders)) == len(orders)
        assert len({seeds.Seeds(seed, r).process for r in range(8)}) == 8
        assert len({tuple(seeds.Seeds(seed, r).rl_specs) for r in range(8)}) == 8


def test_a_clips_jitter_does_not_depend_on_the_rank_and_differs_between_clips():
    a, b = seeds.Seeds(3, 0), seeds.Seeds(3, 5)
    assert a.sft_jitter("clip_1") == b.sft_jitter("clip_1") != a.sft_jitter("clip_2")
    assert seeds.Seeds(4).sft_jitter("clip_1") != a.sft_jitter("clip_1")
    # drawn anew at each showing: keyed by the SFT step as well, still not by the rank
    assert a.sft_jitter("clip_1", 2) == b.sft_jitter("clip_1", 2) != a.sft_jitter("clip_1", 3)
    assert a.sft_jitter("clip_1", 2)[:2] == a.sft_jitter("clip_1")


def test_no_stream_is_seeded_outside_the_table():
    """The seed arithmetic lives in seeds.Seeds only: no `seed * 1000` or hand-made seed list elsewhere."""
    files = [p for p in layout_targets.project_files() if "tests" not in p.parts and p.name != "seeds.py"]
    pattern = re.compile(r"seed \* 1000|\[cfg\.seed, (run\.)?rank")
    assert [str(p.relative_to(layout_targets.ROOT)) for p in files if pattern.search(p.read_text())] == []
