"""What train.py runs: a run's plumbing (`runs`), the training clips and what the policy is shown of them (`clips`),
the answerability warm-up (`warmup`), the RL step's log record (`records`), what a finished run shows of its RL stage
(`report`) and checkpoints and run folders (`checkpoints`)."""
