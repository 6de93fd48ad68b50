"""The policy: load a video VLM, LoRA / 4-bit, batched rollouts, per-token log-probs.

Everything goes through the Hugging Face Auto classes, so a real ``Qwen/Qwen2.5-VL-7B-Instruct``
directory and the tiny random model that :func:`machinery.model.tiny.build_tiny` writes for tests are used the
same way::

    model, processor = load_policy("Qwen/Qwen2.5-VL-7B-Instruct", lora_r=64, load_in_4bit=True)
    inputs = make_inputs(processor, prompts, videos, fps=2.0)      # left-padded batch
    out = rollout(model, processor, inputs, n=8)                    # B*n completions, prompt-major
    logp = token_logprobs(model, out.prompt_inputs, out.completion_ids, out.completion_mask)
    ref = reference_logprobs(model, out.prompt_inputs, out.completion_ids, out.completion_mask)
    rows = slice(0, 8)                                              # a micro-batch of completion rows
    logp = token_logprobs(model, out.row_inputs(rows), out.completion_ids[rows], out.completion_mask[rows])

Shared-prefix rollouts (``rollout(..., share_prefix=True)``, the default): GRPO samples G completions of
each prompt (App. D: G = 8, 4 videos per GPU), and repeating the prompt batch G times before generate()
would send every video G times through the ViT and prefill every prompt G times. Instead each prompt is
encoded and prefilled once (one forward over the B prompt rows, all tokens but the last, through the
model's own __call__ so that FSDP2's root hooks gather the weights), the KV cache is copied to one row per
completion, and generate() decodes the G completions from those copies, feeding each row's last prompt
token. The prompt positions are computed once with generate()'s own helper and passed to the decode, so the
completions get the positions of the repeated path (greedy completions are identical). The :class:`Rollout`
keeps the unrepeated prompt batch and each completion row's prompt index; :meth:`Rollout.row_inputs`
builds the prompt inputs of any completion rows (:func:`take_rows`) for the update.

M-RoPE (transformers 5.x, Qwen2/2.5-VL): the model computes 3-D rotary positions only when a forward
gets ``mm_token_type_ids`` (0 text, 1 image, 2 video) together with the grid sizes; without them it
silently falls back to 1-D positions and the log-probs drift from those generate() sampled with.
The temporal position of a video patch is ``tokens_per_second * second_per_grid_ts``, so
``second_per_grid_ts`` (seconds per temporal patch) is always passed with videos (without it transformers 5's 3-D
position code can raise StopIteration when a batch holds more videos than tokens).
:func:`token_logprobs` extends ``mm_token_type_ids`` with zeros over the completion, so the
completion tokens get exactly the text positions generate() gave them.

Text policies (an extension's text-only reasoner): a checkpoint without a vision tower
(e.g. ``Qwen/Qwen2.5-3B-Instruct``) loads with AutoModelForCausalLM, and its "processor" is its
AutoTokenizer; every function here takes either (:func:`tokenizer_of`, :func:`is_text_model`), and the
prompts of a text policy are chat messages whose content is a string (no video).
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import json
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from machinery import cli, hub
from machinery.model import positions

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
DEFAULT_FPS = 2.0  # frames per second of the given frames when unknown: qwen-vl-utils' FPS, i.e. 1 s per grid
# LoRA on the language model's attention and MLP projections only, never on the vision tower (whose MLP
# also has gate/up/down_proj in Qwen2.5-VL). peft full-matches this against each module's name.
LM_LORA_TARGETS = r".*language_model\..*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
# A text-only LM (a text reasoner) has no vision tower: every attention / MLP projection.
TEXT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Kept in the compute dtype under 4-bit: the vision tower, the projector and the (possibly tied) LM head.
NO_QUANT_MODULES = ["lm_head", r".*visual", r".*vision_tower", r".*multi_modal_projector"]


# ----------------------------------------------------------------------------- M-RoPE positions
def use_reference_positions(model):
    """Give a Qwen2-VL / Qwen2.5-VL model positions.reference_rope_index in place of its own ``get_rope_index``
    (on the instance: training, generation and the reference model all compute positions through it). Other
    models (Qwen3-VL, whose frames each form their own grid, text LMs) are left as they are."""
    inner = getattr(_generation_model(model), "model", None)
    own = getattr(type(inner), "get_rope_index", None)
    # (an older transformers' get_rope_index, without mm_token_type_ids, is called otherwise: left as it is)
    if type(inner).__name__ in ("Qwen2VLModel", "Qwen2_5_VLModel") and own is not None \
            and "mm_token_type_ids" in inspect.signature(own).parameters:
        inner.get_rope_index = types.MethodType(positions.reference_rope_index, inner)
    return model


# ----------------------------------------------------------------------------- loading
def _default_device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def compute_dtype(device):
    """What models load and compute in by default: bf16 on a GPU that has it, else float32 (the CPU tests). Under
    FSDP2 the fp32 master weights are gathered in it (parallel.shard)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def load_policy(name_or_path, lora_r=0, lora_alpha=None, lora_dropout=0.05, load_in_4bit=False, dtype=None,
                device=None, gradient_checkpointing=False):
    """Load ``(model, processor)`` with the Auto classes, optionally 4-bit NF4 (QLoRA) and/or LoRA.

    dtype: default bf16 on a CUDA device that supports it, else float32. device: default CUDA when present.
    lora_r > 0 wraps the model in a peft LoRA on the language model's q/k/v/o/gate/up/down projections
    (alpha default 2 r); the vision tower stays frozen under LoRA and un-quantized under 4-bit (NF4, double
    quantization, compute in ``dtype``). Without LoRA every parameter is trainable (full fine-tune).
    The model is returned in eval mode; the processor pads on the left, for generation.
    A checkpoint without a vision tower (its config has no ``vision_config``, e.g. Qwen2.5-3B-Instruct)
    loads as AutoModelForCausalLM with its AutoTokenizer as the "processor", LoRA on all its projections.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    device = torch.device(device) if device is not None else _default_device()
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = dtype if dtype is not None else compute_dtype(device)
    kwargs = dict(dtype=dtype, device_map={"": device})  # straight onto the device, no CPU copy of the weights
    if load_in_4bit:
        from transformers import BitsAndBytesConfig
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype,
            bnb_4bit_use_double_quant=True, llm_int8_skip_modules=NO_QUANT_MODULES)
    hub_args = hub.model_source(name_or_path)  # a mistyped path fails here, in one line, with no hub request
    try:
        text_only = getattr(AutoConfig.from_pretrained(name_or_path, **hub_args), "vision_config", None) is None
        model_cls, processor_cls = ((AutoModelForCausalLM, AutoTokenizer) if text_only
                                    else (AutoModelForImageTextToText, AutoProcessor))
        model = model_cls.from_pretrained(name_or_path, **kwargs, **hub_args)
        processor = processor_cls.from_pretrained(name_or_path, **hub_args)
    except OSError as e:  # transformers' "not a valid model identifier", a missing file of a checkpoint
        raise cli.UserError(f"cannot load model {name_or_path}: {e}") from e
    use_reference_positions(model)
    tokenizer_of(processor).padding_side = "left"
    if load_in_4bit:
        from peft import prepare_model_for_kbit_training
        # bitsandbytes 0.50 on an AVX512-BF16 CPU repacks a Linear4bit's weight in place at its first eval-mode
        # no-grad forward (e.g. a rollout); afterwards log-probs shift (~1e-3) and backward fails ("a view of
        # a leaf Variable ... in-place"). Keep every forward on the one dequantising path.
        for module in model.modules():
            if hasattr(module, "support_avx512bf16_for_cpu"):
                module.support_avx512bf16_for_cpu = False
        with warnings.catch_warnings():  # peft 0.21 calls transformers 5's deprecated gradient_checkpointing_*
            warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing,
                                                    gradient_checkpointing_kwargs={"use_reentrant": False})
    elif gradient_checkpointing:  # transformers >= 5.2x calls it activation checkpointing
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora_r > 0:
        from peft import LoraConfig, get_peft_model
        config = LoraConfig(r=lora_r, lora_alpha=lora_alpha if lora_alpha is not None else 2 * lora_r,
                            lora_dropout=lora_dropout, bias="none",
                            target_modules=TEXT_LORA_TARGETS if text_only else LM_LORA_TARGETS,
                            task_type="CAUSAL_LM")
        with warnings.catch_warnings():  # the same deprecated probe (is_gradient_checkpointing)
            warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
            model = get_peft_model(model, config)
    model.eval()  # as from_pretrained; call model.train() for updates (LoRA dropout, checkpointing act in train mode)
    return model, processor


def load_checkpoint(name_or_path, weights=None, *, lora_r=0, load_in_4bit=False, device=None,
                    gradient_checkpointing=False, dtype=None, lora_dropout=0.05):
    """load_policy for training: from `name_or_path`, or from a saved model's `weights` folder (the full
    model, or a LoRA adapter on top of `name_or_path`). `dtype`: float32 for FSDP2's master weights."""
    lora = lora_r > 0
    model, processor = load_policy(weights if (weights and not lora) else name_or_path, lora_r=lora_r,
                                   lora_dropout=lora_dropout, load_in_4bit=load_in_4bit, device=device, dtype=dtype,
                                   gradient_checkpointing=gradient_checkpointing)
    if weights and lora:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file
        set_peft_model_state_dict(model, load_file(str(Path(weights) / "adapter_model.safetensors"),
                                                   device=str(model_device(model))))
    return model, processor


def freeze_vision_encoder(model):
    """Keeps the vision encoder's patch embedding and blocks as loaded; its merger (the projector into the language
    model) and the language model still train: Qwen2.5-VL's own fine-tuning recipe without tune_mm_vision. A model
    without a vision tower is refused."""
    if is_text_model(model):
        raise cli.UserError("freeze_vision: the model has no vision encoder")
    for name, p in model.named_parameters():
        if "visual." in name and ".merger." not in name:
            p.requires_grad_(False)


def save(model, processor, folder, state_dict=None, dtype=None):
    """safetensors: the full model with its processor, or only the LoRA adapter; transformers' own bars
    off (no "Writing model shards" bar inside a training bar). `state_dict`: the weights to write (FSDP2's
    gathered full state dict), cast to `dtype` when given (bf16: the size of the released checkpoints)."""
    if state_dict is not None and dtype is not None:
        state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
    adapters = {"selected_adapters": [model.active_adapter]} if hasattr(model, "peft_config") else {}
    with hub.no_hf_progress_bars():   # (LoRA: the trained adapter only, not the KL's reference)
        model.save_pretrained(folder, safe_serialization=True, state_dict=state_dict, **adapters)
    if not hasattr(model, "peft_config"):
        processor.save_pretrained(folder)
    if dtype is not None and not hasattr(model, "peft_config"):  # the config says what the files hold
        config = json.loads((Path(folder) / "config.json").read_text())
        config["dtype"] = str(dtype).removeprefix("torch.")
        (Path(folder) / "config.json").write_text(json.dumps(config, indent=2))


def frozen_copy(model, deep=True):
    """A deep copy (or, deep=False, the model itself) with every parameter frozen, in eval mode: the reference
    model pi_ref without LoRA."""
    ref = copy.deepcopy(model) if deep else model
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def model_device(model):
    """The device of the model's first parameter (inputs follow the model)."""
    return next(model.parameters()).device


def tokenizer_of(processor):
    """The tokenizer of a VLM processor, or the tokenizer itself (a text policy's "processor")."""
    return getattr(processor, "tokenizer", processor)


def is_text_model(model) -> bool:
    """True for a language model without a vision tower (a text policy)."""
    return getattr(model.config, "vision_config", None) is None


# ----------------------------------------------------------------------------- batches
def _as_frames(video):
    if isinstance(video, torch.Tensor):
        video = video.detach().cpu().numpy()
    video = np.asarray(video)
    if video.ndim != 4 or video.shape[-1] != 3:
        raise ValueError(f"a video must be [T, H, W, 3], got shape {video.shape}")
    return np.ascontiguousarray(video, dtype=np.uint8)


def make_inputs(processor, prompts, videos, fps=None):
    """Tokenise chat prompts with their videos into one left-padded batch (a ``BatchFeature``).

    ``prompts``: a list of chat-message lists; each ``{"type": "video"}`` content item takes the next video
    of ``videos`` (uint8 ``[T, H, W, 3]`` numpy arrays or tensors; ``None`` for text-only prompts).
    ``fps``: frame rate of the frames as given (a number or one per video; default 2.0, qwen-vl-utils'
    sampling rate); it sets ``second_per_grid_ts = temporal_patch_size / fps`` for M-RoPE. An odd number
    of frames is fine: the video processor repeats the last frame up to a multiple of temporal_patch_size.
    Returns input_ids, attention_mask, mm_token_type_ids, pixel_values_videos, video_grid_thw and, for
    Qwen2.5-VL, second_per_grid_ts (a float tensor, one per video).
    """
    from transformers.video_utils import VideoMetadata

    texts = [processor.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    if tokenizer_of(processor) is processor:  # a text policy: its tokenizer, no video
        if videos and any(v is not None for v in videos):
            raise ValueError("a text-only model's tokenizer cannot take videos (perceive them into text first)")
        return processor(texts, padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False)
    kwargs = dict(text=texts, padding=True, padding_side="left", return_tensors="pt", do_sample_frames=False)
    if videos:
        frames = [_as_frames(v) for v in videos]
        rates = fps if isinstance(fps, (list, tuple)) else [fps if fps is not None else DEFAULT_FPS] * len(frames)
        kwargs["videos"] = frames
        kwargs["video_metadata"] = [  # fps -> second_per_grid_ts (Qwen2.5-VL), timestamps (Qwen3-VL)
            VideoMetadata(total_num_frames=len(f), fps=float(r), frames_indices=list(range(len(f))))
            for f, r in zip(frames, rates)]
    inputs = processor(**kwargs)
    if inputs.get("second_per_grid_ts") is not None:  # Qwen2.5-VL's processor returns a list; Qwen2-VL has none
        inputs["second_per_grid_ts"] = torch.as_tensor(inputs["second_per_grid_ts"], dtype=torch.float32).reshape(-1)
    return inputs


def _videos_per_sample(input_ids, token_id, grids, merge_size):
    """How many of the batch's images (or videos) each row holds, from its placeholder-token count.

    Counting tokens, not runs, also works for Qwen3-VL, which splits a video's tokens per frame.
    """
    sizes = (grids.prod(-1) // merge_size ** 2).tolist()
    counts, i = [], 0
    for tokens in (input_ids == token_id).sum(1).tolist():
        k = 0
        while tokens > 0 and i < len(sizes):
            tokens, i, k = tokens - sizes[i], i + 1, k + 1
        if tokens != 0:
            raise ValueError("placeholder tokens in the text do not match the grids of the batch")
        counts.append(k)
    if i != len(sizes):
        raise ValueError(f"{len(sizes) - i} images/videos of the batch have no placeholder tokens")
    return counts


ROW_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "position_ids")  # one entry per prompt row


def take_rows(inputs, index, image_token_id, video_token_id, merge_size=2):
    """The batch whose row i is row ``index[i]`` of ``inputs`` (any row indices, in any order, repeats allowed).

    Per-row tensors are indexed along their batch dim; the flat per-video tensors (pixel_values_videos,
    video_grid_thw, second_per_grid_ts, and the image ones) are regrouped per row, so the result is a valid batch.
    This is how a prompt batch becomes the prompts of its completions (:func:`repeat_inputs`, and
    :meth:`Rollout.row_inputs` for a micro-batch of completion rows).
    """
    index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
    out = dict(inputs)
    for key in ROW_KEYS:
        if out.get(key) is not None:
            value = inputs[key]
            dim = 1 if key == "position_ids" and value.ndim == 3 else 0  # M-RoPE positions are [3 or 4, B, L]
            out[key] = value.index_select(dim, index.to(value.device))
    rows = index.tolist()
    for token_id, pix, grid, extra in ((image_token_id, "pixel_values", "image_grid_thw", None),
                                       (video_token_id, "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")):
        if inputs.get(grid) is None:
            continue
        grids = inputs[grid]
        patches = torch.split(inputs[pix], grids.prod(-1).tolist())
        counts = _videos_per_sample(inputs["input_ids"], token_id, grids, merge_size)
        starts = np.cumsum([0] + counts).tolist()
        order = [v for b in rows for v in range(starts[b], starts[b] + counts[b])]  # the videos of each row
        out[pix] = torch.cat([patches[i] for i in order]) if order else inputs[pix][:0]
        out[grid] = grids[order]
        if extra and inputs.get(extra) is not None:
            out[extra] = inputs[extra][order]
    return type(inputs)(out) if hasattr(inputs, "data") else out


def repeat_inputs(inputs, n, image_token_id, video_token_id, merge_size=2):
    """Repeat every sample of a batch ``n`` times, prompt-major (rows b*n .. b*n+n-1 are copies of sample b):
    :func:`take_rows` with each row index repeated ``n`` times."""
    index = torch.arange(inputs["input_ids"].shape[0]).repeat_interleave(n)
    return take_rows(inputs, index, image_token_id, video_token_id, merge_size)


def vision_ids(model):
    """(image_token_id, video_token_id, spatial merge size) of a model, what :func:`take_rows` needs
    (no token ids for a text policy)."""
    cfg = model.config
    merge = getattr(getattr(cfg, "vision_config", None), "spatial_merge_size", 2)
    return getattr(cfg, "image_token_id", None), getattr(cfg, "video_token_id", None), merge


def repeat_for(model, inputs, n):
    """:func:`repeat_inputs` with the model's own vision token ids (none for a text policy)."""
    return repeat_inputs(inputs, n, *vision_ids(model))


def take_rows_for(model, inputs, index):
    """:func:`take_rows` with the model's own vision token ids (none for a text policy)."""
    return take_rows(inputs, index, *vision_ids(model))


def _to(inputs, device):
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def _token_ids(processor, model):
    tok = tokenizer_of(processor)
    vision = [i for i in tok.convert_tokens_to_ids(VISION_TOKENS) if i is not None and i != tok.unk_token_id]
    eos = {tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    eos = sorted(i for i in eos if i is not None and i != tok.unk_token_id)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    return vision, eos, pad


# ----------------------------------------------------------------------------- rollouts
@dataclass
class Rollout:
    """Completions of a prompt batch, prompt-major: the rows of prompt b are contiguous, in prompt order."""
    texts: list            # one decoded completion per row, special tokens removed
    completion_ids: torch.Tensor   # [rows, L] long, pad id after the end
    completion_mask: torch.Tensor  # [rows, L] long, 1 up to and including the first <|im_end|>/eos
    inputs: dict           # the prompt batch as given (B rows, not repeated), on the model's device
    index: torch.Tensor    # [rows] long (CPU): the prompt row of each completion row
    vision: tuple = (None, None, 2)  # vision_ids(model): what take_rows needs to regroup the videos
    engine_logprobs: torch.Tensor | None = None   # [rows, L]: a vLLM engine's sampled-token log-probs (engine.py)

    def row_inputs(self, rows):
        """The prompt inputs of completion rows ``rows`` (a slice, list or LongTensor of row numbers): what a
        micro-batch of the GRPO update feeds :func:`token_logprobs` with its completions."""
        index = self.index[rows] if isinstance(rows, slice) else self.index[torch.as_tensor(rows, dtype=torch.long)]
        return take_rows(self.inputs, index, *self.vision)

    @property
    def prompt_inputs(self):
        """The prompt batch repeated to one row per completion (built on demand: it holds every video
        once per completion, as generate() saw them without ``share_prefix``)."""
        return self.row_inputs(slice(None))


def make_completion_mask(completion_ids, eos_ids):
    """1 up to and including the first end token of each row, 0 after it (all 1 when it never ends)."""
    is_end = torch.isin(completion_ids, torch.as_tensor(eos_ids, device=completion_ids.device)).long()
    return ((is_end.cumsum(1) - is_end) == 0).long()


def completion_index(n, batch_size):
    """[rows] long: the prompt row of each completion row, prompt-major, for ``n`` completions per prompt
    (an int, or one count per prompt row)."""
    counts = torch.as_tensor([n] * batch_size if isinstance(n, int) else list(n), dtype=torch.long)
    if counts.numel() != batch_size or (counts < 0).any() or counts.sum() == 0:
        raise ValueError(f"n must be a count >= 0 per prompt row ({batch_size} rows), not all 0; got {n}")
    return torch.arange(batch_size).repeat_interleave(counts)


def _generation_model(model):
    """The transformers model under a peft wrapper (the model itself otherwise): the object whose
    generate() helpers compute position ids."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _prompt_positions(model, inputs):
    """The position ids generate() gives the prompt rows: [4, B, P] for a Qwen-VL (1-D text positions,
    then M-RoPE's temporal/height/width ones, from the attention mask and the video grids), [B, P] for a
    text LM (left padding skipped). Computed by the model's own generate() helper, so that the shared-prefix
    decode continues from exactly the positions of the unshared path."""
    kwargs = {k: v for k, v in inputs.items() if k not in ("pixel_values", "pixel_values_videos")}
    return _generation_model(model)._prepare_position_ids_for_generation(inputs["input_ids"], kwargs)


def _select_positions(positions, index):
    return positions.index_select(positions.ndim - 2, index.to(positions.device))  # the batch dim


def _generate_shared(model, inputs, index, config):
    """generate() for the completion rows ``index`` of the prompt batch ``inputs``, each prompt encoded
    and prefilled once.

    One forward over the B prompt rows, all tokens but the last (videos through the ViT once), through the
    module's own __call__ (under FSDP2 only the root module's hooks gather the weights); its KV cache is
    copied to one row per completion (DynamicCache.batch_select_indices); generate() then feeds each row's
    last prompt token and decodes. The pixels are not passed again (their tokens are cached). The prompt's
    position ids are passed explicitly, so decoding continues from them exactly as in the repeated path;
    transformers 5.x's own continuation instead adds the ``rope_deltas`` cached at the prefill, one per
    prefill row (a decode batch of another size cannot use them), and Qwen2.5-VL's delta is off by one when
    the text after a video is shorter than the video's temporal position span (a short question after 16
    frames).
    """
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    positions = _prompt_positions(model, inputs)
    prefix = dict(inputs, input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[..., :-1])
    if inputs.get("mm_token_type_ids") is not None:
        prefix["mm_token_type_ids"] = inputs["mm_token_type_ids"][:, :-1]
    cache = model(**prefix, use_cache=True, logits_to_keep=1).cache
    rows = index.to(ids.device)
    cache.batch_select_indices(rows)  # advanced indexing: one copy of the prompt's keys/values per completion
    return model.generate(input_ids=ids[rows], attention_mask=mask[rows], cache=cache, synced_gpus=False,
                          position_ids=_select_positions(positions, rows), generation_config=config)


def _generation_config(processor, model, max_new_tokens, temperature, top_p, do_sample):
    """(GenerationConfig, end token ids, pad id) of a rollout: greedy when ``do_sample`` is False or ``temperature``
    is 0; vision special tokens suppressed; the checkpoint's own sampling defaults overridden."""
    from transformers import GenerationConfig

    vision, eos, pad = _token_ids(processor, model)
    greedy = (not do_sample) or temperature == 0
    sampling = {} if greedy else dict(temperature=float(temperature), top_p=float(top_p), top_k=0)
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=not greedy, repetition_penalty=1.0,
                              eos_token_id=eos, pad_token_id=pad, suppress_tokens=vision, use_cache=True, **sampling)
    return config, eos, pad


def _completions(processor, seq, prompt_len, eos, pad):
    """(completion ids padded after their end, completion mask, texts) of generate()'s sequences."""
    completion_ids = seq[:, prompt_len:]
    mask = make_completion_mask(completion_ids, eos)
    completion_ids = completion_ids.masked_fill(mask == 0, pad)
    texts = tokenizer_of(processor).batch_decode([row[m.bool()] for row, m in zip(completion_ids, mask)],
                                                 skip_special_tokens=True)
    return completion_ids, mask, texts


@torch.no_grad()
def rollout(model, processor, inputs, n, max_new_tokens=64, temperature=1.0, top_p=1.0, do_sample=True,
            share_prefix=True):
    """Sample ``n`` completions (an int, or one count per prompt row) for each prompt of ``inputs`` (from
    :func:`make_inputs`) in one batch; the rows come out prompt-major.

    ``share_prefix`` (default): each prompt is encoded and prefilled once and its completions decode from
    copies of its KV cache (see :func:`_generate_shared`); False: the prompts (videos included) are repeated
    to one row per completion before a plain generate(), so the ViT and the prefill see each prompt n times.
    Both give the same completions (greedy: identical tokens). Greedy when ``do_sample`` is False or
    ``temperature`` is 0. Vision special tokens are suppressed (a random or weak model samples them
    otherwise). The checkpoint's own sampling defaults (Qwen's top_k=1, repetition_penalty=1.05 ...) are
    overridden: this samples from the plain policy.
    """
    config, eos, pad = _generation_config(processor, model, max_new_tokens, temperature, top_p, do_sample)
    inputs = _to(inputs, model_device(model))
    index = completion_index(n, inputs["input_ids"].shape[0])
    share_prefix = share_prefix and inputs["input_ids"].shape[1] > 1  # a prefill needs one token to spare
    was_training = model.training
    model.eval()
    try:  # synced_gpus=False: each rank decodes alone (under FSDP2 the caller gathers the weights first:
        # parallel.gathered), so ranks with fewer or shorter rollouts never wait for the others token by token
        if share_prefix:
            seq = _generate_shared(model, inputs, index, config)
        else:
            seq = model.generate(**take_rows_for(model, inputs, index), generation_config=config, synced_gpus=False)
    finally:
        model.train(was_training)
    completion_ids, mask, texts = _completions(processor, seq, inputs["input_ids"].shape[1], eos, pad)
    return Rollout(texts=texts, completion_ids=completion_ids, completion_mask=mask, inputs=inputs, index=index,
                   vision=vision_ids(model))


# ----------------------------------------------------------------------------- many questions on one video
def _common_length(rows):
    """Length of the longest common prefix of several token lists."""
    n = min(map(len, rows))
    for k in range(n):
        if any(r[k] != rows[0][k] for r in rows[1:]):
            return k
    return n


def split_shared_prefix(processor, prompts, video, fps=None):
    """Several chat prompts on ONE video as (prefix, suffixes): ``prefix`` the :func:`make_inputs` batch of the
    tokens all prompts share, the video and everything before it (one row, the video processed once);
    ``suffixes`` the rest of each prompt's token ids (at least one token each). None when the prompts share
    no video prefix (a prompt with text before or vision tokens after it), or when the processor's tokens are
    not the tokenizer's with the video expanded (then :func:`answer_same_video` asks them as a plain batch).

    The prompts are tokenised as text (a video stays one placeholder token), their common tokens found, and
    the first prompt alone goes through the processor; its ids must end with its own suffix."""
    tok = tokenizer_of(processor)
    texts = [processor.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    plain = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    common = min(_common_length(plain), min(map(len, plain)) - 1)   # every prompt keeps its last token
    suffixes = [row[common:] for row in plain]
    first = make_inputs(processor, prompts[:1], [video], fps=fps)
    ids = first["input_ids"][0].tolist()
    size = len(ids) - len(suffixes[0])
    vision = set(_token_ids(processor, None)[0])
    if size <= 0 or ids[size:] != suffixes[0] or any(vision.intersection(s) for s in suffixes):
        return None
    if not first["mm_token_type_ids"][0, :size].any():   # no video in the shared part: nothing to gain
        return None
    prefix = dict(first, input_ids=first["input_ids"][:, :size], attention_mask=first["attention_mask"][:, :size],
                  mm_token_type_ids=first["mm_token_type_ids"][:, :size])
    return prefix, suffixes


def _suffix_batch(prefix, suffixes, pad, rows):
    """The prompt batch [shared prefix | each suffix left-padded to the longest] of ``rows`` copies: the padding
    sits between the prefix and the suffix, masked out, so that every row's positions are those of its prompt
    alone. The video's per-video tensors are repeated per row (what the position helper counts)."""
    width = max(map(len, suffixes))
    tail = torch.full((rows, width), pad, dtype=torch.long)
    tail_mask = torch.zeros((rows, width), dtype=torch.long)
    for i, s in enumerate(suffixes):
        tail[i, width - len(s):] = torch.as_tensor(s)
        tail_mask[i, width - len(s):] = 1
    ids, mask = prefix["input_ids"].cpu(), prefix["attention_mask"].cpu()
    batch = {"input_ids": torch.cat([ids.expand(rows, -1), tail], 1),
             "attention_mask": torch.cat([mask.expand(rows, -1), tail_mask], 1),
             "mm_token_type_ids": torch.cat([prefix["mm_token_type_ids"].cpu().expand(rows, -1),
                                             torch.zeros_like(tail)], 1)}
    for key in ("video_grid_thw", "second_per_grid_ts"):
        if prefix.get(key) is not None:
            batch[key] = prefix[key].cpu().repeat(rows, *[1] * (prefix[key].ndim - 1))
    return batch


@torch.no_grad()
def answer_same_video(model, processor, prompts, video, fps=None, max_new_tokens=64, batch_size=8):
    """Greedy completions (texts, in order) of several prompts on ONE video: the video encoded and the
    prompts' shared prefix (:func:`split_shared_prefix`) prefilled once; each batch of ``batch_size`` prompts
    then appends its own tokens to copies of that KV cache and decodes. The texts are those of
    :func:`rollout` on the same prompts as a batch (greedy: identical tokens); prompts that share no video
    prefix are asked exactly so.

    Positions are computed by generate()'s own helper over the [prefix | padded suffix] layout (the padding is
    masked, so each row's positions are its prompt's), and passed explicitly, as in :func:`_generate_shared`."""
    import copy

    split = split_shared_prefix(processor, prompts, video, fps)
    if split is None:
        inputs = make_inputs(processor, prompts, [video] * len(prompts), fps=fps)
        return rollout(model, processor, inputs, n=1, max_new_tokens=max_new_tokens, do_sample=False).texts
    prefix, suffixes = split
    config, eos, pad = _generation_config(processor, model, max_new_tokens, 1.0, 1.0, False)
    device, size = model_device(model), prefix["input_ids"].shape[1]
    was_training = model.training
    model.eval()
    try:
        prefix = _to(prefix, device)
        prefix["position_ids"] = _prompt_positions(model, prefix)
        cache = model(**prefix, use_cache=True, logits_to_keep=1).cache   # the ViT and the prefix, once
        texts = []
        for start in range(0, len(suffixes), batch_size):
            part = suffixes[start:start + batch_size]
            batch = _to(_suffix_batch(prefix, part, pad, len(part)), device)
            positions = _prompt_positions(model, batch)
            rows = cache if start + batch_size >= len(suffixes) else copy.deepcopy(cache)  # the last batch takes it
            rows.batch_select_indices(torch.zeros(len(part), dtype=torch.long, device=device))
            ids, mask = batch["input_ids"], batch["attention_mask"]
            if ids.shape[1] - size > 1:   # the suffixes but their last token, after the prefix
                rows = model(input_ids=ids[:, size:-1], attention_mask=mask[:, :-1], cache=rows, use_cache=True,
                             position_ids=positions[..., size:-1],
                             mm_token_type_ids=batch["mm_token_type_ids"][:, size:-1], logits_to_keep=1).cache
            seq = model.generate(input_ids=ids, attention_mask=mask, cache=rows, synced_gpus=False,
                                 position_ids=positions, generation_config=config)
            texts += _completions(processor, seq, ids.shape[1], eos, pad)[2]
    finally:
        model.train(was_training)
    return texts


# ----------------------------------------------------------------------------- a YES / NO answer's first token
YES_WORDS = ("YES", "Yes", "yes", " YES", " Yes", " yes")
NO_WORDS = ("NO", "No", "no", " NO", " No", " no")


def yes_no_token_ids(tokenizer):
    """Token ids that start a YES or a NO reply (the first token of each spelling; one that starts both: none)."""
    def first_ids(words):
        return sorted({int(t[0]) for t in (tokenizer(w, add_special_tokens=False)["input_ids"] for w in words) if t})
    yes, no = first_ids(YES_WORDS), first_ids(NO_WORDS)
    return [i for i in yes if i not in no], [i for i in no if i not in yes]


def next_token_logits(model, inputs):
    """The next-token logits after each prompt of `inputs` (float32 numpy rows), one forward without gradient."""
    with torch.no_grad():
        return model(**_to(inputs, model_device(model)), use_cache=False,
                     logits_to_keep=1).logits[:, -1].float().cpu().numpy()


# ----------------------------------------------------------------------------- log-probs
def completion_logits(model, inputs, completion_ids, completion_mask):
    """The model's logits (its dtype) predicting each completion token, [B*n, L, V]: one forward over
    [prompt | completion] with the attention mask extended by the completion mask and mm_token_type_ids by
    zeros (completion tokens are text), so M-RoPE gives the completion the positions generate() used; only
    the L completion positions go through the LM head."""
    device = model_device(model)
    inputs = _to(inputs, device)
    completion_ids = completion_ids.to(device)
    length = completion_ids.shape[1]
    batch = dict(inputs)
    batch["input_ids"] = torch.cat([inputs["input_ids"], completion_ids], dim=1)
    mask = inputs["attention_mask"]
    batch["attention_mask"] = torch.cat([mask, completion_mask.to(device=device, dtype=mask.dtype)], dim=1)
    if inputs.get("mm_token_type_ids") is not None:
        mm = inputs["mm_token_type_ids"]
        batch["mm_token_type_ids"] = torch.cat([mm, mm.new_zeros(completion_ids.shape)], dim=1)
    batch.pop("position_ids", None)
    return model(**batch, use_cache=False, logits_to_keep=length + 1).logits[:, :-1]


def _row_logprobs(row_logits, row_ids, scale):
    """log_softmax(row_logits * scale) at row_ids, in float32, as logit - logsumexp."""
    row = row_logits.float() * scale
    return row.gather(-1, row_ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(row, dim=-1)


def token_logprobs(model, inputs, completion_ids, completion_mask, temperature=1.0):
    """Per-token log pi(y_t | prompt, y_<t) of each completion token, [B*n, L]; 0 where the mask is 0.

    Logits from :func:`completion_logits` are divided by ``temperature`` (the sampling temperature; 0, i.e.
    greedy, counts as 1), and log_softmax is taken row by row in float32. Differentiable: this is the policy
    term of the GRPO loss. Under autograd each row's float32 log-softmax runs under activation checkpointing,
    so backward keeps only the logits the model returns (bf16 on GPU) and recomputes one row's float32
    [L, V] at a time, instead of holding every row's float32 copy until backward (B*n x L x V x 4 bytes).
    """
    from torch.utils.checkpoint import checkpoint

    completion_ids = completion_ids.to(model_device(model))
    completion_mask = completion_mask.to(completion_ids.device)
    logits = completion_logits(model, inputs, completion_ids, completion_mask)
    scale = 1.0 / temperature if temperature > 0 else 1.0
    recompute = torch.is_grad_enabled() and logits.requires_grad
    rows = []
    for row_logits, row_ids in zip(logits, completion_ids):  # row by row bounds the float32 temporaries
        if recompute:
            rows.append(checkpoint(_row_logprobs, row_logits, row_ids, scale, use_reentrant=False))
        else:
            rows.append(_row_logprobs(row_logits, row_ids, scale))
    logp = torch.stack(rows)
    return torch.where(completion_mask.bool(), logp, torch.zeros_like(logp))


def target_ids(processor, target_texts):
    """Teacher-forcing targets: each text's tokens + <|im_end|>, right-padded: (ids, mask), [rows, L] long."""
    tok = tokenizer_of(processor)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    targets = [tok(t, add_special_tokens=False)["input_ids"] + [eos] for t in target_texts]
    length = max((len(t) for t in targets), default=1)
    ids = torch.full((len(targets), length), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(targets), length), dtype=torch.long)
    for i, t in enumerate(targets):
        ids[i, :len(t)] = torch.tensor(t)
        mask[i, :len(t)] = 1
    return ids, mask


@torch.no_grad()
def reference_logprobs(model, inputs, completion_ids, completion_mask, ref_model=None, temperature=1.0):
    """log pi_ref of the completion tokens (as :func:`token_logprobs`), without gradient.

    ``ref_model`` when given (see :func:`frozen_copy`); otherwise, for a peft (LoRA) model, the same model with
    its frozen ``reference`` adapter in place of the trained one when it has one (the adapters as RL started:
    :func:`add_reference_adapter`), else with its adapters disabled (the base model: exact while the adapters
    are untrained, as before any SFT).
    """
    if ref_model is not None:
        return token_logprobs(ref_model, inputs, completion_ids, completion_mask, temperature)
    if not hasattr(model, "disable_adapter"):  # peft.PeftModel's context manager
        raise ValueError("reference_logprobs needs ref_model= unless the model is a peft (LoRA) model")
    with as_reference(model):
        return token_logprobs(model, inputs, completion_ids, completion_mask, temperature)


# ----------------------------------------------------------------------------- LoRA's reference adapter
REFERENCE_ADAPTER = "reference"   # LoRA: the frozen copy of the adapters as RL starts (Eq. 7's pi_ref)


def adapters_untrained(model) -> bool:
    """True when every LoRA B matrix of the trained adapter is still zero (peft's initialisation): the adapters
    add nothing, and the model with them off is the model itself."""
    name = model.active_adapter
    return all(not p.any() for n, p in model.named_parameters() if f"lora_B.{name}." in n)


def save_reference_adapter(model, folder):
    """The trained adapter as it is now, as a peft adapter folder (safetensors), without dropout: the reference
    of Eq. 7's KL that add_reference_adapter loads."""
    from peft import LoraConfig

    model.save_pretrained(folder, safe_serialization=True, selected_adapters=[model.active_adapter])
    config = LoraConfig.from_pretrained(str(folder))
    config.lora_dropout, config.inference_mode = 0.0, True   # (a frozen reference: no dropout noise in pi_ref)
    config.save_pretrained(str(folder))


def add_reference_adapter(model, folder):
    """LoRA's pi_ref when SFT trained the adapters (Eq. 7): the adapter saved in `folder` (save_reference_adapter)
    added beside the trained one as REFERENCE_ADAPTER, every weight of it frozen; the trained adapter stays the
    active one. (Adapters-off would be the model before SFT, and the KL would pull RL back toward it.)"""
    from peft import LoraConfig, set_peft_model_state_dict
    from safetensors.torch import load_file

    model.add_adapter(REFERENCE_ADAPTER, LoraConfig.from_pretrained(str(folder)))
    weights = load_file(str(Path(folder) / "adapter_model.safetensors"), device=str(model_device(model)))
    result = set_peft_model_state_dict(model, weights, adapter_name=REFERENCE_ADAPTER)
    if result.unexpected_keys:
        raise RuntimeError(f"{folder}: adapter weights that fit no layer: {result.unexpected_keys[:3]}")
    for n, p in model.named_parameters():
        if f".{REFERENCE_ADAPTER}." in n:
            p.requires_grad_(False)


@contextlib.contextmanager
def as_reference(model):
    """A peft (LoRA) model as Eq. 7's pi_ref within the block: its frozen REFERENCE_ADAPTER in place of the trained
    one when it has one, else its adapters off (untrained adapters: the policy itself)."""
    if REFERENCE_ADAPTER in model.peft_config:
        with active_adapter(model, REFERENCE_ADAPTER):
            yield model
    else:
        with model.disable_adapter():
            yield model


@contextlib.contextmanager
def active_adapter(model, name):
    """The peft model with adapter `name` alone active, then the adapter active before again (peft's set_adapter
    also sets which adapter requires grad: the trained one is trainable again on the way out)."""
    trained = model.active_adapter
    model.set_adapter(name, inference_mode=True)
    try:
        yield model
    finally:
        model.set_adapter(trained)
