"""The console page in a real headless Chromium, against a running controller, gateway and
workers (one stack and one browser for the module, the tests in order of a rollout's life).

The page loads with no console errors and lists the replicas GetState returns; a decision
appears without a reload when a rollout starts over gRPC; a promote without the credential is
refused (and nothing changes); a cross-site form post is refused even with the operator signed
in (a page on another port is same-site, so SameSite alone would let the cookie through: the
Origin check is what stops it); signed in, the gate buttons pause and resume the rollout, and a
promote reached by keyboard alone works.
"""

from __future__ import annotations

import http.server
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from console_support import browser, e2e  # type: ignore[import-not-found]

from halcyon.v1 import control_pb2
from tests.support.tools import in_ci, missing_message, require_tool

pytestmark = pytest.mark.e2e

WAIT_S = 15.0


def browser_tools() -> tuple[str, str]:
    """Chromium and its driver; with both missing, one line names both packages."""
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    if len(missing) > 1:
        message = "; ".join(missing_message(name) for name in missing)
        if in_ci():
            pytest.fail(f"{message}; .ci/run installs them on CI", pytrace=False)
        pytest.skip(message)
    return require_tool("chromium"), require_tool("chromedriver")


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    """Headless Chromium; asked for before the stack, so a machine without it skips at once."""
    chrome = browser(*browser_tools())
    try:
        yield chrome
    finally:
        chrome.quit()


def console(stack: Any) -> str:
    return str(stack.controller.info["console_url"])


def by_css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def wait_css(driver: Any, selector: str, what: str, timeout_s: float = WAIT_S) -> list[Any]:
    return e2e.wait_for(lambda: by_css(driver, selector), timeout_s, what)  # type: ignore[no-any-return]


def severe(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def open_page(driver: Any, stack: Any, tab: str = "fleet") -> None:
    driver.get(f"{console(stack)}#{tab}")
    wait_css(driver, "table.replicas tbody tr", "the replica tables")


def grpc_md() -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {e2e.OPERATOR_TOKEN}"),)


def rollout_state(stack: Any) -> int:
    [rollout] = [r for r in stack.get_state().rollouts if r.canary_version == "v2"][-1:]
    return int(rollout.state)


def ensure_rollout(stack: Any) -> None:
    running = [
        r for r in stack.get_state().rollouts if r.state == control_pb2.ROLLOUT_STATE_PROGRESSING
    ]
    if running:
        return
    stack.control_stub.StartRollout(
        control_pb2.StartRolloutRequest(
            model=e2e.MODEL,
            canary_version="v2",
            step_percents=[10, 50],
            # A window no test waits for: the rollout stays at its first step until acted on.
            policy=control_pb2.RolloutPolicy(window=e2e.duration(600), min_requests=100_000),
        ),
        metadata=grpc_md(),
        timeout=10,
    )


def sign_in(driver: Any, stack: Any) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, "tab-actions").click()
    field = driver.find_element(By.ID, "token")
    field.send_keys(e2e.OPERATOR_TOKEN)
    driver.find_element(By.ID, "sign-in-button").click()
    e2e.wait_for(
        lambda: "Operator signed in" in driver.find_element(By.ID, "operator").text,
        WAIT_S,
        "the page to say the operator is signed in",
    )
    assert e2e.OPERATOR_TOKEN not in driver.page_source
    assert field.get_attribute("value") == ""


def test_the_page_loads_without_console_errors_and_shows_the_replicas_of_getstate(
    driver: Any, stack: Any
) -> None:
    open_page(driver, stack)
    want = {m.replica.replica_id for m in stack.get_state().replicas}
    # Read in the page, in one call: the table is redrawn on every event, so an element found
    # by one call may be gone by the next (a stale element, not a failure of the page).
    e2e.wait_for(
        lambda: (
            set(
                driver.execute_script(
                    "return [...document.querySelectorAll('tr[data-replica-id]')]"
                    ".map(r => r.dataset.replicaId)"
                )
            )
            == want
        ),
        WAIT_S,
        f"the page to list {sorted(want)}",
    )
    from selenium.webdriver.common.by import By

    e2e.wait_for(
        lambda: "Live" in driver.find_element(By.ID, "connection").text,
        WAIT_S,
        "the event stream",
    )
    row = driver.execute_script(
        "return document.querySelector('tr[data-replica-id=\"replica-b\"]').innerText"
    )
    assert "v1" in row and "t4" in row and "0.60×" in row and "up" in row
    # Every panel draws without an error; the charts have labelled axes.
    for tab in ("traffic", "rollouts", "actions", "fleet"):
        driver.find_element(By.ID, f"tab-{tab}").click()
        assert driver.find_element(By.ID, f"panel-{tab}").is_displayed()
    driver.find_element(By.ID, "tab-traffic").click()
    wait_css(driver, "#traffic-charts figure svg text", "the traffic charts")
    assert "requests/s" in driver.find_element(By.ID, "traffic-charts").text
    assert severe(driver) == []


def texts(driver: Any, selector: str, attribute: str | None = None) -> list[str]:
    """Text (or an attribute) of every match, read in one script: the page redraws each second,
    so elements found in one call may be gone in the next."""
    got = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => "
        "arguments[1] ? e.getAttribute(arguments[1]) : e.textContent);",
        selector,
        attribute,
    )
    return [str(x) for x in got]


def test_the_breaker_states_and_the_tenant_table_render(driver: Any, stack: Any) -> None:
    from selenium.webdriver.common.by import By

    for i in range(5):
        stack.infer(session_key=f"tenant-table-{i}")
    open_page(driver, stack)
    # Each gateway's breaker per replica, in words and a symbol (not colour alone).
    want = {m.replica.replica_id for m in stack.get_state().replicas}
    e2e.wait_for(
        lambda: set(texts(driver, "table.gateway tbody tr", "data-gateway-replica")) == want,
        WAIT_S,
        f"a breaker row for each of {sorted(want)}",
    )
    assert set(texts(driver, "table.gateway td.breaker")) == {"● closed"}
    driver.find_element(By.ID, "tab-traffic").click()
    cell = '#tenant-traffic tr[data-tenant="premium"] td[data-field="requests"]'
    e2e.wait_for(
        lambda: [n for n in texts(driver, cell) if int(n.replace(",", "")) >= 5],
        WAIT_S,
        "the tenant table to count premium's calls",
    )
    headers = " ".join(texts(driver, "#tenant-traffic th"))
    assert "Quota refused" in headers and "Requests/s" in headers
    assert "Sheds by reason" in " ".join(texts(driver, "#traffic-charts figure"))
    assert severe(driver) == []


def test_a_new_decision_appears_without_a_reload(driver: Any, stack: Any) -> None:
    from selenium.webdriver.common.by import By

    open_page(driver, stack, "rollouts")
    driver.execute_script("window.__sameDocument = true;")
    started = stack.control_stub.StartRollout(
        control_pb2.StartRolloutRequest(
            model=e2e.MODEL,
            canary_version="v2",
            step_percents=[10, 50],
            policy=control_pb2.RolloutPolicy(window=e2e.duration(600), min_requests=100_000),
        ),
        metadata=grpc_md(),
        timeout=10,
    ).rollout
    [row] = wait_css(
        driver, 'table.decision-trail tr[data-action="START"]', "the START decision on the page"
    )
    assert "start" in row.text
    card = driver.find_element(By.CSS_SELECTOR, f'article[data-rollout-id="{started.id}"]')
    assert "progressing" in card.text and "canary weight 10.00 %" in card.text
    assert driver.execute_script("return window.__sameDocument === true;")
    assert severe(driver) == []


def test_a_promote_without_the_credential_is_refused(driver: Any, stack: Any) -> None:
    from selenium.webdriver.common.by import By

    ensure_rollout(stack)
    driver.delete_all_cookies()
    open_page(driver, stack, "rollouts")
    wait_css(driver, 'button[data-action="promote"]', "the promote button")[0].click()
    wait_css(driver, 'button[data-action="confirm-promote"]', "the confirmation")[0].click()
    toast = driver.find_element(By.ID, "action-result")
    e2e.wait_for(lambda: "refused" in toast.text, WAIT_S, "the refusal on the page")
    assert "MISSING_CREDENTIALS" in toast.text and "sign in" in toast.text
    assert rollout_state(stack) == control_pb2.ROLLOUT_STATE_PROGRESSING


class _Evil(http.server.BaseHTTPRequestHandler):
    target = ""

    def do_GET(self) -> None:
        page = (
            "<!doctype html><html><body>"
            f'<form id="f" method="POST" action="{self.target}"></form>'
            "<script>document.getElementById('f').submit();</script></body></html>"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_cross_site_form_post_is_refused_even_when_signed_in(driver: Any, stack: Any) -> None:
    ensure_rollout(stack)
    open_page(driver, stack, "actions")
    sign_in(driver, stack)
    target = f"{console(stack)}api/rollouts/{e2e.MODEL}/promote"
    handler = type("Evil", (_Evil,), {"target": target})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        driver.get(f"http://127.0.0.1:{server.server_address[1]}/")
        e2e.wait_for(lambda: driver.current_url.startswith(target), WAIT_S, "the form to be posted")
        e2e.wait_for(lambda: "CROSS_ORIGIN" in driver.page_source, WAIT_S, "the refusal")
    finally:
        server.shutdown()
        server.server_close()
    assert rollout_state(stack) == control_pb2.ROLLOUT_STATE_PROGRESSING
    driver.get_log("browser")  # the 403 of the form post is logged; it was meant to be


def test_signed_in_the_gate_buttons_pause_and_resume(driver: Any, stack: Any) -> None:
    from selenium.webdriver.common.by import By

    ensure_rollout(stack)
    open_page(driver, stack, "actions")
    if "Operator signed in" not in driver.find_element(By.ID, "operator").text:
        sign_in(driver, stack)
    driver.find_element(By.ID, "tab-rollouts").click()
    note = driver.find_element(By.ID, "gates-note")
    e2e.wait_for(
        lambda: "Rollout gates: pause, resume, approve" in note.get_attribute("textContent"),
        WAIT_S,
        "the gates the controller offers",
    )
    assert by_css(driver, 'button[data-action="approve"]') == []  # nothing awaits approval
    wait_css(driver, 'button[data-action="pause"]', "the pause button")[0].click()
    wait_css(driver, 'form[aria-label="Confirm pause"] input[type="checkbox"]', "the option")[
        0
    ].click()  # off: hold a proven regression for the operator
    wait_css(driver, 'button[data-action="confirm-pause"]', "the confirmation")[0].click()
    [badge] = wait_css(driver, 'article.rollout [data-field="gates"]', "the paused badge")
    assert "paused, no auto-rollback" in badge.text
    running = [r for r in stack.get_state().rollouts if r.state == 1]
    assert [(r.paused, r.auto_rollback) for r in running] == [(True, False)]
    wait_css(driver, 'button[data-action="resume"]', "the resume button")[0].click()
    e2e.wait_for(
        lambda: not by_css(driver, 'article.rollout [data-field="gates"]'),
        WAIT_S,
        "the paused badge to go",
    )
    assert [r.paused for r in stack.get_state().rollouts if r.state == 1] == [False]
    assert severe(driver) == []


def test_signed_in_a_promote_reached_by_keyboard_works(driver: Any, stack: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    ensure_rollout(stack)
    open_page(driver, stack, "actions")
    if "Operator signed in" not in driver.find_element(By.ID, "operator").text:
        sign_in(driver, stack)
    driver.find_element(By.ID, "tab-rollouts").click()
    wait_css(driver, 'button[data-action="promote"]', "the promote button")
    for _ in range(80):  # Tab through the page to the promote button: no mouse
        driver.switch_to.active_element.send_keys(Keys.TAB)
        if driver.switch_to.active_element.get_attribute("data-action") == "promote":
            break
    else:
        raise AssertionError("the promote button is not reachable with Tab")
    driver.switch_to.active_element.send_keys(Keys.ENTER)
    e2e.wait_for(
        lambda: driver.switch_to.active_element.get_attribute("data-action") == "confirm-promote",
        WAIT_S,
        "focus on the confirmation",
    )
    driver.switch_to.active_element.send_keys(Keys.ENTER)
    e2e.wait_for(
        lambda: rollout_state(stack) == control_pb2.ROLLOUT_STATE_PROMOTED,
        WAIT_S,
        "the rollout to be promoted",
    )
    e2e.wait_for(
        lambda: any("promoted" in a.text for a in by_css(driver, "article.rollout")),
        WAIT_S,
        "the page to show it promoted",
    )
    [route] = stack.get_state().routing
    assert (route.stable_version, route.canary_version) == ("v2", "")
    assert "done" in driver.find_element(By.ID, "action-log").get_attribute("textContent")
