"""Embodied-R's text policy (python -m extensions.embodied_r.train): a tiny text-only LM reasoning over
perception text, its log-probs, the prompt it reads, and training in every mode ("Embodied-R + ROVA" = --mode
rova); its evaluation is test_er_eval.py's."""
import json
import sqlite3

import numpy as np
import pytest
import torch

from machinery.datasets import data
from extensions.embodied_r import perceive
from machinery.model import policy
import train
from extensions.embodied_r import train as er


@pytest.fixture(scope="module")
def assets(tmp_path_factory, tiny_factory, tiny_path, synthetic_factory):
    tiny = tiny_factory("qwen2", extra_texts=perceive.tokenizer_corpus())
    synth = synthetic_factory(n=8, seed=1, num_frames=4, size=56, eval_fraction=0.25)
    return tmp_path_factory.mktemp("text_policy"), tiny, tiny_path, synth


# ----------------------------------------------------------------------------- the model
def test_tiny_text_model_loads_as_a_causal_lm_with_its_tokenizer(assets):
    _, tiny, vlm, _ = assets
    model, tok = policy.load_policy(tiny, dtype=torch.float32)
    assert policy.is_text_model(model) and not hasattr(model, "visual")
    assert policy.tokenizer_of(tok) is tok and tok.padding_side == "left"
    vlm_model, vlm_processor = policy.load_policy(vlm, dtype=torch.float32)
    assert not policy.is_text_model(vlm_model)
    # the perception vocabulary is in the text tokenizer's training corpus: fewer tokens than the VLM's
    line = "Frame 3: After rotate left, Observe: nothing new. Relevant: none"
    assert len(tok(line)["input_ids"]) < len(vlm_processor.tokenizer(line)["input_ids"])
    lora, _ = policy.load_policy(tiny, lora_r=4, dtype=torch.float32)
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("q_proj" in n for n in trainable) and any("down_proj" in n for n in trainable)


def test_text_model_rejects_videos_and_its_log_probs_match_generate(assets):
    from transformers import GenerationConfig

    _, tiny, _, _ = assets
    model, tok = policy.load_policy(tiny, dtype=torch.float32)
    msgs = [[{"role": "user", "content": "Frame 0: Observe: a red tall object on the left\nHow many red objects?"}],
            [{"role": "user", "content": "Which way? A. left B. right"}]]
    with pytest.raises(ValueError, match="cannot take videos"):
        policy.make_inputs(tok, msgs, [np.zeros((2, 8, 8, 3), np.uint8)] * 2)
    inputs = policy.make_inputs(tok, msgs, None)
    assert set(inputs) == {"input_ids", "attention_mask"} and (inputs["attention_mask"][1, 0] == 0)  # left-padded
    rep = policy.repeat_for(model, inputs, 2)
    assert (torch.equal(rep["input_ids"][0], rep["input_ids"][1])
            and torch.equal(rep["input_ids"][2], inputs["input_ids"][1]))
    _, eos, pad = policy._token_ids(tok, model)
    torch.manual_seed(0)
    with torch.no_grad():
        gen = model.generate(**rep, generation_config=GenerationConfig(
            max_new_tokens=12, do_sample=True, top_k=0, eos_token_id=eos, pad_token_id=pad, output_logits=True,
            return_dict_in_generate=True))
    ids = gen.sequences[:, rep["input_ids"].shape[1]:]
    mask = policy.make_completion_mask(ids, eos)
    want = torch.stack(gen.logits, 1).float().log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    got = policy.token_logprobs(model, rep, ids, mask)
    assert (got - want).abs()[mask.bool()].max().item() < 1e-4
    out = policy.rollout(model, tok, inputs, n=3, max_new_tokens=8)
    assert len(out.texts) == 6 and out.completion_ids.shape[0] == 6


def test_text_messages_put_the_perception_where_the_video_was():
    s = data.Sample(id="q1", source="synthetic", video="v.mp4", question="How many red objects?", answer="2",
                    problem_type="regression", options=[], task="object_counting")
    msgs = perceive.text_messages(data.build_messages(s), "Frame 0: Observe: a red cube")
    assert len(msgs) == 1 and isinstance(msgs[0]["content"], str)
    content = msgs[0]["content"]
    assert content.startswith(perceive.OBSERVATIONS_HEADER + "\nFrame 0: Observe: a red cube\n")
    assert content.index("a red cube") < content.index("How many red objects?")
    assert perceive.text_messages([{"role": "user", "content": "plain"}], "x") == [{"role": "user", "content": "plain"}]
    with pytest.raises(ValueError, match="unsupported"):
        perceive.text_messages([{"role": "user", "content": [{"type": "audio"}]}], "x")


# ----------------------------------------------------------------------------- training
def _args(assets, out, *extra):
    root, tiny, _, synth = assets
    return ["--model", str(tiny), "--policy", "text", "--perceiver", "scripted", "--data", str(synth / "train.json"),
            "--out", str(out), "--frames", "4", "--max-pixels", str(56 * 56), "--sft-epochs", "0", "--rl-steps", "2",
            "--batch-size", "2", "--group-size", "2", "--max-new-tokens", "8", "--save-every", "1",
            "--reeval-period", "1", *extra]


def _records(out):
    return [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines() if json.loads(x)["stage"] == "rl"]


def test_embodied_r_plus_rova_perceives_both_branches_and_trains(assets, tmp_path, scripted):
    out = tmp_path / "rova"
    er.main(_args(assets, out, "--mode", "rova", "--set", "assess=accuracy", "--a-min", "0", "--set",
                  "unanswerable_below=0", "--sft-epochs", "0.5", "--sft-batch-size", "2"))   # every sample trained
    recs = _records(out)
    assert [r["step"] for r in recs] == [1, 2]
    assert all(r["sec_perception"] is not None for r in recs) and any(r["selected"] for r in recs)
    assert any(r["loss"] is not None for r in recs)
    # each video of a step is perceived frame by frame (1 + 3 pair calls for 4 frames); the corrupted
    # branch reads differently from the clean one, so the alignment reward compares two real texts
    assert all(len(imgs) in (1, 2) for _, imgs in scripted.calls)
    levels = {round(imgs[0]) for _, imgs in scripted.calls if len(imgs) == 1}
    assert len(levels) > 4  # clean frames and several corruptions of them
    cache = sqlite3.connect(out / "perception_cache.sqlite").execute("select count(*) from replies").fetchone()[0]
    assert cache > 0
    final = policy.load_policy(str(out / "final"))[0]
    assert policy.is_text_model(final)


@pytest.mark.parametrize("mode", ["grpo", "dual"])
def test_other_modes_on_perception_text(assets, tmp_path, scripted, mode):
    out = tmp_path / mode
    er.main(_args(assets, out, "--mode", mode))
    assert [r["step"] for r in _records(out)] == [1, 2]


def test_perception_is_cached_across_runs(assets, tmp_path, scripted):
    out = tmp_path / "cached"
    er.main(_args(assets, out, "--mode", "dual"))
    first = len(scripted.calls)
    assert first > 0
    er.main(_args(assets, out, "--mode", "dual", "--overwrite"))  # a fresh run in the same OUT: same videos
    assert len(scripted.calls) == first  # every text came from OUT/perception_cache.sqlite


def test_policy_and_model_kind_must_agree(assets, tmp_path, scripted):
    root, tiny, vlm, synth = assets
    with pytest.raises(train.cli.UserError, match="is a VLM; this run trains a text-only LM \\(or --policy vlm\\)"):
        er.main(_args(assets, tmp_path / "a", "--model", str(vlm)))
    with pytest.raises(train.cli.UserError, match="is a text-only LM; this run trains a vision-language model$"):
        train.main(["--model", str(tiny), "--data", str(synth / "train.json"), "--out", str(tmp_path / "b"),
                    "--rl-steps", "0", "--sft-epochs", "0"])
    with pytest.raises(SystemExit):  # argparse: --policy text needs --perceiver
        er.parse_args(["--model", str(tiny), "--data", "x.json", "--policy", "text"])
