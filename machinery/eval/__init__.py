"""What eval_pvrbench.py runs: the evaluation runner (`evaluation`), a run's hash and results files (`run_files`),
collapse diagnostics (`diagnostics`), the OpenAI-compatible chat client and reply cache (`chat`, also judge.py's), and
the lmms-eval task export (`lmms_task`, `lmms_utils`)."""
