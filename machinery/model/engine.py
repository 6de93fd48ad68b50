"""Rollouts on a colocated vLLM engine (`--rollout-engine vllm`): one in-process engine per rank, fed the same
frames, frame rate and prompts as the transformers path, its weights replaced by the policy's after every
optimiser step.

How it is wired, and why:
- **One engine per rank** (tensor parallel 1): under torchrun each rank's engine is its own replica, built on the
  trainer's process group with vLLM's `external_launcher` backend (vLLM calls such replicas "external data
  parallel": they never wait for each other while generating). A plain `python train.py` gets a group of one.
- **The engine loads `--model`** (the checkpoint the policy started from; LoRA's base), then `sync` gives it the
  live policy's weights at start, on resume and after every optimiser step (App. G's step rolls out with the
  weights the previous update left). Not vLLM's `load_format="dummy"`: it also randomises state that no checkpoint
  holds, which no weight sync repairs (measured: a dummy-loaded engine's log-probs after a full sync stayed
  0.3-0.7 nats off on video prompts, exact on text ones). The policy's old log-probs of Eq. 7 stay the
  transformers policy's own, recomputed as on the HF path; vLLM's (taken before temperature) only feed the check
  `engine_logprob_gap` in the step log (exact when the update's forward is deterministic: LoRA's dropout, on by
  default, adds its own noise to it; `--set lora_dropout=0` for an exact check).
- **Sync is three calls** (`SYNC`): reload the weights in place, then empty the engine's encoder cache (the ViT's
  outputs of earlier videos) and its prefix cache (KV blocks of earlier prompts). Without the prefix-cache reset the
  next rollouts' log-probs are off by about 0.5 nats, silently; without the encoder-cache reset the engine fails
  at the next video it has seen before (tests/with_vllm/test_engine.py removes each call in turn).
- **Sleep mode** (CUDA only; vLLM's CPU build refuses it): the engine sleeps (level 1: weights to host memory, KV
  cache dropped) during the update, and wakes for the sync and the rollouts.
- **Process side effects undone**: building an engine seeds every global RNG and replaces `torch.set_num_threads`
  with a no-op; both are put back, so that a resumed run continues with its own random state.
"""
from __future__ import annotations

import os
import random
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist

from machinery import runtime
from machinery.model import parallel, policy

INSTALL = "pip install -r requirements-vllm.txt (docs/USAGE.md, 'Rollouts on vLLM')"


# ----------------------------------------------------------------------------- the policy's weights, by name
def merged_lora_weights(model):
    """(name, tensor) of a peft LoRA model as its base checkpoint names them, each adapted weight with the
    adapter's delta (B A x scaling) added; the adapters themselves left out. Nothing in the model changes."""
    from peft.tuners.lora import LoraLayer

    deltas = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and module.active_adapters and not module.merged:
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
            deltas[f"{name}.base_layer.weight"] = delta
    for key, tensor in model.state_dict().items():
        if "lora_" in key:
            continue
        if key in deltas:
            tensor = tensor + deltas[key].to(tensor.dtype)
        yield key.removeprefix("base_model.model.").replace(".base_layer.", "."), tensor.detach()


def policy_weights(model):
    """(name, full tensor) of the policy as its checkpoint names them: DDP unwrapped, LoRA merged, FSDP2's shards
    all-gathered one tensor at a time (a collective: every rank iterates in the same order). The tied LM head is
    included (state_dict() has it; named_parameters() does not)."""
    model = parallel.unwrap(model)
    if getattr(model, "peft_config", None):
        if getattr(model, "is_loaded_in_4bit", False):
            raise runtime.UserError("--rollout-engine vllm cannot take 4-bit weights (no merged full-precision "
                                    "weights to sync): train without --load-in-4bit, or use --rollout-engine hf")
        yield from merged_lora_weights(model)
        return
    for key, tensor in model.state_dict().items():
        if hasattr(tensor, "full_tensor"):   # an FSDP2 shard (DTensor)
            tensor = tensor.full_tensor()
        yield key, tensor.detach()


# ----------------------------------------------------------------------------- weight sync (the three calls)
def _reload(llm, weights):
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})


def _reset_encoder_cache(llm, weights):
    llm.llm_engine.reset_encoder_cache()


def _reset_prefix_cache(llm, weights):
    llm.reset_prefix_cache()


SYNC = (_reload, _reset_encoder_cache, _reset_prefix_cache)


# ----------------------------------------------------------------------------- the engine
@contextmanager
def _kept_process_state():
    """Every global RNG and torch.set_num_threads as they were before (vLLM's engine resets both)."""
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _process_group(device):
    """The trainer's process group (torchrun's), or a group of one for a plain process (as parallel.shard makes),
    and the env variables vLLM's external launcher reads."""
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)
    os.environ.setdefault("RANK", str(dist.get_rank()))
    os.environ.setdefault("LOCAL_RANK", str(device.index or 0) if device.type == "cuda" else "0")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # the engine in this process (the external launcher's rule)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")   # the trainer's threads stay where they are
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")   # GiB of KV cache on CPU (vLLM's default is 4)


def video_metadata(frames, fps=policy.DEFAULT_FPS):
    """What vLLM needs beside a clip's frames (the same fps as policy.make_inputs: M-RoPE's time axis)."""
    n = len(frames)
    return {"fps": float(fps), "duration": n / float(fps), "total_num_frames": n, "frames_indices": list(range(n)),
            "video_backend": "opencv", "do_sample_frames": False}


@runtime_checkable
class EngineSettings(Protocol):
    """What the rollout engine reads of a run's settings (train.Config's fields of these names)."""
    model: str                           # the checkpoint vLLM loads (then synced to the policy's weights)
    rollout_engine: str                  # hf | vllm
    seed: int                            # the run's seed (runtime.Seeds: each rank's process stream)
    vllm_gpu_memory_utilization: float   # the GPU's share the engine takes
    vllm_max_model_len: int              # its context length (0: the model's)


class Engine:
    """A colocated vLLM engine for one rank. `rollout` returns a policy.Rollout like policy.rollout's (same rows,
    same padding and mask), with `engine_logprobs`; `sync(model)` after every optimiser step."""

    def __init__(self, cfg: EngineSettings, model, processor, device, seed):
        try:
            import vllm
        except ImportError:
            raise runtime.UserError(f"--rollout-engine vllm: vLLM is not installed here ({INSTALL})") from None
        self.vllm, self.processor, self.cuda = vllm, processor, device.type == "cuda"
        base = policy._generation_model(parallel.unwrap(model))   # (under LoRA, the transformers model)
        self.vision, self.eos, self.pad = policy._token_ids(processor, base)
        _process_group(device)
        videos = {} if policy.is_text_model(base) else {"video": 1}
        with _kept_process_state():   # (--model: the checkpoint the policy was loaded from, or LoRA's base)
            self.llm = vllm.LLM(model=cfg.model, dtype=str(policy.compute_dtype(device))
                                .removeprefix("torch."), seed=seed, enforce_eager=True, tensor_parallel_size=1,
                                distributed_executor_backend="external_launcher", limit_mm_per_prompt=videos,
                                gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, enable_sleep_mode=self.cuda,
                                max_model_len=cfg.vllm_max_model_len or None, enable_prefix_caching=True,
                                # CPU: a seeded request's generator cannot rewind a chunked prefill's sample
                                enable_chunked_prefill=None if self.cuda else False)
        self.asleep = False
        self.sync(model)

    def sync(self, model):
        """The policy's current weights into the engine (every rank enters: FSDP2 gathers), then the caches
        emptied: the calls of SYNC, read at each sync (tests/with_vllm leave one out to see the check fail)."""
        self.wake()
        weights = policy_weights(model)
        for call in SYNC:
            call(self.llm, weights)
        for _ in weights:   # FSDP2: every rank all-gathers every tensor, whatever a call consumed
            pass

    def sleep(self):
        """Before the update (CUDA): the engine's weights to host memory, its KV cache dropped."""
        if self.cuda and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self):
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def _params(self, n, max_new_tokens, temperature, top_p):
        greedy = temperature == 0
        return self.vllm.SamplingParams(
            n=n, max_tokens=max_new_tokens, temperature=0.0 if greedy else float(temperature),
            top_p=1.0 if greedy else float(top_p), top_k=0, repetition_penalty=1.0, stop_token_ids=list(self.eos),
            logit_bias={i: -1e9 for i in self.vision}, logprobs=0, skip_special_tokens=True,
            seed=int(torch.randint(2 ** 31 - 1, (1,))))   # from the trainer's RNG: a rerun samples the same

    def rollout(self, model, messages, views, inputs, n, max_new_tokens=64, temperature=1.0, top_p=1.0):
        """G completions (`n`: an int or one count per prompt) of each prompt (chat `messages` with one video
        each, `views` their frames); `inputs`: the same prompts' transformers batch (policy.make_inputs), kept
        for the log-probs of the update."""
        self.wake()
        counts = [n] * len(messages) if isinstance(n, int) else list(n)
        texts = [self.processor.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]
        requests = [{"prompt": t} if v is None else   # (an extension's text policy: no video)
                    {"prompt": t, "multi_modal_data": {"video": (np.asarray(v), video_metadata(v))}}
                    for t, v in zip(texts, views)]
        # (prompt, n) per request, prompt-major; greedy: n requests of 1 each (vLLM samples n > 1 only at random)
        todo = [(i, 1) for i, k in enumerate(counts) for _ in range(k)] if temperature == 0 else \
            [(i, k) for i, k in enumerate(counts) if k > 0]
        outs = self.llm.generate([requests[i] for i, _ in todo],
                                 [self._params(k, max_new_tokens, temperature, top_p) for _, k in todo],
                                 use_tqdm=False)
        rows = [c for out in outs for c in sorted(out.outputs, key=lambda c: c.index)]   # prompt-major
        return self._as_rollout(model, rows, inputs, counts)

    def _as_rollout(self, model, rows, inputs, counts):
        width = max([len(c.token_ids) for c in rows] + [1])
        ids = torch.full((len(rows), width), self.pad, dtype=torch.long)
        logp = torch.zeros(len(rows), width)
        for r, c in enumerate(rows):
            ids[r, :len(c.token_ids)] = torch.as_tensor(c.token_ids, dtype=torch.long)
            for t, (token, step) in enumerate(zip(c.token_ids, c.logprobs or [])):
                logp[r, t] = step[token].logprob
        ids, mask, texts = policy._completions(self.processor, ids, 0, self.eos, self.pad)
        inputs = policy._to(inputs, policy.model_device(model))
        return policy.Rollout(texts=texts, completion_ids=ids, completion_mask=mask, inputs=inputs,
                              index=policy.completion_index(counts, len(counts)), vision=policy.vision_ids(model),
                              engine_logprobs=logp * mask)


def make(cfg: EngineSettings, model, processor, device, rank):
    """This rank's engine (--rollout-engine vllm), or None (hf). Every rank builds its engine at once (vLLM's
    process groups are created collectively)."""
    if cfg.rollout_engine == "hf":
        return None
    if cfg.rollout_engine != "vllm":
        raise runtime.UserError(f"--rollout-engine {cfg.rollout_engine}: expected hf or vllm")
    return Engine(cfg, model, processor, device, seed=runtime.Seeds(cfg.seed, rank).process)


def logprob_gap(logp, engine_logp, mask):
    """The largest |vLLM - transformers| sampled-token log-prob over the unmasked tokens (the sync check)."""
    m = mask.bool()
    return float((logp.detach().float() - engine_logp.to(logp.device).float()).abs()[m].max()) if m.any() else 0.0
