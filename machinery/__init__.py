"""The machinery beneath the paper's stage scripts (perturb.py, curriculum.py, grpo.py, judge.py, train.py,
eval_pvrbench.py): model loading and rollouts, the tiny offline model, video I/O, dataset loaders, the training
subset, distribution, memory planning, run plumbing, the chat client, depth, the synthetic benchmark. It never
imports a stage script or an extension."""
