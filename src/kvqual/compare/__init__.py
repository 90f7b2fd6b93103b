"""`kvqual compare`, orchestration only: the command (cli.py), the round loop (flow.py), its
progress display (progress.py) and the check that the candidate serves what the config says
(verify.py)."""
