"""The operator console: a web page (and a JSON API) served by the controller itself.

One job per module:

* :mod:`~controller.console.server` — lifecycle: wire to a controller, bind, serve, stop;
* :mod:`~controller.console.app` — the HTTP routes behind one access gate;
* :mod:`~controller.console.access` — who may read and act (credential, sessions, CSRF);
* :mod:`~controller.console.operations` — reads and actions through the gRPC servicer's methods;
* :mod:`~controller.console.snapshot` — the JSON documents, from the controller's own state;
* :mod:`~controller.console.live` — the once-a-second tick and the shared state document;
* :mod:`~controller.console.history` — a bounded ring of per-second traffic;
* :mod:`~controller.console.tap` — how the history sees outcome reports;
* :mod:`~controller.console.problems` — typed JSON errors mirroring gRPC's ErrorInfo reasons;
* ``static/`` — the page: plain HTML, CSS and JavaScript, no build step, no CDN.

See ``docs/reference/console.md`` and ADR 0019.
"""

from controller.console.server import Console, ConsoleConfig

__all__ = ["Console", "ConsoleConfig"]
