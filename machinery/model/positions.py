"""Qwen2-VL / Qwen2.5-VL's 3-D rotary (M-RoPE) positions as the Qwen reference code and vLLM compute them
(policy.use_reference_positions installs them on a loaded model)."""
from __future__ import annotations

import itertools

import torch


def reference_rope_index(self, input_ids, mm_token_type_ids, image_grid_thw=None, video_grid_thw=None,
                         second_per_grid_ts=None, attention_mask=None, **kwargs):
    """Qwen2-VL / Qwen2.5-VL's 3-D rotary positions as the Qwen reference code computes them, which is what the
    checkpoints were trained with and what vLLM gives a served model: text counts up by one on all three axes; an
    image or video grid of (t, h, w) merged patches takes (start + round_down(i_t * tokens_per_second *
    second_per_grid_t), start + i_h, start + i_w) (Qwen2-VL and images: i_t); the text after it resumes at
    1 + the largest position of the grid on any axis. transformers >= 5.3 resumes it at 1 + the largest *spatial*
    one, so wherever a video's temporal positions reach further than its height and width (32 frames at 2 fps
    span 30 temporal positions, a 448-pixel frame 16 spatial ones) every later token sits lower than in training
    and in vLLM. Same signature and return as transformers' ``get_rope_index`` (positions [3, B, L] with padding
    at 0, and each row's max position + 1 - its length); policy.use_reference_positions installs it."""
    merge = self.config.vision_config.spatial_merge_size
    per_second = getattr(self.config.vision_config, "tokens_per_second", None)  # Qwen2.5-VL only
    grids = {1: iter(image_grid_thw if image_grid_thw is not None else ()),
             2: iter(video_grid_thw if video_grid_thw is not None else ())}
    seconds = iter(second_per_grid_ts if second_per_grid_ts is not None else ())
    positions = torch.zeros(3, *input_ids.shape, dtype=input_ids.dtype, device=input_ids.device)
    deltas = []
    for row, kinds in enumerate(mm_token_type_ids):
        keep = attention_mask[row].bool() if attention_mask is not None else torch.ones_like(kinds, dtype=torch.bool)
        blocks, start = [], 0
        for kind, run in itertools.groupby(kinds[keep].tolist()):
            if kind == 0:   # text: one position on all three axes per token
                block = torch.arange(len(list(run))).expand(3, -1) + start
            else:           # an image (1) or a video (2): its grid of merged patches
                step = per_second * float(next(seconds, 1.0)) if kind == 2 and per_second else 1.0
                block = _grid_positions(next(grids[kind]), merge, step) + start
            blocks.append(block)
            start = int(block.max()) + 1   # the reference's rule: past the largest position on any axis
        positions[:, row, keep] = torch.cat(blocks, dim=1).to(positions)
        deltas.append(start - int(keep.sum()))
    return positions, torch.tensor(deltas, device=input_ids.device).unsqueeze(1)


def _grid_positions(grid, merge, step):
    """(3, t*h*w) positions of a (t, h, w) patch grid merged `merge` x `merge` spatially: temporal index x `step`
    rounded down (tokens per second x seconds per temporal patch), then row, then column."""
    t, h, w = (int(x) for x in grid)
    return torch.stack(torch.meshgrid((torch.arange(t) * step).long(), torch.arange(h // merge),
                                      torch.arange(w // merge), indexing="ij")).reshape(3, -1)
