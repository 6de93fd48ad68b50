"""The datasets in their native formats (Video-R1, VSI-Bench, UrbanVideo-Bench) as `data.Sample`s, prompts, a model's
answers read and scored (`answers`), a judge's replies read (`verdicts`), the training subset of Video-R1 (`subset`)
and the synthetic benchmark (`synthetic`). Used by every stage script: train.py's data and rewards, eval_pvrbench.py's
benchmarks and scores, judge.py's replies."""
