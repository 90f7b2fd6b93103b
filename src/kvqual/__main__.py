from kvqual.cli import main

raise SystemExit(main())
