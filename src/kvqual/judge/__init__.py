"""The judge, pure over the saved files: run folders + teacher-forcing files → the report dict
(`kvqual.judge.judge.judge`).

`judge.py` replays the looks and assembles report.json; `metrics.py` builds the gate's inputs
from the pairs; `positions.py` computes the token metrics over every position as arrays (the
judge's path); `tokens.py` is the same one position at a time (the reference). Nothing here
sends a request: tests/test_architecture.py checks that importing it loads no transport.
"""
