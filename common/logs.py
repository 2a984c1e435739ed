"""Structured logs: one JSON object per line on stderr, correlated with traces.

What it decides: the shape of every log line a Halcyon process writes —
``{"ts", "level", "service", "logger", "msg", ...extra, "trace_id", "span_id"}`` — so logs can
be shipped and queried without parsing free text. ``extra={...}`` fields passed to a logging
call become top-level keys; inside an OpenTelemetry span the current trace and span ids are
added, so a log line leads straight to its trace (design section 6).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from opentelemetry import trace

__all__ = ["JsonFormatter", "configure_logging"]

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()
) | {"message", "asctime", "taskName"}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line with the service name and trace context."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and key not in entry:
                entry[key] = _jsonable(value)
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            entry["trace_id"] = format(span_context.trace_id, "032x")
            entry["span_id"] = format(span_context.span_id, "016x")
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(service: str, level: str = "INFO", stream: TextIO | None = None) -> None:
    """Route the root logger to JSON lines on ``stream`` (stderr) at ``level``.

    Replaces handlers a previous call installed, so calling it twice does not duplicate lines.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    for old in list(root.handlers):
        if isinstance(old.formatter, JsonFormatter):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
