"""tests/with_vllm's training script (python or torchrun): train.main with engine.SYNC less one call (argv[1]:
its name, or "none"), and an accuracy reward that varies within every group (the completion's length parity), so
that every step moves the weights (the tiny random model's answers would all score 0: no advantage, no update)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import grpo  # noqa: E402
from machinery.model import engine  # noqa: E402

engine.SYNC = tuple(c for c in engine.SYNC if c.__name__ != sys.argv[1])
grpo.accuracy_reward = lambda text, *args, **kwargs: float(len(text) % 2)
import train  # noqa: E402

train.main(sys.argv[2:])
