"""eval_pvrbench.py --etas: a severity sweep. The plan (each clip's spec the one-point spec but its intensity, clean
asked once), the statistics against hand-worked values (the clustered SE, the area), end to end on a tiny model
(each intensity scored as a one-point run at that intensity, a rerun that generates nothing), the lmms-eval export
of a sweep, --compare of sweeps, the charts' bars, and one-line refusals of a bad --etas."""
import json

import numpy as np
import pytest

import eval_pvrbench as ev
import perturb
from machinery.datasets import data
from machinery.eval import charts
from test_eval_pvrbench import assets, cli, counted, outputs, run_cli  # noqa: F401 - fixtures
from test_lmms_task import load_yaml

ETAS = "0.3,0.9,0.5"


# ----------------------------------------------------------------------------- statistics by hand

def test_clustered_se_by_hand():
    # scores 1,0 | 1,1: mean .75, deviations .25,-.75 | .25,.25; var/n = (.75/3)/4 = .0625;
    # cross terms: (-.5)^2 - .625 = -.375 and .5^2 - .125 = .125, sum -.25, / n^2 = -.015625
    assert ev.clustered_se([1, 0, 1, 1], ["a", "a", "b", "b"]) == pytest.approx(np.sqrt(0.046875))
    x = [0.2, 1.0, 0.0, 0.7, 1.0]
    assert ev.clustered_se(x, list("abcde")) == pytest.approx(np.std(x, ddof=1) / np.sqrt(5))  # singletons: CLT
    assert ev.clustered_se([1], ["a"]) is None


def test_area_is_the_trapezoid_over_the_grid_divided_by_its_width():
    points = {"0.3": {"accuracy": 0.9}, "0.5": {"accuracy": 0.7}, "0.9": {"accuracy": 0.5}}
    # (.9 + .7) / 2 x .2 + (.7 + .5) / 2 x .4 = .40, over a width of .6
    assert ev.area(points, [0.3, 0.5, 0.9]) == pytest.approx(0.4 / 0.6)
    assert ev.area({**points, "0.5": {"accuracy": None}}, [0.3, 0.5, 0.9]) is None


# ----------------------------------------------------------------------------- the plan

def test_a_sweeps_clips_differ_from_the_one_point_clips_in_their_intensity_only():
    samples = [data.Sample(id=f"q{k}", video=f"v{k % 3}.mp4", question="Q?", options=[], answer="1",
                           problem_type="numerical", task="t", source="synthetic") for k in range(6)]
    subs = ["fog", "night", "static"]
    groups, rows = ev.make_plan({"synthetic": samples}, subs, "cycle", 0.7, etas=(0.3, 0.9))
    one_groups, one_rows = ev.make_plan({"synthetic": samples}, subs, "cycle", 0.7)
    for g, one in zip(groups, one_groups):
        for (s, conds), (_, one_conds) in zip(g.items, one.items):
            assert conds == ["clean", f"{one_conds[1]}@0.3", f"{one_conds[1]}@0.9"]   # clean once, each eta
    one = {(r["video_id"], r["subtype"]): r["spec"] for r in one_rows}
    for r in rows:
        assert r["condition"] == f"{r['subtype']}@{r['spec']['eta']:g}"
        spec = r["spec"]   # the same seed and scene: its regions and trajectory; drawn again at 0.7, the one-point spec
        scene = {k: v for k, v in spec["params"].items() if k in ("scene", "style")}
        again = perturb.PerturbSpec(spec["subtype"], 0.7, spec["seed"], params=scene).to_dict()
        assert again == one[(r["video_id"], r["subtype"])] and spec != again
    assert {r["spec"]["eta"] for r in rows} == {0.3, 0.9}
    assert ev.split_condition("fog@0.3") == ("fog", 0.3) and ev.split_condition("clean") == ("clean", None)


# ----------------------------------------------------------------------------- end to end

def test_a_sweep_scores_each_intensity_as_a_one_point_run_and_a_rerun_generates_nothing(assets, tmp_path, counted):
    out = tmp_path / "sweep"
    ev.main(cli(assets, out, "--etas", ETAS))
    model_dir, res = outputs(out)
    assert counted["n"] == 8 * (1 + 3)   # 8 questions: clean once, their subtype at 3 intensities
    r = res["results"]
    assert r["sweep"]["etas"] == [0.3, 0.5, 0.9] and res["config"]["etas"] == [0.3, 0.5, 0.9]
    assert res["config"]["eta"] is None
    curves = r["curves"]
    assert set(curves) == {"clean", "avg", "lighting", "occlusion", "weather", "fog", "rain", "dusk", "static"}
    for e in ("0.3", "0.5", "0.9"):
        pvr = r["sweep"]["per_eta"][e]["pvrbench"]
        assert curves["avg"][e]["accuracy"] == pvr["accuracy"]["avg"]
        assert curves["weather"][e]["accuracy"] == pvr["accuracy"]["categories"]["weather"]
        assert curves["fog"][e]["accuracy"] == pvr["overall"]["fog"]
        assert curves["avg"][e]["n"] == 8 and sum(curves[s][e]["n"] for s in ("fog", "rain", "dusk", "static")) == 8
        clean = curves["clean"]["accuracy"]
        assert r["relative_robustness"][e] == (pvr["accuracy"]["avg"] / clean if clean else None)
    ys = [curves["avg"][e]["accuracy"] for e in ("0.3", "0.5", "0.9")]
    assert r["auc"]["avg"] == pytest.approx(((ys[0] + ys[1]) * 0.2 + (ys[1] + ys[2]) * 0.4) / 2 / 0.6)
    for name in ("robustness_curves.png", "subtypes.png", "table.md"):
        assert (model_dir / name).is_file()
    table = (model_dir / "table.md").read_text()
    assert table.count("| tiny η=") == 3 and table.count("| Model |") == 1 and "| Avg./Orig. |" in table
    # the intensity 0.3 of the sweep is the one-point run at 0.3: the same clips, answers and figures
    counted["n"] = 0
    ev.main(cli(assets, tmp_path / "point", "--eta", "0.3"))
    point = outputs(tmp_path / "point")[1]["results"]
    assert point["pvrbench"]["overall"] == r["sweep"]["per_eta"]["0.3"]["pvrbench"]["overall"]
    assert point["sources"] == r["sweep"]["per_eta"]["0.3"]["sources"]
    for clips in counted["clips"].values():   # the sweep's 4 clips, then the one-point run's 2
        sweep, once = clips[:4], clips[4:]
        assert len(once) == 2 and len({c.tobytes() for c in sweep}) == 4   # clean and 3 different intensities
        assert all(any(np.array_equal(c, d) for d in sweep) for c in once)
    counted["n"] = 0   # the same sweep again: nothing generated, no new results file
    ev.main(cli(assets, out, "--etas", ETAS))
    assert counted["n"] == 0 and len(list(model_dir.glob("*_results.json"))) == 1
    # --compare of the sweep and the one-point run: a row per intensity, the curves overlaid
    table = ev.main(["--compare", str(next(model_dir.glob("*_results.json"))),
                     str(next((tmp_path / "point" / "tiny").glob("*_results.json"))), "--out", str(tmp_path / "c")])
    assert len([x for x in table.splitlines() if x.startswith("| tiny (") and " η=" in x]) == 3
    assert (tmp_path / "c" / "compare_curves.png").is_file()
    assert (tmp_path / "c" / "compare.png").is_file()


def test_a_sweep_stopped_part_way_resumes_to_the_same_results(assets, tmp_path, counted):
    ev.main(cli(assets, tmp_path / "full", "--etas", ETAS, "--batch-size", "4"))
    full = outputs(tmp_path / "full")[1]["results"]
    counted["n"] = 0
    assert ev.main(cli(assets, tmp_path / "cut", "--etas", ETAS, "--batch-size", "4", "--stop-after", "9")) is None
    done = counted["n"]
    assert 9 <= done < 32 and not list((tmp_path / "cut" / "tiny").glob("*_results.json"))
    ev.main(cli(assets, tmp_path / "cut", "--etas", ETAS, "--batch-size", "4"))
    assert counted["n"] == 32   # each (question, condition) generated once over the two runs
    cut = outputs(tmp_path / "cut")[1]["results"]
    assert cut["curves"] == full["curves"] and cut["sweep"] == full["sweep"]


def test_a_sweep_exports_a_task_group_per_intensity_clustered_by_video(assets, tmp_path):
    folder = tmp_path / "task"
    ev.main(cli(assets, tmp_path / "out", "--etas", "0.3,0.9", "--export-lmms-eval", str(folder)))
    top = load_yaml(folder / "pvrbench.yaml")
    assert top["task"] == ["pvrbench_clean", "pvrbench_eta0p3", "pvrbench_eta0p9"] and "aggregate_metric_list" not in top
    config = json.loads((folder / "export.json").read_text())
    assert config["etas"] == [0.3, 0.9]
    for label in ("0p3", "0p9"):
        group = load_yaml(folder / f"pvrbench_eta{label}.yaml")
        assert group["aggregate_metric_list"][0]["metric"] == "pvr_avg"
        weather = load_yaml(folder / f"pvrbench_eta{label}_weather.yaml")
        assert weather["task"] == [f"pvrbench_fog_eta{label}", f"pvrbench_rain_eta{label}"]
        eta = float(label.replace("p", "."))
        weights = {c: w for c, w in config["avg_weights"].items() if c.endswith(f"@{eta:g}")}
        assert sum(weights.values()) == pytest.approx(1.0)   # each intensity's Avg.
        task = load_yaml(folder / f"pvrbench_fog_eta{label}.yaml")
        rows = [json.loads(x) for x in (folder / task["dataset_kwargs"]["data_files"]["test"]).read_text().splitlines()]
        assert rows and all(row["condition"] == f"fog@{eta:g}" for row in rows)
    assert "cluster_key: video" in (folder / "_default_template_yaml").read_text()
    utils = __import__("test_lmms_task").exported_utils(folder)
    doc = rows[0]
    assert utils.process_results(doc, ["A"])["accuracy"]["video"] == f"{doc['source']}/{doc['video_id']}"


# ----------------------------------------------------------------------------- charts

def test_the_subtype_chart_draws_a_bar_per_value(monkeypatch, tmp_path):
    figures = []
    monkeypatch.setattr(charts, "_save", lambda fig, path: figures.append(fig) or str(path))
    cats = {"lighting": ["dusk", "night"], "weather": ["fog"]}
    series = [("a", {"clean": 0.9, "dusk": 0.5, "night": None, "fog": 0.4, "avg": 0.45}),
              ("b", {"clean": 0.8, "dusk": 0.6, "night": 0.2, "fog": 0.3, "avg": 0.35})]
    charts.subtype_bars(tmp_path / "s.png", cats, series, "t")
    (ax,) = figures[0].axes
    assert [len(c) for c in ax.containers] == [4, 5]   # a's night is missing
    assert [t.get_text() for t in ax.get_xticklabels()] == ["clean", "dusk", "night", "fog", "Avg."]


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("value,expect", [("0.3,x", "'x' is not a number"), ("0.3,1.5", "1.5 is outside [0, 1]"),
                                          ("0.5", "at least two"), ("0.5,0.5", "at least two"),
                                          ("0.3,nan", "outside [0, 1]")])
def test_a_bad_etas_is_one_line_before_any_work(assets, tmp_path, value, expect):
    run = run_cli(*cli(assets, tmp_path / "ev"), "--etas", value)
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert run.returncode == 2 and len(lines) == 1 and "--etas" in lines[0] and expect in lines[0], run.stderr
    assert not (tmp_path / "ev").exists()


def test_eta_and_etas_together_are_refused(assets, tmp_path):
    run = run_cli(*cli(assets, tmp_path / "ev"), "--etas", "0.3,0.5", "--eta", "0.7")
    assert run.returncode == 2 and "give one" in run.stderr and not (tmp_path / "ev").exists()

