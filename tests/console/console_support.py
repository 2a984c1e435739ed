"""Helpers for the console tests: the e2e launcher, a headless Chromium, and HTTP calls.

Real processes are started with the end-to-end launcher (:mod:`tests.support.e2e`), so every
suite starts, watches and stops processes the same way. The browser is Debian's ``chromium``
driven through its WebDriver (``chromedriver``, package ``chromium-driver``) by Selenium; both
are asked for with :func:`tests.support.tools.require_tool` by the test module, so a machine
without them skips with one line and CI (which installs them) fails instead.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import e2e

__all__ = ["REPO", "Answer", "browser", "e2e", "http", "start_fleet"]

REPO = Path(__file__).resolve().parents[2]

# The fleet the console tests watch: two v1 replicas of unequal speed and a v2 canary.
WORKERS: dict[str, tuple[str, ...]] = {
    "replica-a": ("--hardware", "a10g", "--intercept-ms", "1", "--ms-per-token", "0"),
    "replica-b": ("--speed", "0.6", "--hardware", "t4", "--intercept-ms", "1",
                  "--ms-per-token", "0"),
    "replica-c": ("--version", "v2", "--speed", "1.6", "--hardware", "h100",
                  "--intercept-ms", "1", "--ms-per-token", "0"),
}  # fmt: skip


def start_fleet(launcher: Any, *controller_args: str) -> Any:
    """Controller (console on a free loopback port), the three workers and a gateway."""
    return launcher.fleet(
        dict(WORKERS), controller_args=("--console-listen", "127.0.0.1:0", *controller_args)
    )


@dataclass
class Answer:
    status: int
    headers: Any
    body: Any


def http(
    url: str,
    method: str = "GET",
    *,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 10.0,
) -> Answer:
    """One HTTP call; the answer whatever its status (JSON bodies decoded)."""
    data = None
    sent = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        sent.setdefault("Content-Type", "application/json")
    request = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, got, raw = response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        status, got, raw = err.code, err.headers, err.read()
    text = raw.decode("utf-8", "replace")
    try:
        decoded: Any = json.loads(text)
    except ValueError:
        decoded = text
    return Answer(status, got, decoded)


def browser(chromium: str, chromedriver: str) -> Any:
    """A headless Chromium at 1280x800 whose console log can be read (``get_log``); the
    paths come from :func:`require_tool` in the test module (so the missing-tools test finds
    it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",  # root in CI's container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,800",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_window_size(1280, 800)
    return driver
