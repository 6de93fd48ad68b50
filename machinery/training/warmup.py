"""The answerability warm-up (ours, for a model that has never seen Fig. 10's question, e.g. the demo's tiny one):
after the task SFT, each training clip clean and under one corruption, the target YES where the SFT model's
greedy answer on that clip is right, NO otherwise, so that the confidence c of Eq. 3 means something. The
stage corrupts the clips and hands them over with Fig. 10's prompt of each (train.answerability_shown)."""
from __future__ import annotations

import json

from machinery import cli, seeds
from machinery.datasets import answers, data
from machinery.model import learner, parallel, policy


class AnswerabilityWarmUp:
    """The warm-up's examples (`labels`: made once after the task SFT by `label`; a resumed run reads them back)
    and their cursor (`saved`: this rank's checkpoint state, which may hold it). The stage shows it each clip, clean
    or corrupted, with Fig. 10's prompt."""

    def __init__(self, run, saved):
        self.run, self.saved, self.cursor = run, saved, None
        self.path = run.out / f"answerability_labels_rank{run.rank}.json"
        self.labels = json.loads(self.path.read_text()) if self.path.is_file() else None
        self.by_id = {s.id: s for s in run.shard}

    def label(self, shown):
        """The warm-up's examples of this rank's shard from `shown`, (sample, spec dict or None, the clip under it)
        for each readable clip, clean and under one corruption: the target YES where the SFT model's greedy answer
        on it is right, NO otherwise (the rule is fixed before anything is measured, on training data only).
        Written to OUT/answerability_labels_rank<r>.json and read back by a resumed run."""
        run, out = self.run, []
        with parallel.gathered(run.model):
            for k in range(0, len(shown), run.cfg.sft_batch_size):
                part = shown[k:k + run.cfg.sft_batch_size]
                inputs = run.observer.inputs(run.processor, [data.build_messages(s) for s, _, _ in part],
                                             [run.observer(s, v) for s, _, v in part])
                texts = policy.rollout(run.model, run.processor, inputs, n=1, max_new_tokens=run.cfg.max_new_tokens,
                                       do_sample=False).texts
                out += [{"id": s.id, "spec": spec, "target": "YES" if answers.score_sample(t, s) >= 0.5 else "NO"}
                        for (s, spec, _), t in zip(part, texts)]
        tmp = self.path.with_suffix(".tmp")   # (written whole or not at all: a kill never leaves half a file)
        tmp.write_text(json.dumps(out))
        tmp.replace(self.path)
        yes = sum(x["target"] == "YES" for x in out)
        cli.log(f"answerability warm-up: {len(out)} examples on rank {run.rank}, {yes} YES / {len(out) - yes} NO")
        self.labels = out

    def batch(self, n):
        """The next n (sample, example) pairs; an example is {id, spec (a dict, or None: the clean clip), target}."""
        if self.cursor is None:
            streams = seeds.Seeds(self.run.cfg.seed, self.run.rank)
            self.cursor = seeds.Cursor(len(self.labels), streams.answerability_order)
            if "answerability_cursor" in self.saved:
                self.cursor.load(self.saved["answerability_cursor"])
        return [(self.by_id[x["id"]], x) for x in (self.labels[i] for i in self.cursor.take(n))]

    def state(self):
        return {"answerability_cursor": self.cursor.state()} if self.cursor is not None else {}

    def step(self, shown, task_batch):
        """One step: -log p(YES or NO | Fig. 10's prompt, the clip) on `shown`, (sample, example, the clip as
        shown, Fig. 10's messages about it) of the next examples (`batch`), and -log p(process + solution | prompt,
        video) on `task_batch` (SFT samples, so that the task is not forgotten: trained alone on YES / NO, the tiny
        model answers nothing else after it). Returns (this rank's mean NLL, its tokens)."""
        run, rows = self.run, []
        for s, x, view, messages in shown:
            rows.append((messages, run.observer(s, view), x["target"]))
        for s in task_batch:
            frames = run.clips.get(s)
            if frames is not None:
                rows.append((data.build_messages(s), run.observer(s, frames), data.sft_target(s)))
        inputs = run.observer.inputs(run.processor, [m for m, _, _ in rows], [v for _, v, _ in rows]) if rows else None
        return learner.sft_backward(run.cfg, run.train_model, run.processor, inputs, [t for _, _, t in rows],
                                    (run.observer, run.shard[0]))
