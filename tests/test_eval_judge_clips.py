"""A served judge with --judge-frames is shown each clip it rates, corrupted ones too, including clips that nothing
is generated from in that window: the window asks eval_pvrbench for the judge's clips as well as the model's
(evaluation.Runner.add, Store.unjudged)."""
import http.server
import json
import threading
from pathlib import Path

import pytest

import eval_pvrbench as ev

SUBTYPES = "fog,rain,snow,dusk,night,static,zoom"   # more clips to render than eval_pvrbench's pool has threads


class FakeJudge(http.server.BaseHTTPRequestHandler):
    """A chat-completions judge: the five metrics, and the frames of every request it got."""
    shown = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeJudge.shown.append(tuple(p["image_url"]["url"] for p in body["messages"][0]["content"]
                                     if p["type"] == "image_url"))
        content = '{"fragility": 1, "consistency": 4, "belief": 3, "recovery": 2, "attention": 5}'
        reply = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def setup(tiny_path, synthetic_factory):
    syn = synthetic_factory(n=4, seed=0, num_frames=4, size=56, eval_fraction=1.0)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeJudge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield tiny_path, syn, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def run(setup, out, judged):
    tiny, syn, url = setup
    judge = ["--judge", "openai:fake-judge", "--judge-base-url", url] if judged else ["--judge", "none"]
    ev.main(["--benchmark", f"synthetic={syn}", "--model", str(tiny), "--frames", "4", "--max-new-tokens", "4",
             "--subtypes", SUBTYPES, "--assign", "all", "--limit", "3", "--out", str(out), *judge])
    (samples,) = Path(out).glob("*/run_*/samples_synthetic.jsonl")
    return samples, [json.loads(x) for x in samples.read_text().splitlines()]


def check_shown(rows):
    """Every pair rated once, with 4 frames of its own clip: as many different sets of frames as (video,
    condition) clips rated, clean and under each subtype."""
    rated = {(r["video_id"], r["condition"]) for r in rows}
    assert len(FakeJudge.shown) == len({(r["doc_id"], r["condition"]) for r in rows})
    assert all(len(frames) == 4 for frames in FakeJudge.shown)
    assert len(rated) >= 8 and len(set(FakeJudge.shown)) == len(rated)


def test_a_judge_added_on_a_second_run_rates_without_generating(setup, tmp_path):
    samples, rows = run(setup, tmp_path / "out", judged=False)
    before, FakeJudge.shown = samples.read_bytes(), []
    run(setup, tmp_path / "out", judged=True)
    assert samples.read_bytes() == before   # nothing generated again
    check_shown(rows)


def test_a_clean_answer_generated_on_the_rerun_lets_the_judge_rate_its_corrupted_pairs(setup, tmp_path):
    """A run killed after its corrupted answers were stored but before their clean ones (a served window's requests
    finish in any order): the rerun generates the clean answers, then rates each corrupted pair against them, so
    the judge needs corrupted clips that nothing in that window is generated from."""
    samples, rows = run(setup, tmp_path / "out", judged=False)
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows if r["condition"] != "clean"))
    FakeJudge.shown = []
    _, after = run(setup, tmp_path / "out", judged=True)
    assert sorted(r["condition"] for r in after) == sorted(r["condition"] for r in rows)
    check_shown(after)
