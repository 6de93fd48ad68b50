"""The policy and what trains it: loading, rollouts and log-probs (`policy`, `positions`), the tiny offline model
(`tiny`), distribution over processes (`parallel`), the per-GPU memory plan (`memory`), the policy in the RL update
(`learner`) and the colocated vLLM rollout engine (`engine`). Used by train.py (and eval_pvrbench.py's local
models)."""
