"""eval_pvrbench.py's per-task bar charts (per_task.png, compare.png): run_files.chart, drawn by
run_files.bar_chart."""
import numpy as np
from PIL import Image

from machinery.eval import run_files


def test_charts_use_their_canvas(tmp_path):
    """The bars of the last task end near the right edge of the picture (they used to fill its left half)."""
    res = {"results": {"sources": {"synthetic": {"per_task": {"clean": {"a": 0.9, "b": 0.8}, "perturbed":
                                                               {"a": 0.5, "b": 0.4}}}}}}
    run_files.chart(tmp_path / "c.png", [res], ["m"])
    img = np.asarray(Image.open(tmp_path / "c.png").convert("RGB")).astype(int)
    coloured = np.where((np.abs(img - img.mean(axis=2, keepdims=True)).sum(axis=2) > 40).any(axis=0))[0]
    assert coloured.max() > 0.8 * img.shape[1]
