"""The machinery beneath the paper's stage scripts (perturb.py, buffer.py, grpo.py, judge.py, train.py,
eval_pvrbench.py), in layers, lowest first; a module imports only modules of its own layer or a lower one, and
none imports a stage script or an extension:

1. here, the standard library only at import: `cli` (the scripts' plumbing, imported first: one-line errors, the
   parsers, output paths, the OpenMP wait policy), `hub` (model sources, versions), `distributed` (torchrun's
   processes and collectives), `seeds` (the random streams, RNG state), `steplog` (the step's timer and log), and
   `video` (video I/O);
2. `datasets/`: the datasets in their native formats, the answers and their scoring, the training subset, the
   synthetic benchmark;
3. `corruption/`: what perturb.py renders with (kernels, the scene, occluders, depth, its command line);
4. `model/`: the policy, the tiny offline model, distribution, the memory plan, the RL update, the vLLM engine;
5. `eval/`: what eval_pvrbench.py runs (the runner, diagnostics, the chat client, the lmms-eval export);
6. `training/`: what train.py runs (run plumbing, clips, the warm-up, the step's record, checkpoints)."""
