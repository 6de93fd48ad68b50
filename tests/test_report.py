"""What a run shows of its RL stage (machinery/training/report.py): Table 12 in miniature per window of steps, from
hand-built log records; and the AUROC of the self-assessment c (runs.auroc) against hand-counted pairs."""
import json

import pytest

from machinery.training import report, runs


def rec(step, samples, selected, discarded, deferred, *, buffer=0, promoted=0, evicted=0, updates=None, clean=0.5,
        pert=0.25):
    return {"stage": "rl", "step": step, "samples": samples, "selected": selected, "discarded": discarded,
            "deferred": deferred, "buffer_size": buffer, "promoted": promoted, "evicted": evicted,
            "updates": step if updates is None else updates, "acc_clean": clean, "acc_perturbed": pert}


def test_windows_count_each_windows_fresh_samples_buffer_traffic_and_updates():
    recs = [rec(1, 4, 2, 1, 1, buffer=1), rec(2, 4, 1, 2, 1, buffer=2, updates=2, pert=0.75),
            rec(3, 4, 0, 4, 0, buffer=2, updates=2, promoted=1, evicted=1),   # nothing selected: no update
            rec(4, 3, 3, 0, 0, buffer=1, updates=3, clean=None)]
    rows = report.windows(recs, size=2)
    assert [w["steps"] for w in rows] == [[1, 2], [3, 4]]
    first, second = rows
    assert (first["samples"], first["rho"], first["discarded"], first["deferred"]) == (8, 3 / 8, 3 / 8, 2 / 8)
    assert (first["buffer"], first["updates"], first["acc_perturbed"]) == (1.5, 2, 0.5)
    assert (second["samples"], second["rho"], second["discarded"]) == (7, 3 / 7, 4 / 7)
    assert (second["promoted"], second["evicted"], second["updates"], second["acc_clean"]) == (1, 1, 1, 0.5)
    assert len(report.windows(recs * 3)) == report.WINDOWS   # 12 records: six windows of two by default


def test_a_resumed_runs_log_keeps_the_last_record_of_each_step(tmp_path):
    lines = [{"stage": "sft", "step": 1}, rec(1, 4, 1, 0, 3), rec(2, 4, 1, 0, 3), rec(2, 4, 4, 0, 0)]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    recs = report.rl_records(tmp_path / "log.jsonl")
    assert [(r["step"], r["selected"]) for r in recs] == [(1, 1), (2, 4)]


def test_show_prints_the_windows_and_writes_the_picture(tmp_path, capsys):
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(rec(k, 4, k % 3, 1, 3 - k % 3)) + "\n"
                                                for k in range(1, 13)))
    rows = report.show(tmp_path, "rova")
    out = capsys.readouterr().out
    assert len(rows) == 6 and "discarded" in out and "rho" in out and out.count("\n") >= 8
    png = (tmp_path / "curriculum.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    report.show(tmp_path, "grpo")
    assert "discarded" not in capsys.readouterr().out   # standard GRPO: no curriculum columns


@pytest.mark.parametrize("scores, right, expected", [
    ([0.9, 0.8, 0.3, 0.1], [1, 0, 1, 0], 3 / 4),      # pairs (right, wrong): 0.9>0.8, 0.9>0.1, 0.3<0.8, 0.3>0.1
    ([0.2, 0.2, 0.2], [1, 0, 1], 0.5),               # a constant c: ties count half
    ([0.1, 0.7, 0.4], [0, 1, 1], 1.0),               # every right answer above every wrong one
    ([0.5, 0.6], [1, 1], None),                      # no wrong answer: undefined
])
def test_auroc_against_hand_counted_pairs(scores, right, expected):
    assert runs.auroc(scores, right) == (pytest.approx(expected) if expected is not None else None)
