"""Robust-TO's orchestration (orchestrate.py): tiers at their thresholds, the evidence record, the
decomposer's parser, routing, the offline tools on synthetic clips with known motion and objects, the
synthesis prompt's rules, and the agent end to end on the tiny model."""
import json

import numpy as np
import pytest

from machinery.datasets import answers, data
from machinery.datasets import synthetic
from extensions.robust_to import corruptions  # noqa: F401 - registers motion_blur, noise, PROTOCOLS["robust-to"]
from extensions.robust_to import orchestrate as orc
from extensions.robust_to.orchestrate import HIGH, LOW, MEDIUM, Evidence, SubQuery, tier


# --------------------------------------------------------------------------- tiers
@pytest.mark.parametrize("conf, dist, want", [
    (0.7, 0.0, HIGH), (0.7, 0.2999, HIGH), (1.0, 0.29, HIGH),       # HIGH: conf >= 0.7 and dist < 0.3
    (0.6999, 0.0, MEDIUM), (0.7, 0.3, MEDIUM), (0.3, 0.5, MEDIUM),   # the boundaries fall out of HIGH
    (0.5, 0.6999, MEDIUM),
    (0.2999, 0.0, LOW), (0.9, 0.7, LOW), (0.0, 1.0, LOW),           # LOW: conf < 0.3 or dist >= 0.7
])
def test_tiers_at_the_thresholds(conf, dist, want):
    assert tier(conf, dist) == want


def test_evidence_record_clips_and_serialises():
    e = Evidence("counter", "how many red objects?", "2 red objects", np.array([3, 5]), 1.4, -0.2)
    assert e.confidence == 1.0 and e.disturbance == 0.0 and e.frame_ids == [3, 5]
    d = e.to_dict()
    assert d["tier"] == HIGH and json.loads(json.dumps(d))["frame_ids"] == [3, 5]


# --------------------------------------------------------------------------- parsing
def test_parse_subqueries_tolerates_fences_prose_and_bad_items():
    reply = ('Sure! Here is the plan:\n```json\n[{"type": "action", "sub_query": "Which way does the camera turn?"},\n'
             ' {"type": "Colour", "query": "How many red objects are visible?"}, "Which object appears first?",\n'
             ' {"type": "action", "sub_query": "which way does the camera turn?"}, 7, {"type": "text"}]\n```')
    subs = orc.parse_subqueries(reply)
    assert [s.query for s in subs] == ["Which way does the camera turn?", "How many red objects are visible?",
                                       "Which object appears first?"]
    assert [s.type for s in subs] == ["action", "attribute", "temporal"]  # unknown "Colour" -> guessed
    assert orc.parse_subqueries(reply, max_subqueries=1) == subs[:1]
    assert orc.parse_subqueries("no json here") == [] and orc.parse_subqueries(None) == []
    assert orc.parse_subqueries("[broken, [\"a real one\"]") == [SubQuery("attribute", "a real one")]
    assert orc.parse_subqueries('[] then ["second list"]') == [SubQuery("attribute", "second list")]


def test_parse_count():
    assert orc.parse_count("3") == 3 and orc.parse_count("It needs two sub-queries.") == 2
    assert orc.parse_count("0 or 100") is None and orc.parse_count("") is None


def test_routing():
    assert orc.route(SubQuery("action", "Which way does the camera turn?")) == "ego_motion"
    assert orc.route(SubQuery("attribute", "How many red objects are there?")) == "counter"
    assert orc.route(SubQuery("spatial", "Which object is closest to the blue cube?")) == "vlm"
    assert orc.route(SubQuery("action", "Which way does the camera turn?"), available={"vlm"}) == "vlm"


# --------------------------------------------------------------------------- tools
def _scene(colours, xs, zs):
    return [{"colour": c, "shape": "pillar", "pos": (x, z)} for c, x, z in zip(colours, xs, zs)]


@pytest.mark.parametrize("yaw, want", [(0.045, "rotate left"), (-0.045, "rotate right"), (0.0, "move forward")])
def test_ego_motion_tool_on_known_turns(yaw, want):
    objects = _scene(["red", "blue", "green"], [-2.0, 1.5, 0.3], [6.0, 8.0, 11.0])
    frames, _, _ = synthetic.render_synthetic(objects, yaw, 0.2, num_frames=8, size=56)
    ids = list(range(8))
    e = orc.ego_motion_tool("Which way does the agent turn?", frames, ids, orc.Context())
    assert e.tool == "ego_motion" and e.prediction.startswith(want) and e.frame_ids == ids
    assert 0.5 < e.confidence <= 1.0
    # the same clip with its frames in random order: the pairs disagree, the confidence falls
    rng = np.random.default_rng(0)
    shuffled = orc.ego_motion_tool("Which way?", frames[rng.permutation(8)], ids, orc.Context())
    assert shuffled.confidence < e.confidence
    assert orc.ego_motion_tool("Which way?", frames[:1], [0], orc.Context()) is None


def test_counter_tool_counts_the_asked_colour():
    objects = _scene(["red", "red", "blue"], [-1.5, 1.5, 0.0], [7.0, 7.0, 10.0])
    frames, _, _ = synthetic.render_synthetic(objects, 0.0, 0.05, num_frames=4, size=112)
    ctx = orc.Context(question="How many red objects appear in the video?", disturbance=np.full(4, 0.1))
    e = orc.counter_tool("How many red objects are visible?", frames, [0, 1, 2, 3], ctx)
    assert e.prediction == "2 red objects" and e.confidence == 1.0 and e.disturbance == pytest.approx(0.1)
    blue = orc.counter_tool("Count the blue ones", frames, [0, 1, 2, 3], ctx)
    assert blue.prediction == "1 blue objects"
    none = orc.counter_tool("How many things?", frames, [0, 1, 2, 3], orc.Context())
    assert none.prediction == "3 coloured objects" and none.confidence == 0.5  # no colour named: halved


def test_a_registered_user_tool_is_routed_by_name(monkeypatch):
    monkeypatch.setitem(orc.TOOLS, "ocr", (lambda q, f, ids, ctx: Evidence("ocr", q, "EXIT", ids, 0.9), ("text",)))
    fn, types = orc.TOOLS["ocr"]
    assert types == ("text",) and fn("read the sign", None, [1], None).prediction == "EXIT"


# --------------------------------------------------------------------------- synthesis prompt
def test_synthesis_prompt_states_the_rules_and_tiers_each_record():
    s = data.Sample(id="q", source="synthetic", video="v.mp4", question="Which action is the agent taking?",
                    answer="A", problem_type="multiple choice", options=["A. Turn left", "B. Turn right"],
                    task="route_planning")
    ev = [Evidence("ego_motion", "Which way?", "rotate left (turn left)", [0, 1, 2], 0.9, 0.1),
          Evidence("vlm", "Which way?", "right", [0, 1, 2], 0.5, 0.1),
          Evidence("counter", "How many red?", "2 red objects", [4], 0.9, 0.8)]
    text = orc.Agent.synthesis_text(None, s, ev)
    for rule in ("Build your answer primarily from HIGH-tier evidence",
                 "only if it is consistent with HIGH-tier conclusions; discard it if contradictory",
                 "only when no HIGH-tier evidence exists, and explicitly note the uncertainty",
                 "If all evidence is LOW-tier, state that the answer is uncertain", "<think>", "<answer>",
                 "single option letter", "A. Turn left"):
        assert rule in text, rule
    assert "Tier: HIGH" in text and "Tier: MEDIUM" in text and "Tier: LOW" in text
    assert text.index("rotate left") < text.index("Tier: HIGH") < text.index("right, Confidence: 0.50")
    assert orc.format_evidence([]) == "(no evidence was collected)"


# --------------------------------------------------------------------------- the confidence-cost reward
OPTS = ["A. Turn left", "B. Turn right", "C. Go ahead"]


def test_confidence_cost_reward_by_hand():
    from extensions.robust_to import rewards as rt_rewards
    ev = [Evidence("ego_motion", "q", "rotate left (turn left)", [0, 1], 0.8, 0.25),
          Evidence("vlm", "q", "turn left, I think", [0], 0.4, 0.5),
          Evidence("vlm", "q", "right", [0], 0.9, 0.0)]
    r = rt_rewards.confidence_cost_reward("<think>x</think><answer>A</answer>", "A", "multiple choice", ev, 3, 1,
                                          options=OPTS)
    # 1 + 0.5 * max(0.8 * 0.75, 0.4 * 0.5) - 0.1 * (3 - 1)
    assert r == pytest.approx({"total": 1 + 0.5 * 0.6 - 0.2, "accuracy": 1.0, "reliability": 0.6,
                               "extra_subqueries": 2})
    # a wrong answer that no evidence states: nothing; fewer sub-queries than expected cost nothing
    r = rt_rewards.confidence_cost_reward("<think>x</think><answer>C</answer>", "A", "multiple choice", ev, 1, 2,
                                          options=OPTS)
    assert r == {"total": 0.0, "accuracy": 0.0, "reliability": 0.0, "extra_subqueries": 0}
    # a wrong answer the evidence states still earns its reliability (the term is additive, not gated)
    r = rt_rewards.confidence_cost_reward("<think>x</think><answer>A</answer>", "B", "multiple choice", ev, 1, None,
                                    options=OPTS, w_rel=1.0)
    assert r["total"] == pytest.approx(0.6) and r["accuracy"] == 0.0
    # numeric: the count in the prediction; dict records work too; no parseable answer -> no support
    num = [{"prediction": "2 red objects", "confidence": 0.5, "disturbance": 0.5}]
    assert rt_rewards.confidence_cost_reward("<answer>2</answer>", "2", "regression", num, 1, 1)["reliability"] == 0.25
    assert rt_rewards.confidence_cost_reward("<answer>3</answer>", "2", "regression", num, 1, 1)["reliability"] == 0.0
    assert rt_rewards.confidence_cost_reward("no answer", "2", "regression", num, 1, 1)["reliability"] == 0.0


def test_supports():
    from extensions.robust_to import rewards as rt_rewards
    assert rt_rewards.supports("rotate right (turn right)", "B", "multiple choice", OPTS)
    assert (rt_rewards.supports("(B)", "B", "multiple choice", OPTS)
            and not rt_rewards.supports("right", "B", "multiple choice", OPTS))
    assert (rt_rewards.supports("about 3.5 m", "3.5", "numerical")
            and not rt_rewards.supports("35 m", "3.5", "numerical"))
    assert (rt_rewards.supports("The sign says EXIT", "exit", "free-form")
            and not rt_rewards.supports("", "exit", "free-form"))


# --------------------------------------------------------------------------- the agent on the tiny model
@pytest.fixture(scope="module")
def tiny(tiny_path, synthetic_factory):
    from machinery.model import policy
    root = synthetic_factory(n=4, seed=3, num_frames=8, size=56, eval_fraction=0.5).parent   # root / "synth"
    model, processor = policy.load_policy(tiny_path)
    return root, tiny_path, model, processor


def _samples(root, n=3):
    from machinery import video
    samples, _ = data.load_vsibench(root / "synth" / "eval.jsonl", root / "synth" / "videos")
    samples = samples[:n]
    return samples, [video.read_frames(s.video, num_frames=8, max_pixels=56 * 56)[0] for s in samples]


def test_agent_end_to_end_with_the_question_as_fallback_sub_query(tiny):
    root, _, model, processor = tiny
    samples, clips = _samples(root)
    traces = orc.Agent(model, processor, k=4, decompose_tokens=8, synthesis_tokens=8).run(samples, clips)
    assert len(traces) == len(samples)
    for t, s in zip(traces, samples):
        assert len(t.frame_ids) == 4 and t.frame_ids == sorted(t.frame_ids)
        assert set(t.profile) >= {"avg_blur", "avg_bright", "avg_occl"}
        assert isinstance(t.synthesis, str) and t.evidence  # the random model's plan never parses: the fallback
        assert t.subqueries[0]["query"] == data.question_text(s)
        for e in t.evidence:
            assert 0.0 <= e.confidence <= 1.0 and e.frame_ids == t.frame_ids and e.tier in (HIGH, MEDIUM, LOW)


def test_agent_routes_a_scripted_plan_to_each_tool(tiny, monkeypatch):
    root, _, model, processor = tiny
    samples, clips = _samples(root, 2)
    agent = orc.Agent(model, processor, k=8, synthesis_tokens=4)
    plan = json.dumps([{"type": "action", "sub_query": "Which way does the camera turn?"},
                       {"type": "attribute", "sub_query": "How many red objects are visible?"},
                       {"type": "spatial", "sub_query": "What is in front of the camera?"}])

    class Scripted:
        texts = [plan] * len(samples)
    monkeypatch.setattr(agent, "decompose", lambda *a, **k: Scripted())
    prompts = []
    real = agent._generate
    monkeypatch.setattr(agent, "_generate", lambda texts, *a, **k: (prompts.extend(texts), real(texts, *a, **k))[1])
    traces = agent.run(samples, clips)
    for t in traces:
        assert [e.tool for e in t.evidence] == ["ego_motion", "counter", "vlm"]
    # the vlm tool's sub-queries went to the policy in one batch, then one synthesis prompt per question
    asked = [p for p in prompts if p.startswith("Look at these frames")]
    assert len(asked) == len(samples) and all("What is in front of the camera?" in p for p in asked)
    synth = [p for p in prompts if p.startswith("Answer the question from the evidence")]
    assert len(synth) == len(samples) and all("Tool: ego_motion" in p and "Tool: counter" in p for p in synth)


def test_agent_with_rule_synthesis_writes_the_tiers_answer_and_cannot_be_sampled(tiny):
    root, _, model, processor = tiny
    samples, clips = _samples(root, 2)
    agent = orc.Agent(model, processor, k=4, decompose_tokens=8, synthesis="rules")
    traces, _, syn = agent._pass(samples, clips, 1, False)
    assert syn is None
    for t, s in zip(traces, samples):
        assert t.synthesis == orc.rule_synthesis(s, t.evidence)
    with pytest.raises(ValueError, match="nothing to sample"):
        agent.sample(samples, clips, 2)
    with pytest.raises(ValueError, match="synthesis must be"):
        orc.Agent(model, processor, synthesis="vote")


def test_vlm_confidence_is_the_geometric_mean_token_probability(tiny):
    from machinery.model import policy
    import torch
    root, _, model, processor = tiny
    _, clips = _samples(root, 1)
    agent = orc.Agent(model, processor, tool_tokens=6)
    (pred, conf), = agent.ask(["What colour is the largest object?"], clips)
    out = agent._generate([orc.VLM_TOOL_PROMPT.format(query="What colour is the largest object?")], clips, 6)
    with torch.no_grad():
        lp = policy.token_logprobs(model, out.prompt_inputs, out.completion_ids, out.completion_mask)
    m = out.completion_mask.bool()
    assert conf == pytest.approx(float(torch.exp(lp[m].mean())), rel=1e-5) and 0.0 < conf <= 1.0


# --------------------------------------------------------------------------- training the agent
@pytest.mark.parametrize("mode", ["grpo-aug", "grpo"])
def test_train_agent_takes_grpo_steps(tiny, tmp_path, mode, monkeypatch):
    from extensions.robust_to import train as rt
    root, path, _, _ = tiny
    budgets, real = [], orc.Agent.synthesize
    monkeypatch.setattr(orc.Agent, "synthesize", lambda self, *a, **k: (budgets.append(self.synthesis_tokens),
                                                                        real(self, *a, **k))[1])
    synthetic.make_synthetic(tmp_path / "synth", n=4, seed=5, num_frames=8, size=56, eval_fraction=0.25)
    out = tmp_path / "run"
    rt.main(["--model", path, "--data", str(tmp_path / "synth" / "train.json"), "--out", str(out), "--mode", mode,
                "--frames", "8", "--agent-k", "4", "--max-pixels", str(56 * 56),
                "--sft-epochs", "1" if mode == "grpo-aug" else "0", "--sft-batch-size", "2", "--rl-steps", "2",
                "--batch-size", "2", "--group-size", "2", "--max-new-tokens", "8", "--save-every", "1",
                "--lr", "1e-3", "--sft-lr", "1e-3", "--synthesis-tokens", "5"])
    assert budgets and set(budgets) == {5}  # the rollouts' synthesis budget, not --max-new-tokens
    recs = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    sft = [r for r in recs if r["stage"] == "sft"]
    assert bool(sft) == (mode == "grpo-aug") and all(r["nll"] > 0 for r in sft)  # the agent's warm-up
    recs = [r for r in recs if r["stage"] == "rl"]
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        assert r["selected"] == r["samples"] > 0 and r["loss"] is not None and r["r_total"] is not None
        assert r["subqueries"] >= 1 and 0 <= r["evidence_high"] <= 1 and r["r_reliability"] is not None
        assert (r["acc_perturbed"] is not None) == (mode == "grpo-aug")
        assert r["sec_estimator"] >= 0 and r["sec_reward"] >= 0
    assert (out / "final").is_dir()


def test_agent_flags_are_checked():
    import train
    from extensions.robust_to import train as rt
    with pytest.raises(SystemExit):
        rt.parse_args(["--mode", "rova"])
    with pytest.raises(SystemExit):  # the agent's flags exist only with the extension
        train.parse_args(["--agent-k", "4"])
    with pytest.raises(SystemExit):
        rt.parse_args(["--synthesis-tokens", "-1"])


def test_agent_warm_up_teaches_the_decomposition_format(tiny, tmp_path):
    """The warm-up's decomposition target is valid JSON that parse_subqueries reads back as the plan."""
    from extensions.robust_to import train as rt
    from machinery import video
    root, _, model, processor = tiny
    samples, _ = data.load_vsibench(root / "synth" / "eval.jsonl", root / "synth" / "videos")

    class Clips:
        def get(self, s):
            return video.read_frames(s.video, num_frames=8, max_pixels=56 * 56)[0]
    agent = orc.Agent(model, processor, k=4)
    cfg = rt.Config(frames=8, max_pixels=56 * 56)
    nll, n = rt.agent_sft_step(cfg, model, processor, samples[:2], Clips(), agent=agent)
    assert n > 4 and nll > 0 and any(p.grad is not None for p in model.parameters())  # n: the target tokens
    model.zero_grad(set_to_none=True)
    q = data.question_text(samples[0])
    target = json.dumps([{"type": orc.guess_type(q), "sub_query": q}])
    assert orc.parse_subqueries(target) == [SubQuery(orc.guess_type(q), " ".join(q.split()))]


def _route_sample(answer="A", process="<think>The view slides right.</think>"):
    return data.Sample(id="q", source="synthetic", video="v.mp4", question="Which action?", answer=answer,
                       problem_type="multiple choice", options=["A. Turn left", "B. Turn right", "C. Go ahead"],
                       task="route_planning", process=process)


def test_warmup_target_cites_the_evidence_the_tiers_say_to_use():
    s = _route_sample()
    high = Evidence("ego_motion", "q", "rotate left (turn left)", [0, 1], 0.9, 0.1)
    med = Evidence("vlm", "q", "right", [0], 0.5, 0.1)
    low = Evidence("counter", "q", "2 red objects", [0], 0.1, 0.9)
    # the tiers reach the ground truth: their reasoning, naming the option
    t = orc.warmup_target(s, [med, high, low])
    assert t == ("<think>Evidence: the ego_motion tool found rotate left (turn left) (HIGH tier, confidence 0.90), "
                 "which supports A.</think>\n<answer>A</answer>")
    # they do not (HIGH evidence for B, ground truth A): the evidence, then the chain of thought
    t = orc.warmup_target(_route_sample("B"), [med, high, low])
    assert t == ("<think>Evidence: the ego_motion tool found rotate left (turn left) (HIGH tier, confidence 0.90). "
                 "The view slides right.</think>\n<answer>B</answer>")
    assert "the vlm tool found right (MEDIUM tier" in orc.warmup_target(s, [med, low])
    assert "all LOW tier, so the answer is uncertain" in orc.warmup_target(s, [low])
    assert "no evidence was collected" in orc.warmup_target(s, [])
    import grpo
    assert grpo.format_reward(t) == 1.0


def test_tiered_answer_applies_the_three_tier_rules():
    s = _route_sample()
    left_hi = Evidence("ego_motion", "q", "rotate left (turn left)", [0], 0.9, 0.1)     # HIGH, weight .81
    right_hi = Evidence("vlm", "q", "turn right", [0], 0.8, 0.2)                       # HIGH, weight .64
    right_med = Evidence("vlm", "q", "turn right", [0], 0.5, 0.1)                      # MEDIUM
    left_med = Evidence("vlm", "q", "I think turn left", [0], 0.6, 0.1)                # MEDIUM, agrees
    ahead_low = Evidence("counter", "q", "go ahead", [0], 0.2, 0.1)                    # LOW
    # rule 1: HIGH decides, weighted by confidence x (1 - disturbance): .81 (A) > .64 (B)
    t = orc.tiered_answer(s, [right_hi, left_hi])
    assert (t.answer, t.tier, t.uncertain, t.used) == ("A", HIGH, False, [left_hi])
    # rule 2: MEDIUM kept when consistent with HIGH, dropped when not; never outvotes HIGH
    t = orc.tiered_answer(s, [right_med, right_med, right_med, left_hi, left_med])
    assert t.answer == "A" and t.used == [left_hi, left_med]
    # no HIGH evidence: MEDIUM decides, LOW is not used while MEDIUM states an answer
    t = orc.tiered_answer(s, [ahead_low, right_med])
    assert (t.answer, t.tier, t.used) == ("B", MEDIUM, [right_med])
    # rules 3-4: LOW only when nothing else states an answer, flagged as uncertain
    unrelated = Evidence("vlm", "q", "a red box", [0], 0.9, 0.1)
    t = orc.tiered_answer(s, [unrelated, ahead_low])
    assert (t.answer, t.tier, t.uncertain) == ("C", LOW, True)
    # nothing states an answer
    assert orc.tiered_answer(s, [unrelated]).answer is None and orc.tiered_answer(s, []).answer is None
    # a tie goes to the first stated
    twin = Evidence("vlm", "q", "turn right", [0], 0.9, 0.1)
    assert orc.tiered_answer(s, [twin, left_hi]).answer == "B"


def test_stated_answers_by_problem_type():
    s = _route_sample()
    assert orc.stated_answers(Evidence("ego_motion", "q", "rotate right (turn right)", [0], 1, 0), s) == ["B"]
    assert orc.stated_answers(Evidence("vlm", "q", "B", [0], 1, 0), s) == ["B"]
    assert orc.stated_answers(Evidence("vlm", "q", "stay", [0], 1, 0), s) == []
    n = data.Sample(id="n", source="synthetic", video="v.mp4", question="How many?", answer="3",
                    problem_type="numerical", options=[], task="object_counting")
    assert orc.stated_answers(Evidence("counter", "q", "3 red objects", [0], 1, 0), n) == ["3"]
    assert orc.stated_answers(Evidence("vlm", "q", "none", [0], 1, 0), n) == []


def test_rule_synthesis_output_is_well_formed_and_scored():
    import grpo
    s = _route_sample()
    low = Evidence("ego_motion", "q", "rotate left (turn left)", [0, 1], 0.2, 0.1)
    t = orc.rule_synthesis(s, [low])
    assert t == ("<think>Evidence: the ego_motion tool found rotate left (turn left) (LOW tier, confidence 0.20), "
                 "which supports A. All of it is LOW tier, so the answer is uncertain.</think>\n<answer>A</answer>")
    assert grpo.format_reward(t) == 1.0 and answers.extract_answer(t, s.source, problem_type=s.problem_type) == "A"
    none = orc.rule_synthesis(s, [])
    assert answers.extract_answer(none, s.source, problem_type=s.problem_type) in (None, "")
