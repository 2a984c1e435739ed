"""``python -m bench``: the same benchmark command as ``halcyon bench``."""

from bench.cli import main

raise SystemExit(main())
