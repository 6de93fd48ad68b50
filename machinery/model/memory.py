"""Per-GPU memory plan of ROVA training: what one RL step holds, phase by phase, in GiB.

    from machinery.model import memory
    p = memory.plan("qwen2.5-vl-7b", "fsdp", gpus=4)          # App. D's settings: 4 videos x G = 8 per GPU
    p = memory.plan(model.config, "lora", micro_batch_size=4)  # a loaded model's config works as well
    memory.check_fits(p, 80)                                   # raises MemoryPlanError when p["peak"] > 80 GiB

Modes (how the policy is trained; every figure is per GPU):
  fsdp   FSDP2 full fine-tuning on `gpus` GPUs: fp32 master weights, fp32 grads and AdamW states sharded
         (4 + 4 + 8 B/param / N), MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32); each decoder layer
         and vision block its own unit, the root (embeddings, LM head, final norm, patch embed, merger) last;
         the frozen KL reference a second FSDP2 model in bf16 (2 B/param / N).
  ddp    full fine-tuning replicated, no FSDP (train.py before FSDP2): bf16 weights, grads and AdamW states on
         every GPU, the reference a bf16 frozen copy.
  lora   one GPU: bf16 base frozen, LoRA adapters (fp32 weights, grads, AdamW) on the LM's q/k/v/o/gate/up/down;
         the reference is the same model with a second, frozen adapter: the adapters as RL starts (fp32; none
         when RL starts from untrained adapters, where the adapters off are exact).
  qlora  lora on NF4 base weights (double quantisation); peft's prepare_model_for_kbit_training (policy.load_policy)
         upcasts everything else to fp32, so the residual stream, the KV cache and the logits are fp32 too.
  single one process, fp32 everything, gradient checkpointing off, no CUDA overheads: the CPU case that
         benchmarks/memory_plan.py --validate checks the per-layer accounting against (a measured update).

Phases of one RL step (App. G's order): (a) generation: clean + perturbed groups of the rank's videos in one
generate call (shared-prefix rollouts: batch_size x 2 prompts prefilled once, the KV cache copied per completion);
(b) update: micro-batches of completion rows through forward + backward (gradient checkpointing on GPUs), the
reference's no-grad forward per micro-batch between the policy's forward and its backward (train.RL.backward);
(c) the optimizer step. `load` (each rank reads the full model before sharding) is reported, not part of the peak;
the answerability forward (Eq. 3, batch_size rows without grad) is smaller than the generate call and not a phase.

The activation terms count what autograd keeps per token, op by op, for transformers' Qwen2.5-VL code (RMSNorm
keeps its fp32 input copy and the normalised tensor; attention keeps q, k and v after RoPE, with k/v repeated to all
heads because training batches carry a padding mask, and SDPA's output; the gated MLP keeps 3 intermediate
tensors plus the input of down_proj; frozen linears keep nothing). Other Qwen-VL generations reuse the formulas
(approximate). Not modelled: the caching allocator's fragmentation (leave a few GiB of headroom), NCCL buffers
beyond the fixed `overhead_gib`, the math-attention fallback (S^2 scores: use flash or memory-efficient SDPA).
"""
from __future__ import annotations

import functools
import itertools
import json
import math
from dataclasses import asdict, dataclass, fields, replace

from machinery import cli

GIB = 2 ** 30
MODES = ("fsdp", "ddp", "lora", "qlora", "single")
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4-bit codes + 8-bit absmax per 64-block + fp32 absmax per 256 blocks
DROPOUT_MASK_BYTES = 1  # per element: CUDA's native_dropout keeps a bool mask (the CPU path a float one, 4)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # policy.LM_LORA_TARGETS

# Published config.json numbers of huggingface.co/Qwen/Qwen2.5-VL-{3B,7B,32B,72B}-Instruct (vision tower shared by
# all four: 32 blocks of 1280, MLP 3420, window 112, full attention in blocks 7/15/23/31; out_hidden_size = the LM's).
QWEN25_VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, in_channels=3, patch_size=14,
                     spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                     fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2, hidden_act="silu")
PRESETS = {
    "qwen2.5-vl-3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                          num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-vl-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                          num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "qwen2.5-vl-32b": dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
                           num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False),
    "qwen2.5-vl-72b": dict(hidden_size=8192, intermediate_size=29568, num_hidden_layers=80, num_attention_heads=64,
                           num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False),
}


class MemoryPlanError(cli.UserError):
    """The planned peak does not fit the GPU (check_fits): one line from the scripts (cli.run)."""


def preset_config(name: str):
    """The transformers Qwen2_5_VLConfig of a preset (PRESETS), built offline from the published numbers."""
    from transformers import Qwen2_5_VLConfig

    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; one of {', '.join(PRESETS)}")
    text = dict(PRESETS[name])
    tied = text.pop("tie_word_embeddings")
    text.update(hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=128000,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]})
    vision = dict(QWEN25_VISION, out_hidden_size=text["hidden_size"])
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tied)


# ----------------------------------------------------------------------------- the model's shape
@dataclass(frozen=True)
class Shape:
    """What the plan needs of a model: sizes from its config, parameter counts (by FSDP part) from the meta model."""
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    params: int            # all parameters (tied ones once)
    layer_params: int      # the largest decoder layer (an FSDP unit)
    root_params: int       # embeddings, LM head, final norm, patch embed, merger: all but layers and blocks
    lm_linear_params: int  # weights of the decoder layers' nn.Linear modules (NF4 under qlora)
    lora_in_out: int       # sum of in + out features over the LoRA target linears: adapters = r * this
    vision_params: int = 0
    block_params: int = 0  # the largest vision block
    v_depth: int = 0       # 0: a text-only model
    v_hidden: int = 0
    v_intermediate: int = 0
    v_heads: int = 1
    v_gated: bool = True   # Qwen2.5-VL's gated vision MLP (Qwen2-VL / Qwen3-VL: fc1 -> act -> fc2)
    patch: int = 14
    merge: int = 2
    temporal_patch: int = 2


def _config_of(model_config):
    return preset_config(model_config) if isinstance(model_config, str) else model_config


@functools.lru_cache(maxsize=16)
def _count(config_json: str):
    """Parameter counts by part of the model a config describes, instantiated on the meta device (no memory)."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**json.loads(config_json))
    vision = getattr(config, "vision_config", None) is not None
    auto = transformers.AutoModelForImageTextToText if vision else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    layers, blocks, linear, lora = {}, {}, 0, 0
    for name, p in model.named_parameters():
        parts = name.split(".")
        if "visual" in parts and "blocks" in parts:
            key = parts[parts.index("blocks") + 1]
            blocks[key] = blocks.get(key, 0) + p.numel()
        elif "layers" in parts and parts[parts.index("layers") + 1].isdigit():
            key = parts[parts.index("layers") + 1]
            layers[key] = layers.get(key, 0) + p.numel()
    for name, module in model.named_modules():
        parts = name.split(".")
        if isinstance(module, torch.nn.Linear) and "layers" in parts and "visual" not in parts:
            linear += module.weight.numel()
            if parts[-1] in LORA_TARGETS:
                lora += module.in_features + module.out_features
    total = sum(p.numel() for p in model.parameters())
    vis = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    return dict(params=total, layer_params=max(layers.values()), root_params=total - sum(layers.values())
                - sum(blocks.values()), lm_linear_params=linear, lora_in_out=lora, vision_params=vis,
                block_params=max(blocks.values(), default=0))


def count_parameters(model_config) -> dict:
    """Parameter counts by part (params, layer_params, root_params, vision_params, block_params, ...) of a preset
    name or a transformers config, from the model built on the meta device."""
    config = _config_of(model_config)
    return dict(_count(config.to_json_string(use_diff=False)))


def model_shape(model_config) -> Shape:
    """The Shape of a preset name or a transformers config (a composite VLM config or a text-only LM's)."""
    config = _config_of(model_config)
    text = config.get_text_config()
    name = model_config if isinstance(model_config, str) else getattr(config, "_name_or_path", "") or config.model_type
    heads = text.num_attention_heads
    shape = dict(name=name, hidden=text.hidden_size, intermediate=text.intermediate_size,
                 layers=text.num_hidden_layers, heads=heads,
                 kv_heads=getattr(text, "num_key_value_heads", None) or heads,
                 head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads, vocab=text.vocab_size,
                 tied=bool(getattr(config, "tie_word_embeddings", getattr(text, "tie_word_embeddings", False))))
    vc = getattr(config, "vision_config", None)
    if vc is not None:
        width = getattr(vc, "embed_dim", None) or vc.hidden_size  # Qwen2-VL names the ViT width embed_dim
        shape.update(v_depth=vc.depth, v_hidden=width,
                     v_intermediate=getattr(vc, "intermediate_size", None) or int(width * vc.mlp_ratio),
                     v_heads=vc.num_heads, v_gated=config.model_type == "qwen2_5_vl", patch=vc.patch_size,
                     merge=vc.spatial_merge_size, temporal_patch=vc.temporal_patch_size)
    return Shape(**shape, **count_parameters(config))


# ----------------------------------------------------------------------------- settings
@dataclass
class Settings:
    """One RL step's sizes; defaults are App. D's (train.Config)."""
    batch_size: int = 4            # videos per GPU per RL step (Table 14: N = 4 per GPU)
    group_size: int = 8            # G rollouts per video and branch
    temporal_grpo: int = 0         # G~ rollouts on the shuffled video (T-GRPO); 0: off
    branches: int = 2              # clean + perturbed groups in one generate call (1 for --mode grpo / grpo-aug)
    frames: int = 16
    max_pixels: int = 128 * 28 * 28
    text_tokens: int = 120         # the prompt's text (system, question, options, format instruction)
    max_new_tokens: int = 256
    micro_batch_size: int = 8      # completion rows per forward + backward of the update
    lora_r: int = 64
    reference: bool = True         # beta > 0: the frozen reference model is loaded (fsdp, ddp, single)
    reference_root_gathered: bool = False  # fsdp: FSDP2 keeps a root gathered after a forward without backward;
    #                                train.py frees the reference's after each forward (parallel.release)
    gradient_checkpointing: bool | None = None  # None: on in the GPU modes, off in `single`
    overhead_gib: float | None = None           # CUDA context + cuBLAS / NCCL workspaces; None: 1.0 on GPUs, 0 single
    engine_gib: float = 0.0        # --rollout-engine vllm: the engine's share while generating (asleep after); 0: hf


def _settings(mode, settings) -> Settings:
    unknown = set(settings) - {f.name for f in fields(Settings)}
    if unknown:
        raise TypeError(f"unknown settings {sorted(unknown)}; known: {[f.name for f in fields(Settings)]}")
    st = replace(Settings(), **settings)
    if st.gradient_checkpointing is None:
        st.gradient_checkpointing = mode != "single"
    if st.overhead_gib is None:
        st.overhead_gib = 0.0 if mode == "single" else 1.0
    return st


def video_sizes(s: Shape, st: Settings):
    """(ViT patches per video, LM prompt tokens) for `frames` frames of at most `max_pixels` pixels (Qwen's
    processor: temporal_patch_size frames per patch, (patch x merge)^2 pixels per LM token):
    16 frames x 128x28x28 -> 8 x 512 = 4096 patches -> 1024 video tokens, + the text."""
    if not s.v_depth:
        return 0, st.text_tokens
    patches = math.ceil(st.frames / s.temporal_patch) * (st.max_pixels // s.patch ** 2)
    return patches, patches // s.merge ** 2 + st.text_tokens


# ----------------------------------------------------------------------------- bytes per token / patch
def lm_layer_saved(s: Shape, a: int, full: bool, lora_r: int = 0, seq: int = 0) -> int:
    """Bytes autograd keeps per token for one decoder layer (no checkpointing); `a` the activation dtype's bytes,
    `seq` the padded sequence length.

    full (weights trainable): each RMSNorm keeps its fp32 input copy and the normalised tensor ((4 + a) h; in fp32
    the input itself), q/k/v_proj and gate/up_proj their input, down_proj its input (i). Frozen (LoRA): a frozen
    linear keeps nothing, a frozen norm only its fp32 input (4 h). Always: q and k after RoPE, k/v repeated to
    all heads (repeat_kv: training batches have a padding mask), SDPA's output (= o_proj's input), its fp32
    logsumexp and the padding mask SDPA converts to the activation dtype ([S, S] per row, in every layer), the MLP's
    gate output, its activation and up output. LoRA adds per target its input cast to fp32 after dropout (4 B),
    the dropout mask (DROPOUT_MASK_BYTES) and lora_A's output (4 r B).
    """
    h, i = s.hidden, s.intermediate
    kv = h if s.kv_heads != s.heads else s.kv_heads * s.head_dim
    norms = 2 * ((4 + a) * h if full else 4 * h)
    attn = a * (2 * h + 2 * kv + seq) + 4 * s.heads + (a * h if full else 0)
    mlp = 3 * a * i + (a * (h + i) if full else 0)
    adapters = ((4 + DROPOUT_MASK_BYTES) * (6 * h + i) + 4 * lora_r * len(LORA_TARGETS)) if lora_r else 0
    return norms + attn + mlp + adapters


def vision_block_saved(s: Shape, a: int) -> int:
    """Bytes autograd keeps per patch for one trainable vision block: two RMSNorms ((4 + a) h each), the attention's
    normalised input, q and k after RoPE, the fused qkv output (v is a view of it), the per-window outputs and
    proj's input (8 a h), the MLP's input and its 4 (gated) or 2 intermediate tensors."""
    h, i = s.v_hidden, s.v_intermediate
    return 2 * (4 + a) * h + 8 * a * h + a * (h + (4 if s.v_gated else 2) * i)


def merger_saved(s: Shape, a: int) -> int:
    """Bytes per patch the patch merger keeps (its RMSNorm, then three inputs of 4h per merged token = h per patch)."""
    return (4 + a) * s.v_hidden + 3 * a * s.v_hidden


def lm_layer_transient(s: Shape, a: int) -> int:
    """Bytes per token alive at once inside a decoder layer beyond what is kept: the MLP's gate/up/activation and
    the residual + normalised stream (a no-grad forward), or the activation gradients of its backward."""
    return a * (2 * s.hidden + 3 * s.intermediate)


def vision_block_transient(s: Shape, a: int) -> int:
    """As lm_layer_transient for a vision block; its attention upcasts q and k to fp32 for RoPE (~5 fp32 copies)."""
    h, i = s.v_hidden, s.v_intermediate
    return max(a * (2 * h + 3 * i), a * 5 * h + 4 * 5 * h)


def pixel_bytes(s: Shape) -> int:
    """Bytes per patch of pixel_values_videos as the processor makes them (fp32: 3 x temporal x patch^2)."""
    return 4 * 3 * s.temporal_patch * s.patch ** 2


# ----------------------------------------------------------------------------- the plan
@dataclass
class _State:
    """Bytes a mode keeps per GPU for the weights and their training state, and how it computes."""
    weights: float
    grads: float
    optimizer: float
    reference: float
    load: float
    grad_bytes: int        # bytes per parameter of the gradients backward leaves (0: FSDP shards / LoRA's, in base)
    act: int               # activation bytes (2: bf16; 4: fp32)
    full: bool             # every weight trainable (else LoRA adapters only)


def _state(s: Shape, mode: str, n: int, st: Settings) -> _State:
    P = s.params
    ref = st.reference and mode in ("fsdp", "ddp", "single")
    if mode == "fsdp":  # fp32 master / grads / AdamW shards; bf16 reference shards; each rank loads fp32 in full
        load = max(4 * P + 4 * P / n, 4 * P / n + (2 * P + 2 * P / n if ref else 0))
        return _State(4 * P / n, 4 * P / n, 8 * P / n, 2 * P / n if ref else 0, load, 0, 2, True)
    if mode == "ddp":   # train.py without FSDP on a GPU: bf16 weights, grads and AdamW states, bf16 frozen copy
        return _State(2 * P, 2 * P, 4 * P, 2 * P if ref else 0, 2 * P * (2 if ref else 1), 2, 2, True)
    if mode == "single":
        return _State(4 * P, 4 * P, 8 * P, 4 * P if ref else 0, 4 * P * (2 if ref else 1), 4, 4, True)
    A = st.lora_r * s.lora_in_out  # LoRA adapters: fp32 weights, grads, AdamW states
    if mode == "lora":
        base = 2 * P
    else:  # qlora: NF4 decoder linears, everything else upcast to fp32 by prepare_model_for_kbit_training
        base = NF4_BYTES * s.lm_linear_params + 4 * (P - s.lm_linear_params)
    ref_adapter = 4 * A if st.reference else 0   # the KL's reference: a frozen fp32 copy of the adapters after SFT
    return _State(base + 4 * A, 4 * A, 8 * A, ref_adapter, base + 4 * A + ref_adapter, 0, 2 if mode == "lora" else 4,
                  False)


def _generation(s: Shape, w: _State, st: Settings, mode: str) -> dict:
    """(a) One generate call for all the rank's rollouts: the gathered policy (FSDP), the KV cache, and the larger of
    the prefill's transient (the ViT without grad, the prompts' forward, the cache copied per completion) and the
    decode's (the cache at full length, fp32 logits and the sampler's copies, one layer's cache growing by a cat)."""
    patches, prompt = video_sizes(s, st)
    a = w.act
    rows = st.batch_size * (st.branches * st.group_size + st.temporal_grpo)
    prompts = st.batch_size * (st.branches + (1 if st.temporal_grpo else 0))
    kv_token = s.layers * 2 * s.kv_heads * s.head_dim * a  # keys + values of all layers, per token
    kv = rows * (prompt + st.max_new_tokens) * kv_token
    pixels = prompts * patches * pixel_bytes(s)
    vit = prompts * patches * (2 * a * s.v_hidden + vision_block_transient(s, a))
    prefill_lm = prompts * prompt * (2 * a * s.hidden + lm_layer_transient(s, a) + kv_token)
    copy_kv = rows * prompt * kv_token + prompts * prompt * kv_token / s.layers  # batch_select_indices, per layer
    prefill = pixels + max(vit, prefill_lm, copy_kv)
    decode = pixels + kv + rows * s.vocab * 4 * 4 + rows * (prompt + st.max_new_tokens) * kv_token / s.layers
    return dict(rows=rows, prompts=prompts, prompt=prompt, gathered=2 * s.params if mode == "fsdp" else 0, kv=kv,
                transient=max(prefill, decode) - kv)


@dataclass
class _Micro:
    """One micro-batch's sizes and what its forward keeps for backward (bytes)."""
    T: int              # LM tokens (rows padded to prompt + max_new_tokens)
    Pv: int             # ViT patches (each row carries its own video)
    seq: int
    logits: int         # [mb, L+1, V] in the compute dtype, kept; the fp32 log-softmax recomputed row by row
    row_fp32: int       # one row's fp32 [L, V] and its gradient
    layer_saved: int    # what one decoder layer saves for backward without checkpointing
    layer_kept: int     # ... with checkpointing: its input
    head_kept: int      # final norm and LM head inputs, the logits
    block_saved: int
    block_kept: int
    vision_kept: int
    kept: int           # all of it, with the micro-batch's inputs


def _micro(s: Shape, w: _State, st: Settings) -> _Micro:
    patches_per_video, prompt = video_sizes(s, st)
    a, mb, L, h = w.act, st.micro_batch_size, st.max_new_tokens, s.hidden
    seq = prompt + L
    T, Pv = mb * seq, mb * patches_per_video
    gc, vit_grad = st.gradient_checkpointing, w.full and s.v_depth > 0
    logits = mb * (L + 1) * s.vocab * a
    layer_saved = lm_layer_saved(s, a, w.full, 0 if w.full else st.lora_r, seq) * T
    layer_kept = a * h * T if gc else layer_saved    # checkpointing keeps each decoder layer's input
    head_kept = logits + ((4 + a) * h * T + a * h * mb * (L + 1) if w.full else 4 * h * T)  # final norm, lm_head in
    block_saved = vision_block_saved(s, a) * Pv if vit_grad else 0
    block_kept = (a * s.v_hidden * Pv if gc else block_saved) if vit_grad else 0
    vision_kept = Pv * (merger_saved(s, a) + (pixel_bytes(s) // 2 if a < 4 else 0)  # merger, bf16 pixel copy,
                        + 2 * 4 * (s.v_hidden // s.v_heads)) if vit_grad else 0     # fp32 RoPE cos / sin
    prompts = st.batch_size * (st.branches + (1 if st.temporal_grpo else 0))  # the Rollout keeps its prompt batch
    inputs = (Pv + prompts * patches_per_video) * pixel_bytes(s) + mb * seq * seq + 2 * a * s.head_dim * T
    kept = s.layers * layer_kept + s.v_depth * block_kept + head_kept + vision_kept + inputs
    return _Micro(T, Pv, seq, logits, 2 * L * s.vocab * 4, layer_saved, layer_kept, head_kept, block_saved,
                  block_kept, vision_kept, kept)


def _forwards(s: Shape, w: _State, st: Settings, mode: str, m: _Micro, gathered: int) -> tuple:
    """Peaks of the policy's forward and of the reference's no-grad forward (learner.Learner.logprobs runs it between
    the policy's forward and backward)."""
    a, h = w.act, s.hidden
    inputs = m.kept - s.layers * m.layer_kept - s.v_depth * m.block_kept - m.head_kept - m.vision_kept
    nograd_lm = m.T * (2 * a * h + lm_layer_transient(s, a) + a * m.seq)  # + one layer's converted mask
    dequant = 2 * h * s.intermediate if mode == "qlora" else 0          # bitsandbytes' bf16 copy of one NF4 weight
    nograd_vit = m.Pv * (2 * a * s.v_hidden + vision_block_transient(s, a))
    fwd = gathered + max(inputs + s.v_depth * m.block_kept + m.vision_kept + nograd_vit,  # in the ViT
                         m.kept + max(nograd_lm, m.row_fp32))                              # at the LM head
    ref_root = 2 * s.root_params if (mode == "fsdp" and not st.reference_root_gathered) else 0  # else in plan()
    ref = m.kept + gathered + ref_root + max(nograd_lm + dequant, nograd_vit, m.logits + m.row_fp32) \
        if st.reference else 0
    return fwd, ref


def _backward(s: Shape, w: _State, st: Settings, mode: str, m: _Micro, gathered: int, n_micro: int) -> int:
    """Backward walked stage by stage from the LM head down, each stage freeing its kept activations and
    leaving its gradients: (transient while the stage runs, kept bytes it frees, gradient bytes it leaves)."""
    a, fsdp, gc = w.act, mode == "fsdp", st.gradient_checkpointing
    g = w.grad_bytes if n_micro == 1 else 0          # from the 2nd micro-batch on, full grads are in the base
    lm_head = s.vocab * s.hidden
    held = 2 * lm_head if (fsdp and w.full) else 0   # FSDP: the root's bf16 grads wait for the root's backward
    dequant = 2 * s.hidden * s.intermediate if mode == "qlora" else 0
    stages = [(m.logits + m.row_fp32, m.head_kept, lm_head * g + held)]
    for _ in range(s.layers):                        # FSDP: a unit's bf16 grads + their fp32 copy to reduce-scatter
        stages.append(((m.layer_saved if gc else 0) + lm_layer_transient(s, a) * m.T + dequant
                       + (6 * s.layer_params if fsdp else 0), m.layer_kept, s.layer_params * g))
    if w.full and s.v_depth > 0:
        stages.append((2 * a * s.v_hidden * m.Pv, m.Pv * merger_saved(s, a), 0))
        for _ in range(s.v_depth):
            stages.append(((m.block_saved if gc else 0) + vision_block_transient(s, a) * m.Pv
                           + (6 * s.block_params if fsdp else 0), m.block_kept, s.block_params * g))
    if w.full:  # the embedding's dense gradient (accumulated into the tied head's); FSDP reduces the root's last
        bottom = (lm_head * (w.grad_bytes or 2) if s.tied else 0) + (6 * s.root_params - held if fsdp else 0)
        stages.append((bottom, 0, (s.root_params - lm_head) * g))
    live, peak = m.kept + gathered, 0
    for transient, freed, grads in stages:
        peak = max(peak, live + transient)
        live += grads - freed
    return peak


def _update(s: Shape, w: _State, st: Settings, mode: str, n_micro: int) -> dict:
    """(b) One micro-batch: the policy's forward (what it keeps for backward), the reference's no-grad forward,
    then backward. FSDP2 keeps the policy's root unsharded from its forward to its post-backward and gathers 2
    units at a time (the current one and the prefetched one). Returns bytes."""
    m = _micro(s, w, st)
    gathered = 2 * s.root_params + 2 * 2 * s.layer_params if mode == "fsdp" else 0
    fwd, ref = _forwards(s, w, st, mode, m, gathered)
    phases = {"policy forward": fwd, "reference forward": ref,
              "backward": _backward(s, w, st, mode, m, gathered, n_micro)}
    which = max(phases, key=phases.get)
    return dict(tokens=m.T, patches=m.Pv, kept=m.kept, gathered=gathered, which=which, total=phases[which],
                transient=phases[which] - m.kept - gathered)


def plan(model_config, mode: str = "fsdp", gpus: int = 1, **settings) -> dict:
    """Per-GPU memory of ROVA training in GiB, phase by phase; "peak" is the largest phase plus the fixed overhead.

    model_config: a preset name (PRESETS) or a transformers config (a loaded model's `model.config`). mode: one of
    MODES; gpus: the FSDP world size (1 for the other modes). settings: Settings fields (App. D's by default).
    Returns GiB figures: weights, grads, optimizer, reference, overhead, load, gathered, kv_cache, generation,
    activations (kept per micro-batch), update, step, peak; and "peak_phase", "model", "mode", "gpus", "params",
    "rows" (completion rows of the generate call), "micro_batches", "settings", "lines" ((phase, part, GiB) rows).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if gpus < 1 or (mode != "fsdp" and gpus != 1):
        raise ValueError(f"mode {mode!r} on {gpus} GPUs: only fsdp shards over GPUs; the others plan one (gpus=1)")
    s, st = model_shape(model_config), _settings(mode, settings)
    w = _state(s, mode, gpus, st)
    n_micro = max(1, math.ceil(st.batch_size * st.group_size / st.micro_batch_size))
    gen, upd = _generation(s, w, st, mode), _update(s, w, st, mode, n_micro)
    # FSDP2 does not reshard a root after a forward without backward: the reference's root stays gathered
    resident = 2 * s.root_params if (mode == "fsdp" and st.reference and st.reference_root_gathered) else 0
    # gradients are freed after each step (zero_grad(set_to_none=True)): none while generating; in the update
    # FSDP's shards and LoRA's adapter grads are counted from its start, full ones once the 1st micro-batch is done
    base = w.weights + w.optimizer + w.reference + resident
    base_update = base + (w.grads if (w.grad_bytes == 0 or n_micro > 1) else 0)
    # fused AdamW on CUDA makes no temporaries; torch's CPU loop two of the largest parameter's size
    temporaries = 2 * 4 * max(s.vocab * s.hidden, s.hidden * s.intermediate) if mode == "single" else 0
    phases = {"generation": base + gen["gathered"] + (st.engine_gib * GIB or gen["kv"] + gen["transient"]),
              "update": base_update + upd["total"], "step": base + w.grads + temporaries}
    peak_phase = max(phases, key=phases.get)
    gib = {k: v / GIB + st.overhead_gib for k, v in phases.items()}
    out = dict(model=s.name, mode=mode, gpus=gpus, params=s.params, rows=gen["rows"], micro_batches=n_micro,
               weights=w.weights / GIB, grads=w.grads / GIB, optimizer=w.optimizer / GIB,
               reference=w.reference / GIB, reference_root=resident / GIB, overhead=st.overhead_gib,
               load=w.load / GIB + st.overhead_gib, gathered=gen["gathered"] / GIB, kv_cache=gen["kv"] / GIB,
               activations=upd["kept"] / GIB, engine=st.engine_gib, engine_needs=(2 * s.params + gen["kv"]) / GIB,
               **gib, peak=gib[peak_phase], peak_phase=peak_phase, settings=asdict(st))
    out["lines"] = _lines(s, st, gen, upd, out)
    return out


def _generation_lines(gen: dict, p: dict, seq: int) -> list:
    parts = [(f"vLLM engine's share (needs {p['engine_needs']:.1f}: bf16 weights + KV cache of {gen['rows']} rows x "
              f"{seq} tokens; asleep in (b) and (c))", p["engine"])] if p["engine"] else [
        (f"KV cache: {gen['rows']} rows x {seq} tokens", p["kv_cache"]),
        (f"prefill of {gen['prompts']} prompts (ViT no-grad) / decode transients", gen["transient"] / GIB)]
    return [("(a) generation", part, gib) for part, gib in parts]


def _lines(s: Shape, st: Settings, gen: dict, upd: dict, p: dict) -> list:
    """(phase, part, GiB) rows of the plan's table."""
    mode, gpus = p["mode"], p["gpus"]
    dtype = {"fsdp": f"fp32 master, sharded over {gpus}", "ddp": "bf16", "single": "fp32",
             "lora": "bf16 base + fp32 adapters", "qlora": "NF4 decoder linears, the rest fp32, + fp32 adapters"}
    state = [(f"weights ({dtype[mode]})", p["weights"]), ("gradients", p["grads"]),
             ("AdamW exp_avg + exp_avg_sq", p["optimizer"])]
    if p["reference"]:
        kind = {"fsdp": "reference model (bf16 shards)", "lora": "reference adapter (a frozen fp32 copy of the "
                "adapters as RL starts)"}
        state.append((kind.get("lora" if mode == "qlora" else mode, "reference model (a frozen copy)"), p["reference"]))
    if p["reference_root"]:
        state.append(("reference root, left unsharded by FSDP2 after its no-grad forward", p["reference_root"]))
    state.append(("CUDA context, cuBLAS / NCCL workspaces", p["overhead"]))
    seq = gen["prompt"] + st.max_new_tokens
    vit = f", {upd['patches']} ViT patches" if s.v_depth else ""
    rows = [("state", part, gib) for part, gib in state] + [
        ("(a) generation", "policy gathered in bf16 (all units)" if mode == "fsdp" else "gathered weights (none)",
         gen["gathered"] / GIB), *_generation_lines(gen, p, seq),
        ("(a) generation", "phase total", p["generation"]),
        ("(b) update", f"activations kept: {st.micro_batch_size} rows x {seq} tokens{vit}"
         + (" (checkpointed)" if st.gradient_checkpointing else " (no checkpointing)"), p["activations"]),
        ("(b) update", "policy root + 2 gathered units" if mode == "fsdp" else "gathered weights (none)",
         upd["gathered"] / GIB),
        ("(b) update", f"transient, largest at the {upd['which']}", upd["transient"] / GIB),
        ("(b) update", f"phase total (micro-batch 1 of {p['micro_batches']})" if p["micro_batches"] == 1
         else f"phase total (micro-batches of {p['micro_batches']}, gradients accumulated)", p["update"]),
        ("(c) optimizer step", "AdamW on the local shards (fused)" if mode == "fsdp" else "AdamW", p["step"]),
        ("load", "each rank's full fp32 model before sharding" if mode == "fsdp" else "the model as loaded",
         p["load"])]
    return rows


def check_fits(plan_: dict, available_gib: float) -> dict:
    """Raise MemoryPlanError naming the planned peak and the GPU's memory when the plan does not fit; else return
    the plan (train.py calls this on CUDA before loading, to fail in one line rather than run out mid-step)."""
    if plan_.get("engine") and plan_["engine_needs"] > plan_["engine"]:
        raise MemoryPlanError(f"the vLLM engine needs {plan_['engine_needs']:.1f} GiB (bf16 weights + the KV cache of "
                              f"{plan_['rows']} rollouts); --set vllm_gpu_memory_utilization gives it "
                              f"{plan_['engine']:.1f} GiB: raise it")
    if plan_["peak"] > available_gib:
        raise MemoryPlanError(
            f"planned peak {plan_['peak']:.1f} GiB per GPU ({plan_['peak_phase']} phase; mode {plan_['mode']} on "
            f"{plan_['gpus']} GPU(s)) exceeds the {available_gib:.1f} GiB available: lower --micro-batch-size or "
            f"--batch-size, shard over more GPUs, or train LoRA / QLoRA (python benchmarks/memory_plan.py)")
    return plan_


def largest_micro_batch(model_config, mode, gpus, available_gib, **settings):
    """The largest power-of-two micro-batch (up to batch_size x group_size rows) whose plan fits, or None."""
    st = _settings(mode, settings)
    best, mb = None, 1
    while mb <= st.batch_size * st.group_size:
        if plan(model_config, mode, gpus, **{**settings, "micro_batch_size": mb})["peak"] <= available_gib:
            best = mb
        mb *= 2
    return best


def format_plan(p: dict, gpu_gib: float | None = None) -> str:
    """The plan as a table: one row per part, grouped by phase, then the peak."""
    st = p["settings"]
    head = (f"{p['model']}: {p['params'] / 1e9:.3f} B params, mode {p['mode']} on {p['gpus']} GPU(s); "
            f"{st['batch_size']} videos x {st['branches']} x G={st['group_size']}"
            + (f" + G~={st['temporal_grpo']}" if st["temporal_grpo"] else "")
            + f" rollouts, {st['frames']} frames x {st['max_pixels']} px, {st['max_new_tokens']} new tokens")
    rows = [head, f"{'part':<74} {'GiB':>7}"]
    for ph, parts in itertools.groupby(p["lines"], key=lambda line: line[0]):
        rows += [ph] + [f"  {part:<72} {gib:7.2f}" for _, part, gib in parts]
    fits = "" if gpu_gib is None else f" of {gpu_gib:g} GiB: {'fits' if p['peak'] <= gpu_gib else 'does NOT fit'}"
    rows.append(f"{'peak (' + p['peak_phase'] + ')' + fits:<75}{p['peak']:7.2f}")
    return "\n".join(rows)
