"""The stages fit together: synthetic benchmark -> decode -> corrupt -> tiny policy -> rollouts -> scores."""
import numpy as np
import pytest

from machinery.datasets import answers, data

import perturb
from machinery import video
from machinery.model import policy


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return policy.load_policy(tiny_path)


def test_synthetic_clip_through_the_tiny_policy(synthetic_factory, tiny, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, processor = tiny
    synth = synthetic_factory(n=4, seed=2, num_frames=8, size=56)
    samples, missing = data.load_video_r1(synth / "train.json")
    assert not missing and samples
    batch = samples[:2]
    clips = [video.read_frames(s.video, num_frames=8, max_pixels=56 * 56)[0] for s in batch]
    depths = [np.load(synth / "depth" / f"{s.video.rsplit('/', 1)[-1][:-4]}.npy").astype(np.float32) for s in batch]
    corrupted = [perturb.apply(c, perturb.sample_spec(i), d) for i, (c, d) in enumerate(zip(clips, depths))]
    inputs = policy.make_inputs(processor, [data.build_messages(s) for s in batch], corrupted, fps=2.0)
    out = policy.rollout(model, processor, inputs, n=3, max_new_tokens=12)
    assert len(out.texts) == 6 and out.completion_ids.shape[0] == 6
    scores = [answers.score_sample(t, s) for t, s in zip(out.texts, [s for s in batch for _ in range(3)])]
    assert all(0.0 <= x <= 1.0 for x in scores)
    logp = policy.token_logprobs(model, out.prompt_inputs, out.completion_ids, out.completion_mask)
    assert logp.shape == out.completion_ids.shape and bool((logp <= 0).all())
    # the tiny tokenizer was trained on the project's prompts: a prompt is a few hundred tokens, not bytes
    prompt = data.build_prompt(batch[0])
    assert len(processor.tokenizer(prompt).input_ids) < len(prompt) / 3
