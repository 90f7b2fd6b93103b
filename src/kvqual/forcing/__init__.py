"""Teacher forcing: score the baseline's completions on each arm's server. It spends server time
and writes the files of `kvqual.forced`; it never imports the judge."""
