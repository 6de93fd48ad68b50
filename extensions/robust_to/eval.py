"""Robust-TO on PVRBench: eval_pvrbench.py with Robust-TO's orchestrated agent and its five corruptions.

    python -m extensions.robust_to.eval --model Qwen/Qwen2.5-VL-7B-Instruct --protocol robust-to ...  # the direct model
    python -m extensions.robust_to.eval --model robust-to:Qwen/Qwen2.5-VL-7B-Instruct --protocol robust-to \\
        --frames 32 --agent-k 16 ...                                                    # the agent around it
    python -m extensions.robust_to.eval --model robust-to:... --agent-synthesis rules ...   # the tiers applied by code

`--model robust-to:PATH` evaluates orchestrate.Agent around the checkpoint: of the frames read, the k most
reliable and relevant (reliability.select_frames), decomposition, tools, three-tier synthesis; the synthesis is
the response scored. `--protocol robust-to` (corruptions.py: motion_blur, noise, overexposure = glare, static =
occlusion, night = low light) is what --subtypes all means, with a per-corruption table. Every eval_pvrbench.py
flag works here too, with the same results; main() below is eval_pvrbench's with these added.
"""
from __future__ import annotations

from machinery import cli  # noqa: I001 - first: the OpenMP wait policy before torch loads
from pathlib import Path

import eval_pvrbench as ev
from machinery.eval import evaluation
from eval_pvrbench import _d, _f
from extensions.robust_to import corruptions  # noqa: F401 - registers motion_blur, noise, PROTOCOLS["robust-to"]

SCHEME = "robust-to"

# Robust-TO's five corruption types (its Table's columns), as this engine renders them
ROBUST_TO_COLUMNS = (("motion_blur", "Blur"), ("noise", "Noise"), ("overexposure", "Glare"), ("static", "Occl."),
                     ("night", "Low light"))
ROBUST_TO_LEGEND = ("#Fr frames per video. Accuracy (0-1) under Robust-TO's corruptions: Blur motion blur, Noise "
                    "sensor noise, Glare overexposure, Occl. static occluder, Low light night; Avg. their mean (drop "
                    "vs Orig.), Orig. clean videos.\n")


def robust_to_table(name, frames, pvr):
    """One row per model under --protocol robust-to: accuracy per corruption type, their mean and clean."""
    head = "| Model | #Fr | " + " | ".join(lbl for _, lbl in ROBUST_TO_COLUMNS) + " | Avg. | Orig. |\n"
    a, overall = pvr["accuracy"], pvr["overall"]
    cells = [name, str(frames)] + [_f(overall.get(s)) for s, _ in ROBUST_TO_COLUMNS]
    cells += [_f(a["avg"]) + _d(a["drop"]), _f(a["orig"])]
    return head + "|---" * (len(ROBUST_TO_COLUMNS) + 4) + "|\n| " + " | ".join(cells) + " |\n"


class AgentModel(evaluation.HFModel):
    """Robust-TO's orchestrated agent (orchestrate.Agent) around a local checkpoint, `--model robust-to:PATH`:
    of the frames read, the k most reliable and relevant (reliability.select_frames), decomposition,
    tools, three-tier synthesis; the synthesis is the response scored. Errors as HFModel's."""
    failure = "agent failed"
    share_clips = False   # (the agent selects frames per question: batches of --batch-size)

    def __init__(self, path, adapter=None, k=4, synthesis="policy", synthesis_tokens=0):
        from extensions.robust_to import orchestrate
        super().__init__(path, adapter)
        self.agent = orchestrate.Agent(self.model, self.processor, k=k, synthesis=synthesis)
        self.synthesis_tokens = synthesis_tokens

    def _texts(self, samples, clips, fps, style, max_new_tokens):
        self.agent.synthesis_tokens = self.synthesis_tokens or max_new_tokens
        return [t.synthesis for t in self.agent.run(samples, clips)]


def add_arguments(ap):
    x = ap.add_argument_group("Robust-TO", "--model robust-to:PATH (its orchestrated agent, orchestrate.py) and "
                              "--protocol robust-to").add_argument
    x("--agent-k", type=int, default=0, help="--model robust-to:PATH: frames the agent selects of --frames "
      "(default half)")
    x("--agent-synthesis", default="policy", choices=("policy", "rules"), help="--model robust-to:PATH: who "
      "synthesises: the policy (Robust-TO), or the three tier rules applied by code (orchestrate.tiered_answer; "
      "an ablation that measures the tools and tiers alone)")
    x("--synthesis-tokens", type=int, default=0, help="--model robust-to:PATH: new tokens of the agent's synthesis "
      "(default --max-new-tokens; its answer cites the evidence first, so give it more)")


def check(args, scheme):
    if scheme == SCHEME:
        args.agent_k = args.agent_k or max(1, args.frames // 2)


def run_key(args, spec):
    if not spec.startswith(SCHEME + ":"):
        return {}
    key = {"agent_k": args.agent_k}
    if args.agent_synthesis != "policy":  # (left out when default: earlier runs' stores keep their hash)
        key.update(agent_synthesis=args.agent_synthesis)
    if args.synthesis_tokens:
        key.update(synthesis_tokens=args.synthesis_tokens)
    return key


MODELS = {**ev.MODELS, SCHEME: lambda args, path: AgentModel(path, args.adapter or None, args.agent_k,
                                                              args.agent_synthesis, args.synthesis_tokens)}
TABLES = {**ev.TABLES, "robust-to": (robust_to_table, ROBUST_TO_LEGEND)}


def rename(args, scheme, base):
    return f"robust-to-{base}" + ("-rules" if args.agent_synthesis == "rules" else "")


def main(argv=None):
    """eval_pvrbench's main with the agent's model scheme, flags and table."""
    ap = ev.parser()
    add_arguments(ap)
    args = ev.parse_args(argv, ap)
    if args.compare:
        return ev.compare(args.compare, Path(args.out))
    bench = ev.load_benchmark(args)   # the data's mistakes before the model's
    target = None if args.export else ev.resolve_model(args, MODELS, rename)
    if target:
        check(args, target.scheme)
    return ev.evaluate(args, target, bench, MODELS, tables=TABLES,
                       run_key=run_key(args, target.spec) if target else None)


if __name__ == "__main__":
    cli.run(main, interrupted=ev.INTERRUPTED)
