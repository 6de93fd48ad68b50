"""tests/with_vllm's training script (python or torchrun): train.main with engine.SYNC less one call (argv[1]: its
name; "sync": Engine.sync does nothing at all, the engine keeps the weights it loaded; "none": the whole sync), and
an accuracy reward that varies within every group (the completion's length parity), so that every step moves the
weights (the tiny random model's answers would all score 0: no advantage, no update). ROVA_TEST_ENGINE_DTYPE (e.g.
bfloat16): the engine's dtype (engine.DTYPE), the policy staying in float32."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

import grpo  # noqa: E402
from machinery import cli  # noqa: E402
from machinery.model import engine  # noqa: E402

if sys.argv[1] == "sync":
    engine.Engine.sync = lambda self, model: self.wake()
engine.SYNC = tuple(c for c in engine.SYNC if c.__name__ != sys.argv[1])
if os.environ.get("ROVA_TEST_ENGINE_DTYPE"):
    engine.DTYPE = getattr(torch, os.environ["ROVA_TEST_ENGINE_DTYPE"])
grpo.accuracy_reward = lambda text, *args, **kwargs: float(len(text) % 2)
import train  # noqa: E402

cli.run(train.main, interrupted=train.RESUME, argv=sys.argv[2:])   # (a UserError: one line, exit 2)
