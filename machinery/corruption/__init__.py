"""What perturb.py renders its corruptions with: the kernels, the scene an effect sees (`scene`), the occluders and
props of a clip's scene, monocular depth (`depth`), and perturb.py's command line (`perturb_cli`). Used by perturb.py,
and through it by train.py and eval_pvrbench.py."""
