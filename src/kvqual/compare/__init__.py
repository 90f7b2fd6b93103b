"""Compare two runs: paired statistics (stats.py) and token-level metrics (tokens.py)."""
