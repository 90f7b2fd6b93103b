"""`kvqual load`: speed at saturation (docs/speed.md, "Speed at saturation").

    cli.py      argument parsing (light: `kvqual --help` imports it)
    session.py  the flow: each target launched, probed, driven, stopped; the default concurrency
    drive.py    the closed loop and the /metrics readings, with their times
    summary.py  one arm's steady-state figures, the ratio, the console table, load.json
    stats.py    pure: token attribution to windows, the warm-up rule, batch means, Fieller's ratio
"""
