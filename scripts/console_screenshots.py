"""Screenshots of the operator console during a rollout, for the README and the docs.

Starts ``halcyon stack --canary`` on free loopback ports (or uses a running stack: pass
``--console``, ``--controller``, ``--gateway`` and ``--operator-token-file``), drives load
through the gateway, starts a rollout of v2 over gRPC, waits for a few decisions, and has
Debian's headless ``chromium`` (through ``chromedriver`` and Selenium) write, at 1280x800::

    docs/img/console-fleet.png      the Fleet panel
    docs/img/console-traffic.png    the Traffic panel
    docs/img/console-rollout.png    the Rollouts panel, signed in as operator

    .venv/bin/python scripts/console_screenshots.py [--out docs/img] [--seconds 40]

Needs ``apt-get install chromium chromium-driver`` and ``pip install selenium`` (the dev
extras). Takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from halcyon.tools.rollout_verify import Load  # noqa: E402
from halcyon.v1 import control_pb2, control_pb2_grpc  # noqa: E402

MODEL = "llama-3-8b"
API_KEY = "demo-key-premium"
WIDTH, HEIGHT = 1280, 800


def _wait_file(path: Path, proc: subprocess.Popen[bytes] | None, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            try:
                return json.loads(path.read_text())
            except ValueError:
                pass
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the stack exited with {proc.returncode} before {path.name}")
        time.sleep(0.1)
    raise SystemExit(f"no {path} within {timeout_s:.0f} s")


def _start_stack(state: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    argv = [
        sys.executable, "-m", "halcyon", "stack", "--canary", "--state-dir", str(state),
        "--controller-listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0",
        "--gateway-metrics-listen", "127.0.0.1:0", "--console-listen", "127.0.0.1:0",
    ]  # fmt: skip
    log = open(state / "stack.out", "wb")  # noqa: SIM115 - lives as long as the stack
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    controller = _wait_file(state / "controller.ready.json", proc, 60)
    gateway = _wait_file(state / "gateway.ready.json", proc, 90)
    return proc, {
        "console": controller["console_url"],
        "controller": controller["grpc"],
        "gateway": gateway["grpc"],
        "token": (state / "operator-token").read_text().strip(),
    }


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def _start_rollout(controller: str, token: str) -> None:
    with grpc.insecure_channel(controller) as channel:
        stub = control_pb2_grpc.ControlServiceStub(channel)
        metadata = (("authorization", f"Bearer {token}"),)
        deadline = time.monotonic() + 30
        while True:
            state = stub.GetState(control_pb2.GetStateRequest(), metadata=metadata, timeout=5)
            if any(r.state == control_pb2.ROLLOUT_STATE_PROGRESSING for r in state.rollouts):
                return
            versions = {m.replica.version for m in state.replicas}
            if "v2" in versions:
                break
            if time.monotonic() > deadline:
                raise SystemExit("no v2 replica registered")
            time.sleep(0.5)
        stub.StartRollout(
            control_pb2.StartRolloutRequest(
                model=MODEL,
                canary_version="v2",
                step_percents=[5, 10, 25, 50],
                policy=control_pb2.RolloutPolicy(window=_duration(5), min_requests=30),
            ),
            metadata=metadata,
            timeout=10,
        )


def _browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not chromedriver:
        raise SystemExit("needs Debian's chromium and chromium-driver packages")
    options = Options()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={WIDTH},{HEIGHT}", "--hide-scrollbars"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_window_size(WIDTH, HEIGHT)
    # Make the viewport (not the window) 1280x800.
    inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    driver.set_window_size(WIDTH + WIDTH - inner[0], HEIGHT + HEIGHT - inner[1])
    return driver


def _shoot(driver: Any, url: str, tab: str, path: Path, wait_for: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{url}#{tab}")
    WebDriverWait(driver, 20).until(ec.presence_of_element_located((By.CSS_SELECTOR, wait_for)))
    time.sleep(1.5)  # one more state event, so the charts have their latest point
    driver.execute_script("document.getElementById('action-result').hidden = true;")
    driver.save_screenshot(str(path))
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--seconds", type=float, default=30.0, help="rollout time before shots")
    parser.add_argument("--rate", type=float, default=150.0, help="requests per second")
    parser.add_argument("--console", help="a running stack's console URL")
    parser.add_argument("--controller", help="... its controller's gRPC address")
    parser.add_argument("--gateway", help="... its gateway's gRPC address")
    parser.add_argument("--operator-token-file", type=Path, help="... its operator token")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    state = Path(tempfile.mkdtemp(prefix="halcyon-shots-"))
    proc = None
    if args.console:
        if not (args.controller and args.gateway and args.operator_token_file):
            parser.error("--console needs --controller, --gateway and --operator-token-file")
        where = {
            "console": args.console.rstrip("/") + "/",
            "controller": args.controller,
            "gateway": args.gateway,
            "token": args.operator_token_file.read_text().strip(),
        }
    else:
        proc, where = _start_stack(state)
    load = Load(argparse.Namespace(rate=args.rate, gateway=where["gateway"], api_key=API_KEY,
                                   model=MODEL))  # fmt: skip
    driver = None
    try:
        load.start()
        time.sleep(8)  # baseline traffic before the rollout, for the charts
        _start_rollout(where["controller"], where["token"])
        time.sleep(args.seconds)
        driver = _browser()
        _shoot(driver, where["console"], "fleet", args.out / "console-fleet.png",
               "table.replicas tbody tr")  # fmt: skip
        _shoot(driver, where["console"], "traffic", args.out / "console-traffic.png",
               "#traffic-charts figure")  # fmt: skip
        # Signed in, so the rollout panel shows what an operator sees.
        driver.get(f"{where['console']}#actions")
        from selenium.webdriver.common.by import By

        field = driver.find_element(By.ID, "token")
        field.send_keys(where["token"])
        driver.find_element(By.ID, "sign-in-button").click()
        time.sleep(1.0)
        _shoot(driver, where["console"], "rollouts", args.out / "console-rollout.png",
               "table.decision-trail tbody tr")  # fmt: skip
    finally:
        load.stop()
        if driver is not None:
            driver.quit()
        if proc is not None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
