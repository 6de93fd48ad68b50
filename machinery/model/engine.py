"""Rollouts on a colocated vLLM engine (`--rollout-engine vllm`): one in-process engine per rank, fed the same
frames, frame rate and prompts as the transformers path, its weights replaced by the policy's after every
optimiser step, and a guard that stops the run when the engine does not sample from the trained policy.

How it is wired, and why:
- **One engine per rank** (tensor parallel 1): under torchrun each rank's engine is its own replica, built on the
  trainer's process group with vLLM's `external_launcher` backend (vLLM calls such replicas "external data
  parallel": they never wait for each other while generating). A plain `python train.py` gets a group of one.
- **The engine loads `--model`** (the checkpoint the policy started from; LoRA's base), then `sync` gives it the
  live policy's weights at start, on resume and after every optimiser step (App. G's step rolls out with the
  weights the previous update left). Not vLLM's `load_format="dummy"`: it also randomises state that no checkpoint
  holds, which no weight sync repairs (measured: a dummy-loaded engine's log-probs after a full sync stayed
  0.3-0.7 nats off on video prompts, exact on text ones).
- **LoRA is served as a LoRA** (vLLM's `enable_lora`, a `LoRARequest` on every rollout): the base weights stay as
  loaded, and each sync writes the trained adapter ("default", never the KL's frozen "reference" copy) from its live
  fp32 weights as a peft folder and registers it under a new id. Not merged into the engine's weights: with bf16
  weights around N(0, 0.02), adding an update of 1e-5 leaves ~88% of them unchanged (bf16 keeps 8 significant
  bits), so the engine would keep sampling the old policy while the adapters moved. A 16-bit engine (vLLM's LoRA
  kernels take 16-bit adapters only) gets each fp32 factor as the sum of two bf16 ones at rank 3r
  (`served_adapter`), so an update of 1e-5 survives as well (tests/test_engine_weights.py measures both).
- **Sync is three calls** (`SYNC`): reload the weights (or the adapter), then empty the engine's encoder cache (the
  ViT's outputs of earlier videos) and its prefix cache (KV blocks of earlier prompts). Without the prefix-cache
  reset the next rollouts' log-probs are off by about 0.5 nats, silently; without the encoder-cache reset the engine
  fails at the next video it has seen before (tests/with_vllm/test_engine.py removes each call in turn).
- **The sync guard** (`SyncGuard`): the update's old log-probs of Eq. 7 stay the transformers policy's own, so the
  engine's only matter as the sampler. Each update compares them with the policy's on the trained completions: the
  mean |engine - policy| log-prob per token, from a forward without dropout (LoRA's dropout is on by default; then
  one more forward, in eval mode, without gradient) at temperature 1 on both sides (vLLM's raw log-probs come before
  temperature; its processed ones also carry the vision tokens' bias and top-p). Logged as `engine_logprob_gap`
  (the same on every rank); above `engine_max_gap` on 3 measured steps in a row the run stops in one line.
- **Sleep mode** (CUDA only; vLLM's CPU build refuses it): the engine sleeps (level 1: weights to host memory, KV
  cache dropped) during the update, and wakes for the sync and the rollouts.
- **Process side effects undone**: building an engine seeds every global RNG and replaces `torch.set_num_threads`
  with a no-op; both are put back, so that a resumed run continues with its own random state.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import weakref
from contextlib import contextmanager

import numpy as np
import torch
import torch.distributed as dist

from machinery import cli, distributed, seeds
from machinery.model import parallel, policy

INSTALL = "pip install -r requirements-vllm.txt (docs/USAGE.md, 'Rollouts on vLLM')"


# ----------------------------------------------------------------------------- the policy's weights, by name
def policy_weights(model):
    """(name, full tensor) of a full (not LoRA) policy as its checkpoint names them: DDP unwrapped, FSDP2's shards
    all-gathered one tensor at a time (a collective: every rank iterates in the same order). The tied LM head is
    included (state_dict() has it; named_parameters() does not)."""
    for key, tensor in parallel.unwrap(model).state_dict().items():
        if hasattr(tensor, "full_tensor"):   # an FSDP2 shard (DTensor)
            tensor = tensor.full_tensor()
        yield key, tensor.detach()


# ----------------------------------------------------------------------------- a LoRA policy's adapter, as served
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)   # vLLM's choices of max_lora_rank


def is_lora(model) -> bool:
    return bool(getattr(parallel.unwrap(model), "peft_config", None))


def trained_adapter(model) -> str:
    """The adapter the optimiser trains: peft's "default" (get_peft_model's, policy.load_policy), never another one
    the model holds beside it (the KL's frozen "reference" copy); a model without "default", its active one."""
    model = parallel.unwrap(model)
    return "default" if "default" in model.peft_config else model.active_adapter


def served_rank(model, dtype) -> int:
    """The rank of the served adapter (r; 3r for a 16-bit engine: `served_adapter`)."""
    config = parallel.unwrap(model).peft_config[trained_adapter(model)]
    r = max([config.r, *(getattr(config, "rank_pattern", None) or {}).values()])
    return r * (3 if dtype.itemsize < 4 else 1)


def served_adapter(model, dtype=torch.float32):
    """(adapter_config.json's dict, {tensor name: tensor}) of the trained adapter (`trained_adapter`) as a peft
    folder that vLLM loads for an engine computing in `dtype`: every adapted module's A and s B (peft's scaling s,
    per module, folded into B; the served lora_alpha equals r, so vLLM's scale is 1), no dropout. For a 16-bit
    `dtype` (vLLM's LoRA kernels take adapters in the engine's dtype) each fp32 factor X becomes X_hi + X_lo, two
    16-bit numbers (X_hi = X rounded, X_lo = the rest rounded), served at rank 3r as
    [B_hi B_hi B_lo] [A_hi; A_lo; A_hi] = B A - B_lo A_lo: the fp32 product to about 16 significant bits, so an
    update far below the 16-bit rounding of A or B still reaches the engine. Nothing in the model changes."""
    from peft.tuners.lora import LoraLayer

    model, name = parallel.unwrap(model), trained_adapter(model)
    extra = [n for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n]
    if extra:
        raise cli.UserError(f"--rollout-engine vllm serves a LoRA model's adapter alone, but {extra[0]} (and "
                            f"{len(extra) - 1} more) trains beside it: use --rollout-engine hf")
    split = dtype.itemsize < 4
    tensors, rank = {}, 0
    for module_name, module in model.named_modules():
        if not (isinstance(module, LoraLayer) and name in module.lora_A):
            continue
        a = module.lora_A[name].weight.detach().float()
        b = module.lora_B[name].weight.detach().float() * module.scaling[name]
        if split:
            a_hi, b_hi = a.to(dtype), b.to(dtype)
            a_lo, b_lo = (a - a_hi.float()).to(dtype), (b - b_hi.float()).to(dtype)
            a, b = torch.cat([a_hi, a_lo, a_hi]), torch.cat([b_hi, b_hi, b_lo], dim=1)
        tensors[f"{module_name}.lora_A.weight"] = a.contiguous().cpu()
        tensors[f"{module_name}.lora_B.weight"] = b.contiguous().cpu()
        rank = max(rank, a.shape[0])
    config = model.peft_config[name]
    targets = config.target_modules
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank, "lora_dropout": 0.0,
              "bias": "none", "use_rslora": False, "use_dora": False, "fan_in_fan_out": False,
              "target_modules": sorted(targets) if isinstance(targets, (set, list, tuple)) else targets,
              "base_model_name_or_path": getattr(config, "base_model_name_or_path", None)}
    return config, tensors


def write_adapter(folder, model, dtype):
    """`served_adapter` as a peft adapter folder (adapter_config.json, adapter_model.safetensors)."""
    from safetensors.torch import save_file

    config, tensors = served_adapter(model, dtype)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    return folder


# ----------------------------------------------------------------------------- weight sync (the three calls)
def _reload(engine, model, weights):
    """The policy's weights into the engine: a full model's tensors in place; LoRA's adapter under a new id."""
    if engine.lora_root is None:
        engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
    else:
        engine.load_adapter(model)


def _reset_encoder_cache(engine, model, weights):
    engine.llm.llm_engine.reset_encoder_cache()


def _reset_prefix_cache(engine, model, weights):
    engine.llm.reset_prefix_cache()


SYNC = (_reload, _reset_encoder_cache, _reset_prefix_cache)


# ----------------------------------------------------------------------------- the sync guard
class SyncGuard:
    """Stops a run whose engine does not sample from the trained policy: each step's mean |engine - policy| log-prob
    per completion token (over every rank's trained completions), above `max_gap` on `patience` measured steps in a
    row (a step that trains nothing measures nothing) raises a one-line cli.UserError. `max_gap` <= 0: never
    stops (the gap is still logged)."""

    def __init__(self, max_gap, patience=3):
        self.max_gap, self.patience = float(max_gap), patience
        self.total, self.tokens, self.over = 0.0, 0.0, []

    def add(self, logp, engine_logp, mask):
        """One micro-batch: the policy's and the engine's log-probs of the same completion tokens, [rows, L]."""
        m = mask.to(logp.device).bool()
        diff = logp.detach().float() - engine_logp.to(logp.device).float()
        self.total += float(diff.abs()[m].sum())
        self.tokens += float(m.sum())

    def close_step(self, device) -> float:
        """The step's gap over every rank (a collective; -1: no tokens anywhere), after which the step is checked."""
        total, tokens = distributed.all_sum([self.total, self.tokens], device)
        self.total, self.tokens = 0.0, 0.0
        if tokens == 0:
            return -1.0
        gap = total / tokens
        self.over = self.over + [gap] if 0 < self.max_gap < gap else []
        if len(self.over) >= self.patience:
            raise cli.UserError(
                f"--rollout-engine vllm: the engine's log-probs were {', '.join(f'{g:.3g}' for g in self.over)} nats "
                f"per token off the policy's on {len(self.over)} steps in a row (engine_max_gap {self.max_gap:g}): "
                "the engine is not sampling from the trained policy (a weight sync that did not take effect)")
        return gap


def has_dropout(model) -> bool:
    """Whether a training-mode forward of `model` is random: a dropout module with p > 0 (LoRA's), or a config's
    dropout probability above 0 (attention_dropout...: applied functionally in training mode)."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True

    def positive(d):
        return any(positive(v) if isinstance(v, dict) else
                   (str(k).endswith("dropout") and isinstance(v, (int, float)) and v > 0) for k, v in d.items())
    config = getattr(model, "config", None)
    return positive(config.to_dict()) if config is not None else False


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


DTYPE = None   # the engine's dtype; None: the policy's compute dtype (bf16 on a GPU, float32 on CPU; tests set bf16)


class Engine:
    """A colocated vLLM engine for one rank. `rollout` returns a policy.Rollout like policy.rollout's (same rows,
    same padding and mask), with `engine_logprobs`; `measure` (every micro-batch of the update) and
    `guard.close_step` (after it) check it against the policy; `sync(model)` after every optimiser step."""

    def __init__(self, cfg, model, processor, device, seed):
        try:
            import vllm
        except ImportError:
            raise cli.UserError(f"--rollout-engine vllm: vLLM is not installed here ({INSTALL})") from None
        self.vllm, self.processor, self.cuda = vllm, processor, device.type == "cuda"
        base = policy._generation_model(parallel.unwrap(model))   # (under LoRA, the transformers model)
        self.vision, self.eos, self.pad = policy._token_ids(processor, base)
        self.dtype = DTYPE or policy.compute_dtype(device)
        self.guard, self.dropout = SyncGuard(cfg.engine_max_gap), None
        self.lora_root, self.lora_request, lora = None, None, {}
        if is_lora(model):
            if getattr(parallel.unwrap(model), "is_loaded_in_4bit", False):
                raise cli.UserError("--rollout-engine vllm cannot take 4-bit weights (the engine's base would be "
                                    "the full-precision one): train without --load-in-4bit, or use "
                                    "--rollout-engine hf")
            rank = served_rank(model, self.dtype)
            if rank > LORA_RANKS[-1]:
                raise cli.UserError(f"--rollout-engine vllm: the served adapter's rank {rank} is above vLLM's "
                                    f"largest, {LORA_RANKS[-1]} (a 16-bit engine serves LoRA at 3r)")
            self.lora_root = tempfile.mkdtemp(prefix="rova-engine-lora-")   # (removed with the engine)
            weakref.finalize(self, shutil.rmtree, self.lora_root, True)
            lora = {"enable_lora": True, "max_loras": 1, "max_lora_rank": min(r for r in LORA_RANKS if r >= rank)}
        _process_group(device)
        videos = {} if policy.is_text_model(base) else {"video": 1}
        with _kept_process_state():   # (--model: the checkpoint the policy was loaded from, or LoRA's base)
            self.llm = vllm.LLM(model=cfg.model, dtype=str(self.dtype).removeprefix("torch."), seed=seed,
                                enforce_eager=True, tensor_parallel_size=1,
                                distributed_executor_backend="external_launcher", limit_mm_per_prompt=videos,
                                gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, enable_sleep_mode=self.cuda,
                                max_model_len=cfg.vllm_max_model_len or None, enable_prefix_caching=True,
                                # CPU: a seeded request's generator cannot rewind a chunked prefill's sample
                                enable_chunked_prefill=None if self.cuda else False, **lora)
        self.asleep = False
        self.sync(model)

    def sync(self, model):
        """The policy's current weights into the engine (every rank enters: FSDP2 gathers), then the caches
        emptied: the calls of SYNC, read at each sync (tests/with_vllm leave one out to see the guard stop the run)."""
        self.wake()
        weights = None if self.lora_root else policy_weights(model)
        for call in SYNC:
            call(self, model, weights)
        for _ in weights or ():   # FSDP2: every rank all-gathers every tensor, whatever a call consumed
            pass

    def load_adapter(self, model):
        """LoRA: the trained adapter's current weights into the engine, as a new adapter (id and name: no cache of
        the engine's can hold the previous one's), the previous one removed; rollouts then request it."""
        from vllm.lora.request import LoRARequest

        old = self.lora_request
        n = old.lora_int_id + 1 if old else 1
        folder = write_adapter(os.path.join(self.lora_root, str(n)), model, self.dtype)
        self.lora_request = LoRARequest(f"policy-{n}", n, folder)
        self.llm.llm_engine.add_lora(self.lora_request)
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def measure(self, model, inputs, ids, mask, logp, engine_logp, temperature):
        """The sync check's data from one micro-batch of the update (learner.Learner.backward: every micro-batch,
        stand-ins included): |engine - policy| log-prob of each completion token into `guard`. The policy's side is
        a forward without dropout at temperature 1 (vLLM's raw log-probs: before temperature): the update's own
        `logp` when its forward had neither, else one more forward, in eval mode and without gradient.
        `engine_logp` None: nothing to compare (a stand-in, a later update on the same rollouts); a sharded model
        still runs that forward, as its other ranks do."""
        base = parallel.unwrap(model)
        if self.dropout is None:
            self.dropout = has_dropout(base)
        exact = temperature in (0, 1) and not self.dropout
        if engine_logp is None and (exact or not parallel.is_sharded(base)):
            return
        if not exact:
            training = base.training
            base.eval()
            try:
                with torch.no_grad():
                    logp = policy.token_logprobs(base, policy._to(inputs, policy.model_device(base)), ids, mask)
            finally:
                base.train(training)
                parallel.release(base)
        if engine_logp is not None:
            self.guard.add(logp, engine_logp, mask)

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
                                 use_tqdm=False, lora_request=self.lora_request)
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


def make(cfg, model, processor, device, rank):
    """This rank's engine (--rollout-engine vllm), or None (hf). Every rank builds its engine at once (vLLM's
    process groups are created collectively)."""
    if cfg.rollout_engine == "hf":
        return None
    if cfg.rollout_engine != "vllm":
        raise cli.UserError(f"--rollout-engine {cfg.rollout_engine}: expected hf or vllm")
    return Engine(cfg, model, processor, device, seed=seeds.Seeds(cfg.seed, rank).process)
