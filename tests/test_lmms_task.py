"""eval_pvrbench.py --export-lmms-eval: the task folder's files, its videos (the frames a model is shown, bit for
bit), and its scoring: the exported utils.py, aggregated as lmms-eval aggregates (a task's metric by its own
function, a category group by the unweighted mean of its tasks, pvrbench by utils.total), gives eval_pvrbench.py's
figures on the same outputs. A real lmms-eval against a real vLLM server: checks/lmms_eval_check.py (.ci/run)."""
import base64
import http.server
import importlib.util
import json
import random
import sys
import threading

import numpy as np
import pytest
import yaml

import eval_pvrbench as ev
from machinery import video
from machinery.eval import evaluation
from test_eval_pvrbench import FakeVideoServer, assets, cli, outputs  # noqa: F401 - assets: a fixture

OUTPUTS = ("A", "B", "C", "D", " B", "<answer>C</answer>", "B. the second", "3", "three", "", "A\n\nB")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, synthetic_factory):
    root = tmp_path_factory.mktemp("lmms")
    syn = synthetic_factory(n=10, seed=0, num_frames=4, size=56, eval_fraction=1.0)
    argv = ["--benchmark", f"synthetic={syn}", "--frames", "4", "--style", "official", "--limit", "40",
            "--export-lmms-eval", str(root / "task")]
    ev.main(argv)
    return root / "task", ev.parse_args(argv)


def load_yaml(path):
    loader = type("Loader", (yaml.SafeLoader,), {})
    loader.add_constructor("!function", lambda lo, node: f"!function {lo.construct_scalar(node)}")
    return yaml.load(path.read_text(), Loader=loader)


def exported_utils(folder):
    spec = importlib.util.spec_from_file_location("pvrbench_task_utils", folder / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_folder_is_an_lmms_eval_task_with_a_group_per_category(exported):
    folder, _ = exported
    top = load_yaml(folder / "pvrbench.yaml")
    assert top["group"] == "pvrbench" and top["task"][0] == "pvrbench_clean"
    assert top["aggregate_metric_list"] == [{"metric": "pvr_avg", "aggregation": "!function utils.total",
                                             "weight_by_size": False}]
    config = json.loads((folder / "export.json").read_text())
    assert top["task"][1:] == [f"pvrbench_{c}" for c in config["groups_of_avg"]]
    for cat, subs in config["groups_of_avg"].items():
        group = load_yaml(folder / f"pvrbench_{cat}.yaml")
        assert group["task"] == [f"pvrbench_{s}" for s in subs]
        assert group["aggregate_metric_list"][0]["aggregation"] == "mean"
        assert not group["aggregate_metric_list"][0]["weight_by_size"]   # a category: the mean of its subtypes
    assert sum(config["avg_weights"].values()) == pytest.approx(1.0)
    template = load_yaml(folder / "_default_template_yaml")
    assert template["dataset_path"] == "json" and template["test_split"] == "test"
    assert template["generation_kwargs"]["max_new_tokens"] == 16 and template["generation_kwargs"]["until"] == []
    for cond, n in config["docs"].items():
        task = load_yaml(folder / f"pvrbench_{cond}.yaml")
        docs = (folder / task["dataset_kwargs"]["data_files"]["test"]).read_text().splitlines()
        assert len(docs) == n and task["include"] == "_default_template_yaml"
        assert [m["metric"] for m in task["metric_list"]] == ["accuracy"] + ["pvr_avg"] * (cond != "clean")
    assert not (folder.parent / "out").exists()   # no model was loaded


def test_a_docs_video_is_the_clip_eval_pvrbench_shows_bit_for_bit(exported, monkeypatch):
    """The Runner's clip of a (question, condition), as eval_pvrbench.py would give it to a model, against the
    exported video read back."""
    folder, args = exported
    shown = {}

    def generate(self, samples, prompts, clips, fps, style, max_new_tokens):
        for s, c, f in zip(samples, clips, fps):
            shown.setdefault(s.id, []).append((np.array(c), f))
        return [("A", None)] * len(samples)
    monkeypatch.setattr(evaluation.HFModel, "__init__", lambda self, *a, **k: None)
    monkeypatch.setattr(evaluation.HFModel, "generate", generate)
    monkeypatch.setattr(evaluation.HFModel, "share_clips", False, raising=False)
    stand_in = folder.parent / "model"   # (never loaded: HFModel is replaced above)
    stand_in.mkdir(exist_ok=True)
    (stand_in / "config.json").write_text("{}")
    ev.main(["--benchmark", args.benchmark, "--frames", "4", "--style", "official", "--limit", "6", "--model",
             str(stand_in), "--judge", "none", "--out", str(folder.parent / "eval")])
    docs = [json.loads(x) for x in (folder / "docs" / "clean.jsonl").read_text().splitlines()][:6]
    docs += [json.loads(x) for f in sorted((folder / "docs").glob("*.jsonl")) if f.stem != "clean"
             for x in f.read_text().splitlines()]
    checked = 0
    for doc in docs:
        if doc["question_id"] not in shown:
            continue
        frames, _, fps = video.read_clip(folder / doc["video"])
        clips = shown[doc["question_id"]]   # [clean, its subtype]
        want, want_fps = clips[0] if doc["condition"] == "clean" else clips[1]
        assert np.array_equal(frames, want) and fps == pytest.approx(want_fps)
        checked += 1
    assert checked >= 12


def test_the_exported_scoring_gives_eval_pvrbench_figures(exported):
    """Adversarial outputs (tagged, padded, worded, empty, a failed request) scored by the exported utils.py and
    aggregated as lmms-eval does, against eval_pvrbench.summarize on the same outputs."""
    folder, args = exported
    utils = exported_utils(folder)
    sys.modules.pop("pvrbench_task_utils", None)
    rng = random.Random(0)
    config = json.loads((folder / "export.json").read_text())
    items, records = {}, []
    for cond in config["docs"]:
        for line in (folder / "docs" / f"{cond}.jsonl").read_text().splitlines():
            doc = json.loads(line)
            failed = rng.random() < 0.05
            text = ("[LMMS_EVAL_REQUEST_FAILED after 5 retries] timeout" if failed
                    else rng.choice(OUTPUTS + (doc["answer"],) * 4))
            got = utils.process_results(doc, [text])
            assert set(got) == ({"accuracy"} if cond == "clean" else {"accuracy", "pvr_avg"})
            items.setdefault(cond, []).append(got["accuracy"])
            pred, score = (None, None) if failed else ev.answers.read_and_score(
                text, doc["source"], doc["problem_type"], doc["answer"], "official", args.scoring)
            assert got["accuracy"]["score"] == score and got["accuracy"]["filtered_resps"] == pred
            records.append({"condition": cond, "task": doc["task"], "score": score, "response": text,
                            "error": "API: failed" if failed else None, "judge": None})
    ours = ev.summarize({"synthetic": records}, [c for c in config["docs"] if c != "clean"], "official")["pvrbench"]
    task_scores = {c: utils.accuracy(recs) for c, recs in items.items()}
    assert task_scores == pytest.approx(ours["overall"], abs=1e-12)
    for cat, subs in config["groups_of_avg"].items():
        category = ours["accuracy"]["categories"][cat]
        assert np.mean([task_scores[s] for s in subs]) == pytest.approx(category, abs=1e-12)
    shares = [utils.pvr_avg(recs) for c, recs in items.items() if c != "clean"]
    avg = utils.total(shares, [len(r) for r in items.values()], False)   # (lmms-eval's group aggregation call)
    assert avg == pytest.approx(ours["accuracy"]["avg"], abs=1e-12)
    assert 0.2 < ours["accuracy"]["avg"] < 0.9   # some right, some wrong: the comparison can fail


def test_avg_groups_is_what_accuracy_block_averages():
    overall = {"dusk": 0.9, "night": 0.5, "static": 0.2, "fog": 0.4, "rain": 0.6}
    groups = ev.avg_groups(list(overall))
    assert groups == {"lighting": ["dusk", "night"], "occlusion": ["static"], "weather": ["fog", "rain"]}
    assert ev.accuracy_block(overall, list(overall))["avg"] == pytest.approx((0.7 + 0.2 + 0.5) / 3)
    weights = ev.lmms_task.avg_weights(groups)
    assert sum(weights[s] * v for s, v in overall.items()) == pytest.approx((0.7 + 0.2 + 0.5) / 3)


def test_a_served_model_gets_the_clip_as_one_lossless_mp4(assets, tmp_path):
    """--video-format mp4 (what lmms-eval's pass_video_url sends, as a file): one video_url part holding the clip's
    frames exactly, every frame kept, the frame rate the container's."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeVideoServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeVideoServer.requests, FakeVideoServer.refuse = [], None
    args = cli(assets, tmp_path / "out", "--subtypes", "fog", "--limit", "2", "--judge", "none",
               "--video-format", "mp4")
    args[args.index("--model") + 1] = "openai:fake-vlm"
    try:
        ev.main(args + ["--base-url", f"http://127.0.0.1:{server.server_address[1]}/v1"])
    finally:
        server.shutdown()
    assert len(FakeVideoServer.requests) == 4 and outputs(tmp_path / "out")[1]["n_errors"] == 0
    for body in FakeVideoServer.requests:
        parts = body["messages"][0]["content"]
        head, mp4 = parts[0]["video_url"]["url"].split(",", 1)
        assert [p["type"] for p in parts] == ["video_url", "text"] and head == "data:video/mp4;base64"
        assert body["media_io_kwargs"] == {"video": {"num_frames": -1}}   # every frame; the fps: the file's
        (tmp_path / "sent.mp4").write_bytes(base64.b64decode(mp4))
        sent, _, fps = video.read_clip(tmp_path / "sent.mp4")
        assert sent.shape == (4, 56, 56, 3) and fps == pytest.approx(2.0)
