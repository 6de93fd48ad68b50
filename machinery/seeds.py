"""A run's random streams and data order: `Seeds`, the one table of which number seeds what (from --seed and the
rank), `hash48` (a stable hash for seeds, where Python's hash() is salted), `Cursor` (a seeded, resumable walk over
a shard) and every RNG's state for checkpoints (`rng_state`, `set_rng_state`).

Standard library only at import (NumPy and torch are imported where they are used).
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass


def hash48(*parts) -> int:
    """Stable 48-bit hash of strings (Python's hash() is salted per process; this is not)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:6], "big")


@dataclass(frozen=True)
class Seeds:
    """Every random stream of a run, named, from --seed and the process's rank: the one place that says which
    numbers seed what (the values are the ones earlier versions used, so a run regenerates exactly). Streams that
    must not depend on the rank (a benchmark's corruptions) are seeded by what they corrupt."""
    seed: int
    rank: int = 0

    @property
    def process(self) -> int:
        """Python's, NumPy's and torch's global generators (sampling in generate), and a vLLM engine's."""
        return self.seed * 1000 + self.rank

    @property
    def sft_order(self) -> int:
        """SFT's walk over this rank's samples (a Cursor)."""
        return self.seed * 1000 + 2 * self.rank

    @property
    def rl_order(self) -> int:
        """RL's walk over this rank's samples."""
        return self.seed * 1000 + 2 * self.rank + 1

    @property
    def answerability_order(self) -> int:
        """The answerability warm-up's walk over its labelled examples (on 4+ ranks rank 0's is rank 3's RL order
        number, a walk over another list: kept, as every value here, so that runs regenerate)."""
        return self.seed * 1000 + 2 * self.rank + 7

    @property
    def rl_specs(self) -> list:
        """The dynamic protocol's corruption draws of RL (Sec. 4: a fresh spec per video and step)."""
        return [self.seed, self.rank, 0xC0DE]

    def sft_jitter(self, sample_id: str, step: int | None = None) -> list:
        """A clip's photometric jitter in SFT: without `step` the same draw on every epoch and rank; with the SFT
        step's number a fresh draw each time the clip is shown (the same again on a resumed run)."""
        return [self.seed, hash48("sft-jitter", sample_id)] + ([] if step is None else [step])

    def answerability_spec(self, i: int) -> list:
        """The corruption of the answerability warm-up's i-th example (the same on a rerun)."""
        return [self.seed, self.rank, 0xA5, i]


class Cursor:
    """A seeded, resumable walk over n items: epoch e visits a fresh permutation."""

    def __init__(self, n, seed, epoch=0, pos=0):
        self.n, self.seed, self.epoch, self.pos = n, seed, epoch, pos

    def take(self, k):
        import numpy as np

        out = []
        while len(out) < k and self.n:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
            out.append(int(order[self.pos]))
            self.pos += 1
            if self.pos == self.n:
                self.epoch, self.pos = self.epoch + 1, 0
        return out

    def state(self):
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, st):
        self.epoch, self.pos = st["epoch"], st["pos"]


def rng_state(spec_rng):
    """Every RNG of this rank: JSON-able parts (python, numpy, the corruption-spec stream), and torch's
    generator states as tensors."""
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_py = random.getstate()
    plain = {"python": [version, list(internal), gauss_py], "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
             "spec": spec_rng.bit_generator.state}
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return plain, tensors


def set_rng_state(plain, tensors, spec_rng):
    import numpy as np
    import torch

    version, internal, gauss_py = plain["python"]
    random.setstate((version, tuple(internal), gauss_py))
    kind, keys, pos, has_gauss, gauss = plain["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    spec_rng.bit_generator.state = plain["spec"]
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(tensors["cuda"]))

