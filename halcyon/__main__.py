"""``python -m halcyon`` is the ``halcyon`` command."""

from halcyon.cli import main

raise SystemExit(main())
