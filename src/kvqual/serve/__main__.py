"""`python -m kvqual.serve ...`: the same as `kvqual serve ...`."""

from kvqual.serve.cli import main

raise SystemExit(main())
