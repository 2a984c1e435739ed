"""``python -m halcyon`` is the ``halcyon`` command."""

from halcyon.tools.cli import main

raise SystemExit(main())
