"""Embodied-R on PVRBench: eval_pvrbench.py with a text-only reasoner, the semantic-bias filter and key frames.

    python -m extensions.embodied_r.eval --model runs/rova-text/final --perceiver cv     # the text demo's model
    python -m extensions.embodied_r.eval --model runs/embodied-r-rova/final \\
        --perceiver openai:Qwen/Qwen2.5-VL-72B-Instruct --benchmark ...                 # Embodied-R + ROVA
    python -m extensions.embodied_r.eval ... --debias openai:gpt-4o      # drop the MC questions a blind model answers
    python -m extensions.embodied_r.eval ... --frame-sampler keyframes   # Embodied-R's key frames instead of uniform

A text-only LM (Embodied-R's reasoner, `python -m extensions.embodied_r.train`) never sees pixels: each clip,
clean or corrupted, is first turned into text by `--perceiver` (perceive.py; Embodied-R Sec. 2.2), and that text
replaces the video in the prompt. `--debias` is Embodied-R's semantic-bias filter (Sec. 3.1). `--frame-sampler
keyframes` reads Embodied-R's key frames (keyframes.py, Sec. 2.1). Every eval_pvrbench.py flag works here too,
with the same results; main() below is eval_pvrbench's with these added.
"""
from __future__ import annotations

from machinery import cli  # noqa: I001 - first: the OpenMP wait policy before torch loads
import json
import re
from pathlib import Path

from machinery import hub
from machinery.datasets import answers, data
from machinery.eval import chat
import eval_pvrbench as ev
from machinery.eval import evaluation
from extensions.embodied_r import keyframes, perceive


class PerceiverModel(evaluation.HFModel):
    """eval_pvrbench's local model, and for a text-only LM (Embodied-R's reasoner, train.py --policy text)
    `perceiver`'s text of each clip, clean or corrupted, in the video's place (perceive.py; texts cached in
    `perception_cache`, keyed by frame content, question and perceiver)."""

    def __init__(self, path, adapter=None, perceiver="", perception_cache=None, batch_size=8):
        self.perceiver_spec = perceiver
        super().__init__(path, adapter, batch_size)
        self.share_clips = not self.text   # (a text LM reads each question's own perception: batches)
        if self.text:
            self.perceiver = perceive.make_perceiver(perceiver)
            self.cache = perceive.PerceptionCache(perception_cache)

    def check_kind(self, path):
        if self.text and not self.perceiver_spec:
            raise cli.UserError(f"{path} is a text-only LM (Embodied-R's reasoner): give --perceiver "
                                f"({' | '.join(perceive.PERCEIVER_SPECS)}) to turn the videos into text")
        if self.perceiver_spec and not self.text:
            raise cli.UserError(f"--perceiver is for text-only models; {path} is a VLM and sees the videos itself")

    def _texts(self, samples, clips, fps, style, max_new_tokens):
        if not self.text:
            return super()._texts(samples, clips, fps, style, max_new_tokens)
        messages = [perceive.text_messages(data.build_messages(s, style), perceive.perceive(
            c, data.question_text(s), self.perceiver, cache=self.cache)) for s, c in zip(samples, clips)]
        inputs = self.policy.make_inputs(self.processor, messages, None)  # Embodied-R Sec. 2.2: text, no video
        return self.policy.rollout(self.model, self.processor, inputs, n=1, max_new_tokens=max_new_tokens,
                                   do_sample=False).texts


class TextOnly:
    """A text-only answerer for the semantic-bias filter (Embodied-R Sec. 3.1): the question and its
    options with the official short-answer prompt, no video. spec: "openai:MODEL" (OpenAI-compatible
    chat completions through chat.ChatClient, no images) or a local checkpoint (policy.load_policy: a VLM
    given a text-only chat, or a text LM), greedy, 16 new tokens."""

    def __init__(self, spec, base_url=None, retries=5, timeout=120.0):
        self.spec = spec
        if spec.startswith("openai:"):
            self.client = chat.ChatClient(base_url=base_url, model=spec.split(":", 1)[1], max_retries=retries,
                                          timeout=timeout)
            return
        from machinery.model import policy
        self.client, self.policy = None, policy
        self.model, self.processor = policy.load_policy(spec)

    def __call__(self, samples, batch_size=16):
        prompts = [data.build_prompt(s, "official") for s in samples]
        if self.client is not None:
            return [self.client.complete(p, 16) for p in prompts]
        out = []
        for i in range(0, len(prompts), batch_size):
            inputs = self.policy.make_inputs(self.processor, [[{"role": "user", "content": p}]
                                                              for p in prompts[i:i + batch_size]], None)
            out += self.policy.rollout(self.model, self.processor, inputs, n=1, max_new_tokens=16,
                                       do_sample=False).texts
        return out


def debias(sources, answerer, cache_path, name):
    """Embodied-R's semantic-bias filter (Sec. 3.1): drop the multiple-choice questions that a text-only
    model answers correctly without seeing the video (numeric questions are kept: a blind number is not
    "answered"). Answers are appended to `cache_path` (JSONL) as they come, so a rerun asks nothing twice.
    Returns (kept sources, report)."""
    cache_path = Path(cache_path)
    done = {}
    if cache_path.is_file():
        for line in cache_path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[(r["source"], r["id"])] = r["answer"]
    kept, report = {}, {"model": name, "checked": 0, "dropped": 0, "sources": {}}
    for src, samples in sources.items():
        mc = [s for s in samples if s.problem_type == "multiple choice"]
        todo = [s for s in mc if (src, s.id) not in done]
        if todo:
            replies = answerer(todo)
            with open(cache_path, "a") as f:
                for s, a in zip(todo, replies):
                    done[(src, s.id)] = a
                    f.write(json.dumps({"source": src, "id": s.id, "answer": a}) + "\n")
        blind = {s.id for s in mc
                 if done[(src, s.id)] is not None and answers.score_sample(done[(src, s.id)], s) >= 1.0}
        kept[src] = [s for s in samples if s.id not in blind]
        report["sources"][src] = {"checked": len(mc), "dropped": len(blind)}
        report["checked"] += len(mc)
        report["dropped"] += len(blind)
    return kept, report


def add_arguments(ap):
    x = ap.add_argument_group("Embodied-R", "a text-only model through a perceiver, the semantic-bias filter, "
                              "key frames").add_argument
    x("--perceiver", default="", help="a text-only --model (Embodied-R, train.py --policy text) reads this perception "
      "model's text of each video: hf:PATH | openai:MODEL | cv (perceive.py)")
    x("--perception-cache", default="", help="SQLite cache of perception texts (default OUT/perception_cache.sqlite)")
    x("--debias", default="", help="semantic-bias filter (Embodied-R Sec. 3.1): drop the multiple-choice questions "
      "this text-only model (openai:NAME or a local checkpoint) answers correctly without the video")
    x("--frame-sampler", default="uniform", choices=["uniform", "keyframes"], help="uniform (qwen-vl-utils) or "
      "Embodied-R's key frames (at most --frames; keyframes.py)")
    x("--keyframe-eps", type=float, default=0.5, help="overlap threshold of --frame-sampler keyframes")


def check(args, scheme):
    hub.check_hf_flags({"--perceiver": args.perceiver})
    if args.debias and not args.debias.startswith("openai:"):
        hub.model_source(args.debias, what="--debias")


def prepare(args, sources):
    """--debias: the questions a blind model answers dropped; the report goes into results.json."""
    if not args.debias:
        return sources, {"debias": None}
    tag = re.sub(r"[^A-Za-z0-9._+-]+", "_", args.debias).strip("_")
    (Path(args.out) / "debias").mkdir(parents=True, exist_ok=True)
    sources, report = debias(sources, lambda xs: TextOnly(args.debias, args.base_url)(xs),
                             Path(args.out) / "debias" / f"{tag}.jsonl", args.debias)
    print(f"--debias {args.debias}: {report['dropped']} of {report['checked']} multiple-choice questions "
          "answered correctly without the video, dropped", flush=True)
    return sources, {"debias": report}


def run_key(args, spec):
    key = {}
    if args.frame_sampler != "uniform":  # (left out for uniform: earlier runs' stores keep their hash)
        key.update(frame_sampler=args.frame_sampler, keyframe_eps=args.keyframe_eps)
    if args.debias:
        key.update(debias=args.debias)
    if args.perceiver:
        key.update(perceiver=args.perceiver)
    return key


MODELS = {**ev.MODELS, "": lambda args, path: PerceiverModel(
    path, args.adapter or None, args.perceiver,
    args.perception_cache or str(Path(args.out) / "perception_cache.sqlite"), args.batch_size)}


def main(argv=None):
    """eval_pvrbench's main with a text-only model through --perceiver, --debias and key frames."""
    ap = ev.parser()
    add_arguments(ap)
    args = ev.parse_args(argv, ap)
    if args.compare:
        return ev.compare(args.compare, Path(args.out))
    bench = ev.load_benchmark(args)   # the data's mistakes before the model's
    target = None if args.export else ev.resolve_model(args, MODELS)
    if target:
        check(args, target.scheme)
    bench.sources, reports = prepare(args, bench.sources)
    keyed = args.frame_sampler == "keyframes"
    read_kwargs = {"sampler": keyframes.keyframe_sampler(args.keyframe_eps)} if keyed else {}
    return ev.evaluate(args, target, bench, MODELS, reports=reports, read_kwargs=read_kwargs,
                       run_key=run_key(args, target.spec) if target else None)


if __name__ == "__main__":
    cli.run(main, interrupted=ev.INTERRUPTED)
