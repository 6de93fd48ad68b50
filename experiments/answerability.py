"""Is the policy's answerability confidence c (Eq. 3, Fig. 10) informative? Held-out questions, each clean and
under one corruption (PVRBench's static protocol, the subtypes in turn), scored two ways by the same model:
c = P(YES) on Fig. 10's prompt (one forward, buffer.answerability) and the greedy answer's score.

    python experiments/answerability.py --model runs/rova/final        # the demo checkpoint, its benchmark
    python experiments/answerability.py --model OUT/final --benchmark runs/rova/synthetic --limit 120

Prints c's spread (mean, std, min, max; App. C.2's verdict rule needs c to cross 0.5 and tau), the share
judged YES, the Pearson correlation of c with the answer's score (all clips, and corrupted clips only), and
the mean c over right and over wrong answers. The last line is
`c_std=<x> c_yes_share=<x> corr=<x> corr_corrupted=<x>`.
"""
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machinery import cli  # noqa: E402,F401 - before torch: the OpenMP wait policy (cli.GOMP_SPINCOUNT)
import numpy as np  # noqa: E402

import buffer  # noqa: E402
from machinery.datasets import answers, data  # noqa: E402
import perturb  # noqa: E402
from machinery import video  # noqa: E402
from machinery.model import policy  # noqa: E402


def pearson(x, y):
    if len(x) < 2 or statistics.pstdev(x) == 0 or statistics.pstdev(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def measure(model, processor, samples, frames, max_pixels, batch_size=16, max_new_tokens=64):
    """[(c, score, corrupted)] for each sample clean and under its subtype (round-robin over Table 8's 12)."""
    views = []
    for k, s in enumerate(samples):
        clip = video.read_frames(s.video, num_frames=frames, max_pixels=max_pixels)[0]
        sub = perturb.SUBTYPES[k % len(perturb.SUBTYPES)]
        views += [(s, clip, False), (s, perturb.apply(clip, perturb.static_spec(data.video_identity(s), sub)), True)]
    out, tok = [], policy.tokenizer_of(processor)
    for i in range(0, len(views), batch_size):
        part = views[i:i + batch_size]
        clips = [v for _, v, _ in part]
        messages = buffer.answerability_messages([data.question_text(s) for s, _, _ in part])
        ask = policy.make_inputs(processor, messages, clips, fps=2.0)
        c = buffer.answerability(model, ask, tok)
        inputs = policy.make_inputs(processor, [data.build_messages(s) for s, _, _ in part], clips, fps=2.0)
        texts = policy.rollout(model, processor, inputs, n=1, max_new_tokens=max_new_tokens, do_sample=False).texts
        out += [(ci, answers.score_sample(t, s), corrupted) for ci, t, (s, _, corrupted) in zip(c, texts, part)]
    return out


def main(argv=None):
    ap = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="runs/rova/final")
    ap.add_argument("--benchmark", default="runs/rova/synthetic", help="a folder with eval.jsonl and videos/ "
                    "(the synthetic benchmark: its held-out questions)")
    ap.add_argument("--limit", type=int, default=120)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--max-pixels", type=int, default=56 * 56)
    args = ap.parse_args(argv)
    folder = Path(args.benchmark)
    samples, _ = data.load_vsibench(folder / "eval.jsonl", folder / "videos")
    model, processor = policy.load_policy(args.model)
    rows = measure(model, processor, samples[:args.limit], args.frames, args.max_pixels)
    c = [r[0] for r in rows]
    right = [r[0] for r in rows if r[1] >= 0.5]
    wrong = [r[0] for r in rows if r[1] < 0.5]
    cor = [r for r in rows if r[2]]
    yes = sum(x >= 0.5 for x in c) / len(c)
    corr, corr_c = pearson(c, [r[1] for r in rows]), pearson([r[0] for r in cor], [r[1] for r in cor])
    print(f"{args.model}: {len(rows)} clips ({len(cor)} corrupted); c mean {statistics.mean(c):.3f}, std "
          f"{statistics.pstdev(c):.3f}, min {min(c):.3f}, max {max(c):.3f}; YES (c >= 0.5) {yes:.2f}; "
          f"mean c on right answers {statistics.mean(right) if right else float('nan'):.3f}, on wrong "
          f"{statistics.mean(wrong) if wrong else float('nan'):.3f}; accuracy clean "
          f"{statistics.mean([r[1] for r in rows if not r[2]]):.3f}, corrupted "
          f"{statistics.mean([r[1] for r in cor]):.3f}")
    print(f"c_std={statistics.pstdev(c):.3f} c_yes_share={yes:.2f} corr={corr:.3f} corr_corrupted={corr_c:.3f}")


if __name__ == "__main__":
    main()
