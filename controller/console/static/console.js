// Halcyon operator console: plain JavaScript, no build step, no library.
//
// Reads /api/state and /api/traffic, then stays live on /api/events (server-sent events:
// "state" about once a second, "decision" as each is stored), polling every 2 s if the event
// stream cannot be kept. Everything is drawn with DOM calls (textContent, never innerHTML), so
// names that workers and gateways report cannot inject markup. Charts are inline SVG with axis
// labels, tick values, a legend by line style and the latest values in text: readable without
// hover. State is always said in words (and an icon), never by colour alone.
"use strict";

const POLL_MS = 2000;
const HORIZON_S = 300;
const SVG_NS = "http://www.w3.org/2000/svg";
const DASHES = ["", "6 3", "2 3", "8 3 2 3", "1 2", "10 4"];

const ui = {
  state: null, // the last /api/state document
  traffic: new Map(), // t -> point
  trafficSlot: 1,
  decisions: new Map(), // decision id -> decision
  loadedModels: new Set(), // models whose decision trail was fetched
  operator: false,
  csrf: null,
  confirm: null, // {action, target} awaiting confirmation
  gates: [], // capabilities.gates: the gate buttons this controller offers
  mode: "connecting",
  rendered: {}, // section -> the input it was last drawn from
  log: [],
};

// -- tiny DOM helpers ---------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") el.textContent = String(value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

// Replace a container's children, keeping keyboard focus on the element with the same
// data-key (re-rendering every second must not throw a keyboard user out of a table).
function replace(container, ...children) {
  const active = document.activeElement;
  const key = active && container.contains(active) ? active.dataset.key : null;
  container.replaceChildren();
  append(container, children);
  if (key) {
    const again = container.querySelector(`[data-key="${CSS.escape(key)}"]`);
    if (again) again.focus();
  }
}

// Draw a section only when what it is drawn from changed.
function changed(section, input) {
  const text = JSON.stringify(input);
  if (ui.rendered[section] === text) return false;
  ui.rendered[section] = text;
  return true;
}

// -- formatting ---------------------------------------------------------------------------

function seconds(duration) {
  if (duration === undefined || duration === null || duration === "") return null;
  const v = parseFloat(String(duration));
  return Number.isFinite(v) ? v : null;
}

function ms(duration, digits = 1) {
  const v = seconds(duration);
  return v === null ? "–" : `${(v * 1000).toFixed(digits)} ms`;
}

function pct(fraction, digits = 2) {
  return Number.isFinite(fraction) ? `${(fraction * 100).toFixed(digits)} %` : "–";
}

function num(value, digits = 0) {
  const v = Number(value);
  return Number.isFinite(v) ? v.toLocaleString("en-US", { maximumFractionDigits: digits,
    minimumFractionDigits: digits }) : "–";
}

function epoch(text) {
  return text ? Date.parse(text) / 1000 : null;
}

function clock(t) {
  return new Date(t * 1000).toLocaleTimeString("en-GB", { hour12: false });
}

function ago(t) {
  if (t === null) return "–";
  const d = Math.max(0, now() - t);
  return d < 90 ? `${d.toFixed(0)} s ago` : `${(d / 60).toFixed(0)} min ago`;
}

function now() {
  return ui.state ? ui.state.server_time : Date.now() / 1000;
}

function shortState(enumName, prefix) {
  return String(enumName || "").replace(prefix, "").toLowerCase().replace(/_/g, " ");
}

// -- talking to the controller ------------------------------------------------------------

async function getJSON(path) {
  const response = await fetch(path, { credentials: "same-origin" });
  if (response.status === 401 && !path.startsWith("/api/session")) {
    window.location.assign("/login");
    throw new Error("sign-in required");
  }
  if (!response.ok) throw await problem(response);
  return response.json();
}

async function problem(response) {
  try {
    const body = await response.json();
    const e = body.error || {};
    const err = new Error(e.message || response.statusText);
    err.reason = e.reason;
    err.code = e.code;
    err.status = response.status;
    return err;
  } catch (_) {
    const err = new Error(`${response.status} ${response.statusText}`);
    err.status = response.status;
    return err;
  }
}

async function post(path, body, method = "POST") {
  const headers = { "Content-Type": "application/json" };
  if (ui.csrf) headers["X-Halcyon-CSRF"] = ui.csrf;
  const response = await fetch(path, {
    method, headers, credentials: "same-origin", body: JSON.stringify(body || {}),
  });
  if (!response.ok) throw await problem(response);
  return response.json();
}

function onState(doc) {
  ui.state = doc;
  mergeTraffic(doc.traffic);
  for (const rollout of doc.state.rollouts) {
    const last = rollout.lastDecision;
    if (last && last.id) addDecision(last, false);
    if (!ui.loadedModels.has(rollout.model)) loadDecisions(rollout.model);
  }
  render();
}

function mergeTraffic(traffic) {
  if (!traffic) return;
  ui.trafficSlot = traffic.slot_s || 1;
  for (const point of traffic.points) ui.traffic.set(point.t, point);
  const horizon = now() - (traffic.horizon_s || HORIZON_S);
  for (const t of ui.traffic.keys()) if (t < horizon) ui.traffic.delete(t);
}

function addDecision(decision, announce) {
  const known = ui.decisions.has(decision.id);
  ui.decisions.set(decision.id, decision);
  if (announce && !known) {
    const action = shortState(decision.action, "DECISION_ACTION_");
    say(`New decision for ${decision.model}: ${action} (${decision.reason}), ` +
      `${num(decision.fromPercent, 1)} % to ${num(decision.toPercent, 1)} %`);
  }
}

async function loadDecisions(model) {
  ui.loadedModels.add(model);
  try {
    const found = await getJSON(`/api/rollouts/${encodeURIComponent(model)}/decisions?limit=2000`);
    for (const d of found.decisions) addDecision(d, false);
    render();
  } catch (err) {
    ui.loadedModels.delete(model);
  }
}

function say(text) {
  const region = document.getElementById("announce");
  region.textContent = text;
}

function setConnection(mode) {
  ui.mode = mode;
  const text = {
    connecting: "◌ Connecting…",
    live: "● Live (server-sent events)",
    polling: "◐ Live by polling every 2 s (the event stream is unavailable)",
    down: "○ Cannot reach the controller; retrying",
  }[mode];
  const el = document.getElementById("connection");
  if (el.textContent !== text) el.textContent = text;
}

let pollTimer = null;
let streamFailures = 0;

function connect() {
  if (!("EventSource" in window)) return startPolling();
  const events = new EventSource("/api/events");
  events.addEventListener("open", () => { streamFailures = 0; setConnection("live"); });
  events.addEventListener("state", (e) => { setConnection("live"); onState(JSON.parse(e.data)); });
  events.addEventListener("decision", (e) => {
    addDecision(JSON.parse(e.data), true);
    render();
  });
  events.addEventListener("error", () => {
    streamFailures += 1;
    if (events.readyState === EventSource.CLOSED || streamFailures >= 3) {
      events.close();
      startPolling();
    } else {
      setConnection("connecting");
    }
  });
}

function startPolling() {
  if (pollTimer !== null) return;
  const tick = async () => {
    try {
      const doc = await getJSON("/api/state");
      const last = Math.max(0, ...ui.traffic.keys());
      doc.traffic = await getJSON(`/api/traffic${last ? `?since=${last}` : ""}`);
      setConnection("polling");
      onState(doc);
    } catch (err) {
      setConnection("down");
    }
  };
  tick();
  pollTimer = setInterval(tick, POLL_MS);
}

// -- the operator's session ---------------------------------------------------------------

async function refreshSession() {
  try {
    const info = await getJSON("/api/session");
    ui.operator = info.operator;
    ui.csrf = info.csrf_token || null;
  } catch (_) {
    ui.operator = false;
    ui.csrf = null;
  }
  renderOperator();
}

function renderOperator() {
  const box = document.getElementById("operator");
  const signedIn = document.getElementById("signed-in");
  const form = document.getElementById("sign-in");
  signedIn.hidden = !ui.operator;
  form.hidden = ui.operator;
  replace(box,
    h("span", { class: `state ${ui.operator ? "state-ok" : "state-idle"}`,
      text: ui.operator ? "● Operator signed in" : "○ Read-only (not signed in)" }),
    ui.operator
      ? h("button", { type: "button", "data-key": "top-sign-out", onclick: signOut,
        text: "Sign out" })
      : h("button", { type: "button", "data-key": "top-sign-in", onclick: () => {
        selectTab("actions"); document.getElementById("token").focus();
      }, text: "Sign in…" }));
}

async function signIn(event) {
  event.preventDefault();
  const input = document.getElementById("token");
  const token = input.value;
  input.value = "";
  try {
    const info = await post("/api/session", { token });
    ui.operator = true;
    ui.csrf = info.csrf_token;
    note("Signed in as operator", false);
  } catch (err) {
    note(`Sign-in refused: ${err.reason || err.code} — ${err.message}`, true);
  }
  renderOperator();
  render(true);
}

async function signOut() {
  try {
    await post("/api/session", {}, "DELETE");
  } catch (_) { /* the session is gone either way */ }
  ui.operator = false;
  ui.csrf = null;
  note("Signed out", false);
  renderOperator();
  render(true);
}

function note(text, refused) {
  ui.log.unshift({ at: Date.now() / 1000, text, refused });
  ui.log.length = Math.min(ui.log.length, 50);
  const toast = document.getElementById("action-result");
  toast.textContent = text;
  toast.className = `toast${refused ? " refused" : ""}`;
  toast.hidden = false;
  clearTimeout(note.timer);
  note.timer = setTimeout(() => { toast.hidden = true; }, 8000);
  replace(document.getElementById("action-log"), ui.log.map((entry) =>
    h("li", { class: entry.refused ? "refused" : "" },
      `${clock(entry.at)} — ${entry.refused ? "✕ " : "✓ "}${entry.text}`)));
}

async function act(action, target, path, body) {
  ui.confirm = null;
  try {
    await post(path, body);
    note(`${action} ${target}: done`, false);
  } catch (err) {
    const hint = err.status === 401 ? " (sign in with the operator credential first)" : "";
    note(`${action} ${target} refused: ${err.code || ""} ${err.reason || ""} — ` +
      `${err.message}${hint}`, true);
  }
  render(true);
}

function askFirst(action, target) {
  ui.confirm = { action, target };
  render(true);
  const field = document.querySelector(`[data-key="confirm-${action}-${CSS.escape(target)}"]`);
  if (field) field.focus();
}

// -- tabs ---------------------------------------------------------------------------------

const TABS = ["fleet", "traffic", "rollouts", "actions"];

function selectTab(name, focus) {
  if (!TABS.includes(name)) name = "fleet";
  for (const tab of TABS) {
    const button = document.getElementById(`tab-${tab}`);
    const selected = tab === name;
    button.setAttribute("aria-selected", String(selected));
    button.tabIndex = selected ? 0 : -1;
    document.getElementById(`panel-${tab}`).hidden = !selected;
    if (selected && focus) button.focus();
  }
  if (window.location.hash !== `#${name}`) history.replaceState(null, "", `#${name}`);
}

function setupTabs() {
  for (const tab of TABS) {
    const button = document.getElementById(`tab-${tab}`);
    button.addEventListener("click", () => selectTab(tab));
    button.addEventListener("keydown", (e) => {
      const i = TABS.indexOf(tab);
      if (e.key === "ArrowRight") selectTab(TABS[(i + 1) % TABS.length], true);
      else if (e.key === "ArrowLeft") selectTab(TABS[(i + TABS.length - 1) % TABS.length], true);
      else if (e.key === "Home") selectTab(TABS[0], true);
      else if (e.key === "End") selectTab(TABS[TABS.length - 1], true);
      else return;
      e.preventDefault();
    });
  }
  window.addEventListener("hashchange", () => selectTab(window.location.hash.slice(1)));
  selectTab(window.location.hash.slice(1) || "fleet");
}

// -- charts -------------------------------------------------------------------------------

function niceTicks(max, count = 4) {
  if (!(max > 0)) return [0, 1];
  const raw = max / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((v) => v >= raw) || raw;
  const ticks = [];
  for (let v = 0; v <= max + step * 0.001; v += step) ticks.push(+v.toPrecision(12));
  if (ticks[ticks.length - 1] < max) ticks.push(+(ticks[ticks.length - 1] + step).toPrecision(12));
  return ticks;
}

function fmtTick(v) {
  if (Math.abs(v) >= 1000) return `${+(v / 1000).toFixed(1)}k`;
  return String(+v.toFixed(2));
}

let chartIds = 0;

// series: [{label, points: [[t, v]], unit, step}], x: {from, to, labels: "relative"|"clock"}
function lineChart({ title, yLabel, series, from, to, relative, markers, yMax, unit }) {
  const W = 560, H = 200, L = 52, R = 12, T = 18, B = 34;
  const id = `chart-${++chartIds}`;
  const values = series.flatMap((sr) => sr.points.map((p) => p[1])).filter(Number.isFinite);
  const top = yMax !== undefined ? yMax : Math.max(1e-9, ...values) * 1.1;
  const ticks = yMax !== undefined ? niceTicks(yMax, 4).filter((v) => v <= yMax) : niceTicks(top);
  const ymax = ticks[ticks.length - 1] || 1;
  const span = Math.max(1, to - from);
  const X = (t) => L + ((t - from) / span) * (W - L - R);
  const Y = (v) => T + (1 - v / ymax) * (H - T - B);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-labelledby": `${id}-t`,
    "aria-describedby": `${id}-d`, preserveAspectRatio: "xMidYMid meet" });
  for (const v of ticks) {
    svg.append(s("line", { class: "grid", x1: L, x2: W - R, y1: Y(v), y2: Y(v) }));
    svg.append(s("text", { x: L - 6, y: Y(v) + 4, "text-anchor": "end", text: fmtTick(v) }));
  }
  svg.append(s("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  svg.append(s("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  const xticks = 5;
  for (let i = 0; i <= xticks; i++) {
    const t = from + (span * i) / xticks;
    const label = relative
      ? (i === xticks ? "now" : `−${((to - t) / 60).toFixed(to - t < 120 ? 1 : 0)} min`)
      : clock(t);
    svg.append(s("line", { class: "axis", x1: X(t), x2: X(t), y1: H - B, y2: H - B + 4 }));
    svg.append(s("text", { x: X(t), y: H - B + 16, "text-anchor": i === 0 ? "start"
      : i === xticks ? "end" : "middle", text: label }));
  }
  svg.append(s("text", { x: 12, y: (H - B) / 2, transform: `rotate(-90 12 ${(H - B) / 2})`,
    "text-anchor": "middle", text: yLabel }));
  svg.append(s("text", { x: (L + W - R) / 2, y: H - 2, "text-anchor": "middle",
    text: relative ? "time (last 5 minutes)" : "time (wall clock)" }));
  series.forEach((sr, i) => {
    const pts = sr.points.filter((p) => Number.isFinite(p[1]) && p[0] >= from && p[0] <= to);
    if (!pts.length) return;
    let d = "";
    pts.forEach((p, j) => {
      if (j === 0) d += `M${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`;
      else if (sr.step) d += `H${X(p[0]).toFixed(1)}V${Y(p[1]).toFixed(1)}`;
      else d += `L${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`;
    });
    if (sr.step) d += `H${X(to).toFixed(1)}`;
    svg.append(s("path", { class: `series s${i % 6}`, d, "stroke-dasharray": DASHES[i % 6] || null }));
  });
  for (const m of markers || []) {
    const x = X(m.t), y = Y(m.v);
    svg.append(s("text", { class: "marker-label", x, y: y - 7, "text-anchor": "middle",
      text: m.symbol }));
    svg.append(s("circle", { class: "marker", cx: x, cy: y, r: 2.5 }));
  }
  const latest = series.map((sr) => {
    const last = sr.points.filter((p) => Number.isFinite(p[1])).at(-1);
    return `${sr.label} ${last ? fmtValue(last[1], sr.unit || unit) : "–"}`;
  }).join(" · ");
  const legend = h("ul", { class: "legend" }, series.map((sr, i) => h("li", {},
    legendSample(i), sr.label)));
  return h("figure", { class: "chart" },
    h("figcaption", {}, h("span", { class: "chart-title", id: `${id}-t`, text: title })),
    svg,
    legend,
    h("p", { class: "latest", id: `${id}-d`, text: `Latest: ${latest}` }));
}

function legendSample(i) {
  return s("svg", { viewBox: "0 0 28 10", "aria-hidden": "true" },
    s("line", { class: `series s${i % 6}`, x1: 0, x2: 28, y1: 5, y2: 5,
      "stroke-dasharray": DASHES[i % 6] || null }));
}

function fmtValue(v, unit) {
  if (unit === "ms") return `${v.toFixed(1)} ms`;
  if (unit === "%") return `${v.toFixed(1)} %`;
  if (unit === "/s") return `${v.toFixed(1)}/s`;
  return fmtTick(v);
}

// -- fleet --------------------------------------------------------------------------------

function learnedCosts(state) {
  // replica id -> predicted device time of a 1,000-token batch, per gateway (the median).
  const byReplica = new Map();
  for (const gw of state.gateways) {
    for (const cm of gw.costModels) {
      const cost = (seconds(cm.intercept) || 0) + (seconds(cm.perToken) || 0) * 1000;
      if (!byReplica.has(cm.replicaId)) byReplica.set(cm.replicaId, []);
      byReplica.get(cm.replicaId).push({ cost, samples: Number(cm.samples) });
    }
  }
  const out = new Map();
  for (const [rid, list] of byReplica) {
    const learned = list.filter((x) => x.samples > 0 && x.cost > 0).map((x) => x.cost).sort();
    if (learned.length) out.set(rid, learned[Math.floor(learned.length / 2)]);
  }
  return out;
}

function replicaHealth(member) {
  const load = member.load || {};
  const lease = epoch(member.leaseExpiresAt);
  const left = lease === null ? null : lease - now();
  if (load.draining) return { icon: "◐", text: "draining", cls: "state-warn" };
  if (left !== null && left < 0) return { icon: "○", text: "lease lapsed", cls: "state-bad" };
  const failed = Number(load.batchesFailed || 0), total = Number(load.batchesTotal || 0);
  if (total > 20 && failed / total > 0.05) {
    return { icon: "▲", text: `failing ${pct(failed / total, 1)}`, cls: "state-bad" };
  }
  return { icon: "●", text: "up", cls: "state-ok" };
}

const BREAKER = {
  BREAKER_STATE_CLOSED: { text: "● closed", cls: "state-ok" },
  BREAKER_STATE_OPEN: { text: "✕ open", cls: "state-bad" },
  BREAKER_STATE_HALF_OPEN: { text: "◐ half-open", cls: "state-warn" },
};

function breakerText(state) {
  return BREAKER[state] || { text: "– not reported", cls: "state-idle" };
}

function renderFleet(state, fleetInfo) {
  const replicas = state.replicas;
  const models = [...new Set(replicas.map((m) => m.replica.model))].sort();
  const draining = replicas.filter((m) => m.load && m.load.draining).length;
  const summary = `${replicas.length} replica${replicas.length === 1 ? "" : "s"} of ` +
    `${models.length} model${models.length === 1 ? "" : "s"}` +
    (draining ? `, ${draining} draining` : "") +
    `; ${state.gateways.length} gateway${state.gateways.length === 1 ? "" : "s"} reporting` +
    (fleetInfo.warming_up ? " — warming up: replicas of the previous controller are still " +
      "re-registering" : "");
  document.getElementById("fleet-summary").textContent = summary;
  const costs = learnedCosts(state);
  const fastest = Math.min(...costs.values());
  const tables = models.map((model) => {
    const route = state.routing.find((r) => r.model === model) || {};
    const rows = replicas.filter((m) => m.replica.model === model)
      .sort((a, b) => (a.replica.version + a.replica.replicaId)
        .localeCompare(b.replica.version + b.replica.replicaId));
    const role = (v) => v === route.stableVersion ? "stable"
      : v === route.canaryVersion ? `canary ${num(route.canaryWeightBp / 100, 2)} %` : "idle";
    return h("table", { class: "replicas", "data-model": model },
      h("caption", {}, `${model} — stable ${route.stableVersion || "none"}` +
        (route.canaryVersion ? `, canary ${route.canaryVersion} at ` +
          `${num(route.canaryWeightBp / 100, 2)} %` : "")),
      h("thead", {}, h("tr", {},
        ["Replica", "Version", "Health", "Runtime", "Hardware"].map((c) => h("th", { scope: "col", text: c })),
        ["Slots busy", "Advertised speed", "Learned cost (1k tokens)", "Learned speed",
          "Batches (failed)"].map((c) => h("th", { scope: "col", class: "num", text: c })),
        h("th", { scope: "col", text: "Actions" }))),
      h("tbody", {}, rows.map((m) => {
        const r = m.replica, load = m.load || {};
        const health = replicaHealth(m);
        const cost = costs.get(r.replicaId);
        const key = r.replicaId;
        const drainAction = load.draining ? "undrain" : "drain";
        return h("tr", { "data-replica-id": r.replicaId },
          h("th", { scope: "row", text: r.replicaId }),
          h("td", {}, `${r.version} `, h("span", { class: "detail", text: `(${role(r.version)})` })),
          h("td", {}, h("span", { class: `state ${health.cls}`, text: `${health.icon} ${health.text}` })),
          h("td", { text: r.runtime || "simulated" }),
          h("td", { text: r.hardware || "–" }),
          h("td", { class: "num", text: `${load.busySlots || 0} / ${r.slots}` }),
          h("td", { class: "num", text: `${num(r.speed, 2)}×` }),
          h("td", { class: "num", text: cost === undefined ? "learning…" : `${(cost * 1000).toFixed(1)} ms` }),
          h("td", { class: "num", text: cost === undefined ? "–" : `${num(fastest / cost, 2)}×` }),
          h("td", { class: "num", text: `${num(load.batchesTotal)} (${num(load.batchesFailed)})` }),
          h("td", {}, h("button", {
            type: "button", class: drainAction === "drain" ? "danger" : "",
            "data-key": `${drainAction}-${key}`, "data-action": drainAction,
            "aria-label": `${drainAction === "drain" ? "Drain" : "Undrain"} ${r.replicaId}`,
            onclick: () => act(drainAction, r.replicaId,
              `/api/replicas/${encodeURIComponent(r.replicaId)}/${drainAction}`),
            text: drainAction === "drain" ? "Drain" : "Undrain",
          })));
      })));
  });
  replace(document.getElementById("fleet-models"),
    tables.length ? tables : h("p", { text: "No replica is registered." }));

  document.getElementById("gateway-note").textContent =
    "Breaker: whether the gateway sends the replica work (● closed: normally; ✕ open: nothing " +
    "until its backoff passes, the replica failed too often; ◐ half-open: a few probes). Cost " +
    "models are each gateway's online fit of batch device time.";
  const gws = state.gateways.map((gw) => {
    const costs = new Map(gw.costModels.map((cm) => [cm.replicaId, cm]));
    const breakers = new Map((gw.breakers || []).map((b) => [b.replicaId, b.state]));
    const rids = [...new Set([...breakers.keys(), ...costs.keys()])].sort();
    const open = [...breakers.values()].filter((st) => st === "BREAKER_STATE_OPEN").length;
    return h("table", { class: "gateway", "data-gateway-id": gw.gatewayId },
      h("caption", {}, `${gw.gatewayId} — concurrency limit ${gw.concurrencyLimit}, ` +
        `${gw.inflight} in flight, ${open ? `${open} breaker${open === 1 ? "" : "s"} open, ` : ""}` +
        `last report ${ago(epoch(gw.lastReportAt))}`),
      h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "Replica" }),
        h("th", { scope: "col", text: "Breaker" }),
        ["Intercept", "Per token", "Per decode step", "Batches learned from"].map((c) =>
          h("th", { scope: "col", class: "num", text: c })))),
      h("tbody", {}, rids.map((rid) => {
        const cm = costs.get(rid);
        const br = breakerText(breakers.get(rid));
        return h("tr", { "data-gateway-replica": rid },
          h("th", { scope: "row", text: rid }),
          h("td", { class: "breaker" }, h("span", { class: `state ${br.cls}`, text: br.text })),
          h("td", { class: "num", text: cm ? ms(cm.intercept, 2) : "learning…" }),
          h("td", { class: "num", text: cm ? `${((seconds(cm.perToken) || 0) * 1e6).toFixed(2)} µs` : "–" }),
          h("td", { class: "num", text: cm ? ms(cm.perStep, 2) : "–" }),
          h("td", { class: "num", text: cm ? num(cm.samples) : "0" }));
      })));
  });
  replace(document.getElementById("gateways"),
    gws.length ? gws : h("p", { text: "No gateway has reported in the last minute." }));
}

// -- traffic ------------------------------------------------------------------------------

function smooth(points, n) {
  return points.map((p, i) => {
    const window = points.slice(Math.max(0, i - n + 1), i + 1);
    return [p[0], window.reduce((a, q) => a + q[1], 0) / window.length];
  });
}

function renderTraffic(state) {
  const select = document.getElementById("traffic-model");
  const points = [...ui.traffic.values()].sort((a, b) => a.t - b.t);
  const models = [...new Set(points.flatMap((p) => Object.keys(p.models)))].sort();
  const wanted = ["", ...models];
  const have = [...select.options].map((o) => o.value);
  if (JSON.stringify(have) !== JSON.stringify(wanted)) {
    const keep = select.value;
    select.replaceChildren(...wanted.map((m) => h("option", { value: m, text: m || "All models" })));
    select.value = wanted.includes(keep) ? keep : "";
  }
  const model = select.value;
  const slot = ui.trafficSlot;
  const to = now(), from = to - HORIZON_S;
  const pick = (p) => {
    if (model) return p.models[model] ? [p.models[model]] : [];
    return Object.values(p.models);
  };
  // Rates over a trailing 3-slot window: gateways report about once a second, so one second
  // can hold two reports and the next none; the average does not show that as an outage.
  const series = (field) => smooth(points.map((p) =>
    [p.t, pick(p).reduce((a, m) => a + (m[field] || 0), 0) / slot]), 3);
  const quant = (field) => points.map((p) => {
    const list = pick(p).map((m) => m[field]).filter((v) => v !== undefined);
    return [p.t, list.length ? Math.max(...list) : NaN];
  });
  const limits = points.map((p) => [p.t, Object.values(p.gateways).reduce((a, g) => a + g.limit, 0)]);
  const inflight = points.map((p) => [p.t, Object.values(p.gateways).reduce((a, g) => a + g.inflight, 0)]);
  const busy = points.map((p) => {
    const loads = model ? [p.load[model]].filter(Boolean) : Object.values(p.load);
    return [p.t, loads.reduce((a, l) => a + l.busy, 0)];
  });
  const slots = points.map((p) => {
    const loads = model ? [p.load[model]].filter(Boolean) : Object.values(p.load);
    return [p.t, loads.reduce((a, l) => a + l.slots, 0)];
  });
  const offered = (series("offered").at(-1) || [0, 0])[1];
  const goodput = (series("ok").at(-1) || [0, 0])[1];
  document.getElementById("traffic-summary").textContent = points.length
    ? `Last 3 s: ${offered.toFixed(1)} requests/s offered, ${goodput.toFixed(1)}/s goodput ` +
      `(answered in time)${offered ? `, ${pct(goodput / offered, 1)} of offered` : ""}. ` +
      `${points.length} s of history kept in the controller's memory (up to ${HORIZON_S / 60} min).`
    : "No traffic history yet: the controller records what gateways report from now on.";
  replace(document.getElementById("traffic-charts"),
    lineChart({ title: "Goodput against offered load (3 s average)", yLabel: "requests/s",
      unit: "/s",
      relative: true, from, to, series: [
        { label: "offered", points: series("offered") },
        { label: "goodput (in time)", points: series("ok") },
        { label: "errors", points: series("error") },
        { label: "shed", points: series("shed") },
        { label: "late", points: series("late") },
      ] }),
    lineChart({ title: "Latency of answered requests", yLabel: "milliseconds", unit: "ms",
      relative: true, from, to, series: [
        { label: "p50", points: quant("p50_ms") },
        { label: "p95", points: quant("p95_ms") },
        { label: "p99", points: quant("p99_ms") },
      ] }),
    lineChart({ title: "Gateway concurrency limit (adaptive limiter)", yLabel: "requests",
      relative: true, from, to, series: [
        { label: "limit (all gateways)", points: limits },
        { label: "in flight", points: inflight },
      ] }),
    lineChart({ title: `Replica slots busy${model ? ` (${model})` : ""}`, yLabel: "slots",
      relative: true, from, to, series: [
        { label: "busy", points: busy },
        { label: "total", points: slots },
      ] }),
    lineChart({ title: "Sheds by reason, all models (3 s average)", yLabel: "requests/s",
      unit: "/s", relative: true, from, to, series: shedSeries(points, slot) }));
  renderTenants(state, points, slot);

  const windowRows = state.outcomes.filter((o) => !model || o.model === model);
  document.getElementById("window-len").textContent = "60";
  replace(document.getElementById("traffic-versions"),
    windowRows.length ? h("table", { id: "version-outcomes" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "Model" }),
        h("th", { scope: "col", text: "Version" }),
        ["Requests", "Errors", "Shed", "Error rate", "p50", "p95"].map((c) =>
          h("th", { scope: "col", class: "num", text: c })))),
      h("tbody", {}, windowRows.map((o) => h("tr", {},
        h("th", { scope: "row", text: o.model }),
        h("td", { text: o.metrics.version }),
        h("td", { class: "num", text: num(o.metrics.requests) }),
        h("td", { class: "num", text: num(o.metrics.errors) }),
        h("td", { class: "num", text: num(o.metrics.shed) }),
        h("td", { class: "num", text: pct(o.metrics.errorRate) }),
        h("td", { class: "num", text: ms(o.metrics.p50) }),
        h("td", { class: "num", text: ms(o.metrics.p95) })))))
      : h("p", { text: "No outcome reported in the window." }));
  document.getElementById("traffic-note").textContent =
    "Sheds by reason and per-tenant counts are each gateway's own counters since it started, " +
    "summed over the gateways reporting now; rates are their increase per second (a gateway " +
    "that restarted counts from zero again, and is not shown as negative traffic).";
}

function shedSeries(points, slot) {
  // One line per shed reason seen in the window (reasons are the gateways' fixed labels).
  const reasons = [...new Set(points.flatMap((p) => Object.keys(p.sheds || {})))].sort();
  if (!reasons.length) return [{ label: "no sheds", points: points.map((p) => [p.t, 0]) }];
  return reasons.map((reason) => ({
    label: reason.replace(/_/g, " "),
    points: smooth(points.map((p) => [p.t, ((p.sheds || {})[reason] || 0) / slot]), 3),
  }));
}

const TENANT_COLUMNS = [
  ["requests", "Requests"], ["admitted", "Admitted"], ["quotaRefused", "Quota refused"],
  ["shed", "Shed (other reasons)"], ["ok", "OK"], ["errors", "Errors"],
];
const RATE_WINDOW_S = 10;

function renderTenants(state, points, slot) {
  // Totals: every reporting gateway's cumulative counts, summed; rates: the history's last
  // RATE_WINDOW_S seconds of increases.
  const totals = new Map();
  for (const gw of state.gateways) {
    for (const t of gw.tenants || []) {
      const row = totals.get(t.tenant) || Object.fromEntries(TENANT_COLUMNS.map(([k]) => [k, 0]));
      for (const [k] of TENANT_COLUMNS) row[k] += Number(t[k] || 0);
      totals.set(t.tenant, row);
    }
  }
  const recent = points.slice(-Math.max(1, Math.round(RATE_WINDOW_S / slot)));
  const span = Math.max(1, recent.length) * slot;
  const rate = (tenant, field) =>
    recent.reduce((a, p) => a + (((p.tenants || {})[tenant] || {})[field] || 0), 0) / span;
  const names = [...totals.keys()].sort();
  replace(document.getElementById("traffic-tenants"),
    names.length ? h("table", { id: "tenant-traffic" },
      h("caption", {}, "Per tenant, since each gateway started (all gateways)"),
      h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "Tenant" }),
        TENANT_COLUMNS.map(([, c]) => h("th", { scope: "col", class: "num", text: c })),
        h("th", { scope: "col", class: "num", text: `Requests/s (last ${RATE_WINDOW_S} s)` }),
        h("th", { scope: "col", class: "num", text: `Refused by quota/s` }))),
      h("tbody", {}, names.map((name) => {
        const row = totals.get(name);
        return h("tr", { "data-tenant": name },
          h("th", { scope: "row", text: name }),
          TENANT_COLUMNS.map(([k]) => h("td", { class: "num", "data-field": k, text: num(row[k]) })),
          h("td", { class: "num", "data-field": "rate", text: num(rate(name, "requests"), 1) }),
          h("td", { class: "num", "data-field": "quota-rate", text: num(rate(name, "quota_refused"), 1) }));
      })))
      : h("p", { text: "No gateway reports tenants (none configured, or none reporting)." }));
}

// -- rollouts -----------------------------------------------------------------------------

const ACTION_ICON = {
  START: "◆", ADVANCE: "▲", HOLD: "●", ROLLBACK: "✕", PROMOTE: "★", ABORT: "■",
};

function actionName(d) {
  return shortState(d.action, "DECISION_ACTION_").toUpperCase();
}

function rolloutStateText(r) {
  const st = shortState(r.state, "ROLLOUT_STATE_");
  const icon = { progressing: "▶", promoted: "★", "rolled back": "✕", aborted: "■",
    analyzed: "◇" }[st] || "?";
  const cls = { progressing: "state-warn", promoted: "state-ok", "rolled back": "state-bad",
    aborted: "state-bad", analyzed: "state-idle" }[st] || "state-idle";
  return h("span", { class: `state ${cls}`, text: `${icon} ${st}` });
}

// The gates in force on a rollout, as the page names them (issue #20).
function gateNames(r) {
  const running = r.state === "ROLLOUT_STATE_PROGRESSING";
  const names = [];
  if (running && r.paused) names.push(r.autoRollback ? "paused" : "paused, no auto-rollback");
  if (running && r.awaitingApproval) names.push("awaiting approval");
  const mode = shortState(r.approval, "APPROVAL_MODE_");
  if (mode && mode !== "none" && mode !== "unspecified") names.push(`approval: ${mode}`);
  if (r.analysisOnly) names.push("analysis only");
  return names;
}

function gateBadges(r) {
  const names = gateNames(r);
  return names.length ? h("span", { class: "gates state state-warn", "data-field": "gates",
    text: `⏸ ${names.join(" · ")}` }) : null;
}

function armCells(arm) {
  if (!arm) return [h("td", { class: "num", text: "–" }), h("td", { class: "num", text: "–" }),
    h("td", { class: "num", text: "–" })];
  return [
    h("td", { class: "num", text: `${num(arm.requests)} (${num(Number(arm.errors) + Number(arm.shed))})` }),
    h("td", { class: "num", text: pct(arm.errorRate) }),
    h("td", { class: "num", text: `${ms(arm.p50)} / ${ms(arm.p95)}` }),
  ];
}

function comparison(rollout, decision, state) {
  const rows = [
    ["Requests", (a) => num(a.requests)],
    ["Errors + shed", (a) => num(Number(a.errors) + Number(a.shed))],
    ["Error rate", (a) => pct(a.errorRate)],
    ["p50 latency", (a) => ms(a.p50)],
    ["p95 latency", (a) => ms(a.p95)],
  ];
  const windowOf = (v) => (state.outcomes.find((o) => o.model === rollout.model &&
    o.metrics.version === v) || {}).metrics;
  const table = (caption, base, canary) => h("table", { class: "compare" },
    h("caption", { text: caption }),
    h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "Metric" }),
      h("th", { scope: "col", class: "num", text: `Baseline ${rollout.baselineVersion}` }),
      h("th", { scope: "col", class: "num", text: `Canary ${rollout.canaryVersion}` }))),
    h("tbody", {}, rows.map(([label, f]) => h("tr", {},
      h("th", { scope: "row", text: label }),
      h("td", { class: "num", text: base ? f(base) : "–" }),
      h("td", { class: "num", text: canary ? f(canary) : "–" })))));
  return [
    decision && decision.baseline
      ? table(`Last judged window (decision #${decision.id}, ${clock(epoch(decision.decidedAt))})`,
        decision.baseline, decision.canary)
      : h("p", { text: "No window judged yet." }),
    table("Rolling 60 s window (every gateway's reports)",
      windowOf(rollout.baselineVersion), windowOf(rollout.canaryVersion)),
  ];
}

function weightChart(rollout, decisions) {
  const start = epoch(rollout.startedAt);
  const running = rollout.state === "ROLLOUT_STATE_PROGRESSING";
  const end = running ? now() : Math.max(epoch(rollout.updatedAt), start + 1);
  const pts = [[start, decisions.length ? decisions[0].fromPercent : 0]];
  for (const d of decisions) pts.push([epoch(d.decidedAt), d.toPercent]);
  const markers = decisions.filter((d) => actionName(d) !== "HOLD").map((d) => ({
    t: epoch(d.decidedAt), v: d.toPercent, symbol: ACTION_ICON[actionName(d)] || "?",
  }));
  const holds = decisions.filter((d) => actionName(d) === "HOLD").length;
  const chart = lineChart({ title: `Canary weight over time — ${rollout.model} ` +
      `${rollout.canaryVersion}`, yLabel: "canary %", unit: "%", yMax: 100, from: start,
    to: end + (end - start) * 0.02, relative: false, markers,
    series: [{ label: "canary weight", points: pts, step: true }] });
  chart.append(h("p", { class: "detail", text: "Marks: ◆ start · ▲ advance · ✕ rollback · " +
    `★ promote · ■ abort; ${holds} hold${holds === 1 ? "" : "s"} (listed in the trail).` }));
  return chart;
}

function trail(decisions) {
  const shown = decisions.slice(-200).reverse();
  return h("div", { class: "trail", tabindex: "0", role: "region",
    "aria-label": "Decision trail, newest first" },
  h("table", { class: "decision-trail" },
    h("thead", {}, h("tr", {},
      ["#", "Time", "Decision", "Reason", "Weight"].map((c) => h("th", { scope: "col", text: c })),
      ["Baseline req (err+shed)", "Baseline err", "Baseline p50 / p95",
        "Canary req (err+shed)", "Canary err", "Canary p50 / p95"].map((c) =>
        h("th", { scope: "col", class: "num", text: c })),
      h("th", { scope: "col", text: "Evidence" }))),
    h("tbody", {}, shown.map((d) => h("tr", { "data-decision-id": d.id, "data-action": actionName(d) },
      h("th", { scope: "row", text: d.id }),
      h("td", { text: clock(epoch(d.decidedAt)) }),
      h("td", { class: "state", text: `${ACTION_ICON[actionName(d)] || "?"} ${actionName(d).toLowerCase()}` +
        (d.applied === false && actionName(d) !== "HOLD" ? " (not applied: analysis only)" : "") }),
      h("td", { text: d.reason }),
      h("td", { class: "num", text: `${num(d.fromPercent, 1)} → ${num(d.toPercent, 1)} %` }),
      armCells(d.baseline), armCells(d.canary),
      h("td", { class: "detail" }, d.detail || "",
        Object.keys(d.statistics || {}).length ? h("br") : null,
        Object.entries(d.statistics || {}).map(([k, v]) => `${k}=${typeof v === "number" ? +v.toPrecision(4) : v}`).join(", "),
        Number(d.neededRequests) ? ` (needs ${num(d.neededRequests)} more requests)` : ""))))));
}

function rolloutActions(rollout) {
  if (rollout.state !== "ROLLOUT_STATE_PROGRESSING") return null;
  const model = rollout.model;
  const path = (a) => `/api/rollouts/${encodeURIComponent(model)}/${a}`;
  const c = ui.confirm;
  if (c && c.target === model && c.action === "promote") {
    return h("div", { class: "confirm", role: "group", "aria-label": "Confirm promote" },
      `Send all of ${model}'s traffic to ${rollout.canaryVersion} and make it stable?`,
      h("button", { type: "button", class: "primary", "data-key": `confirm-promote-${model}`,
        "data-action": "confirm-promote", onclick: () => act("promote", model, path("promote")),
        text: "Confirm promote" }),
      h("button", { type: "button", "data-key": `cancel-${model}`,
        onclick: () => { ui.confirm = null; render(true); }, text: "Cancel" }));
  }
  if (c && c.target === model && c.action === "abort") {
    const id = `abort-reason-${model}`;
    return h("form", { class: "confirm", "aria-label": "Confirm abort", onsubmit: (e) => {
      e.preventDefault();
      act("abort", model, path("abort"), { reason: document.getElementById(id).value });
    } },
    h("label", { for: id, text: "Reason (stored with the decision)" }),
    h("input", { id, type: "text", maxlength: "1024", "data-key": `confirm-abort-${model}`,
      value: "aborted from the console" }),
    h("button", { type: "submit", class: "danger", "data-action": "confirm-abort",
      text: `Abort: route all traffic back to ${rollout.baselineVersion}` }),
    h("button", { type: "button", "data-key": `cancel-${model}`,
      onclick: () => { ui.confirm = null; render(true); }, text: "Cancel" }));
  }
  if (c && c.target === model && c.action === "approve") {
    return h("div", { class: "confirm", role: "group", "aria-label": "Confirm approve" },
      rollout.stepIndex + 1 >= rollout.stepPercents.length
        ? `Approve the promotion: make ${rollout.canaryVersion} ${model}'s stable version?`
        : `Approve the advance to ${num(rollout.stepPercents[rollout.stepIndex + 1], 2)} %?`,
      h("button", { type: "button", class: "primary", "data-key": `confirm-approve-${model}`,
        "data-action": "confirm-approve", onclick: () => act("approve", model, path("approve")),
        text: "Confirm approve" }),
      h("button", { type: "button", "data-key": `cancel-${model}`,
        onclick: () => { ui.confirm = null; render(true); }, text: "Cancel" }));
  }
  if (c && c.target === model && c.action === "pause") {
    const id = `pause-auto-rollback-${model}`;
    return h("form", { class: "confirm", "aria-label": "Confirm pause", onsubmit: (e) => {
      e.preventDefault();
      act("pause", model, path("pause"), { auto_rollback: document.getElementById(id).checked });
    } },
    `Hold ${model}'s canary at ${num(rollout.canaryWeightBp / 100, 2)} %; judging continues.`,
    h("input", { id, type: "checkbox", checked: true, "data-key": `confirm-pause-${model}` }),
    h("label", { for: id, text: "Still roll back a proven regression" }),
    h("button", { type: "submit", class: "primary", "data-action": "confirm-pause",
      text: "Pause" }),
    h("button", { type: "button", "data-key": `cancel-${model}`,
      onclick: () => { ui.confirm = null; render(true); }, text: "Cancel" }));
  }
  const gates = new Set(ui.gates || []);
  return h("div", { class: "actions-row" },
    rollout.analysisOnly ? null : h("button", { type: "button", class: "primary",
      "data-key": `promote-${model}`, "data-action": "promote",
      onclick: () => askFirst("promote", model), text: `Promote ${rollout.canaryVersion}…` }),
    h("button", { type: "button", class: "danger", "data-key": `abort-${model}`,
      "data-action": "abort", onclick: () => askFirst("abort", model), text: "Abort…" }),
    gates.has("pause") && !rollout.paused ? h("button", { type: "button",
      "data-key": `pause-${model}`, "data-action": "pause",
      onclick: () => askFirst("pause", model), text: "Pause…" }) : null,
    gates.has("resume") && rollout.paused ? h("button", { type: "button",
      "data-key": `resume-${model}`, "data-action": "resume",
      onclick: () => act("resume", model, path("resume")), text: "Resume" }) : null,
    gates.has("approve") && rollout.awaitingApproval ? h("button", { type: "button",
      class: "primary", "data-key": `approve-${model}`, "data-action": "approve",
      onclick: () => askFirst("approve", model), text: "Approve…" }) : null,
    ui.operator ? null : h("span", { class: "note", text: "Needs the operator credential (Actions)." }));
}

function renderRollouts(state) {
  const rollouts = [...state.rollouts].sort((a, b) => Number(b.id) - Number(a.id));
  const running = rollouts.filter((r) => r.state === "ROLLOUT_STATE_PROGRESSING");
  const featured = running.length ? running : rollouts.slice(0, 1);
  const byRollout = (r) => [...ui.decisions.values()].filter((d) => d.rolloutId === r.id)
    .sort((a, b) => Number(a.id) - Number(b.id));
  const cards = featured.map((r) => {
    const decisions = byRollout(r);
    const last = decisions.at(-1) || r.lastDecision;
    const judged = [...decisions].reverse().find((d) => d.baseline && d.canary);
    const steps = r.stepPercents.map((p, i) => h("li", {
      class: i === r.stepIndex ? "current" : i < r.stepIndex ? "done" : "",
      "aria-current": i === r.stepIndex && r.state === "ROLLOUT_STATE_PROGRESSING" ? "step" : null,
      text: `${i < r.stepIndex ? "✓ " : i === r.stepIndex ? "▶ " : ""}${num(p, 1)} %` }));
    return h("article", { class: "rollout", "data-rollout-id": r.id, "aria-labelledby": `rollout-${r.id}` },
      h("div", { class: "rollout-head" },
        h("h3", { id: `rollout-${r.id}`, text: `${r.model}: ${r.baselineVersion} → ${r.canaryVersion} (#${r.id})` }),
        rolloutStateText(r),
        gateBadges(r),
        h("span", { class: "weight", text: `canary weight ${num(r.canaryWeightBp / 100, 2)} %` }),
        h("span", { text: `step ${Math.min(r.stepIndex + 1, r.stepPercents.length)} of ${r.stepPercents.length}` }),
        h("span", { class: "detail", text: `started ${clock(epoch(r.startedAt))}` })),
      h("ol", { class: "steps", "aria-label": "Steps" }, steps,
        h("li", { text: r.state === "ROLLOUT_STATE_PROMOTED" ? "✓ promoted" : "promote" })),
      last ? h("p", { class: "last-decision" }, h("strong", { text: "Latest decision: " }),
        `${ACTION_ICON[actionName(last)] || ""} ${actionName(last).toLowerCase()} — ${last.reason}` +
        (last.detail ? `: ${last.detail}` : "")) : null,
      rolloutActions(r),
      h("div", { class: "rollout-grid" },
        weightChart(r, decisions),
        h("div", {}, comparison(r, judged, state))),
      h("h4", { text: `Decision trail (${decisions.length})` }),
      decisions.length ? trail(decisions) : h("p", { text: "No decision yet." }));
  });
  replace(document.getElementById("rollout-current"),
    cards.length ? cards : h("p", { text: "No rollout yet. Start one with `halcyon rollout start`." }));
  const past = rollouts.filter((r) => !featured.includes(r));
  replace(document.getElementById("rollout-past"), past.length ? h("table", { id: "past-rollouts" },
    h("thead", {}, h("tr", {}, ["#", "Model", "Baseline → canary", "State", "Final weight",
      "Started", "Last change", "Last decision"].map((c) => h("th", { scope: "col", text: c })))),
    h("tbody", {}, past.map((r) => h("tr", { "data-rollout-id": r.id },
      h("th", { scope: "row", text: r.id }),
      h("td", { text: r.model }),
      h("td", { text: `${r.baselineVersion} → ${r.canaryVersion}` }),
      h("td", {}, rolloutStateText(r), r.analysisOnly ? " (analysis only)" : ""),
      h("td", { class: "num", text: `${num(r.canaryWeightBp / 100, 2)} %` }),
      h("td", { text: new Date(epoch(r.startedAt) * 1000).toLocaleString("en-GB") }),
      h("td", { text: new Date(epoch(r.updatedAt) * 1000).toLocaleString("en-GB") }),
      h("td", { text: r.lastDecision ? `${actionName(r.lastDecision).toLowerCase()}: ${r.lastDecision.reason}` : "–" })))))
    : h("p", { text: "None." }));
  const gates = state.capabilities ? state.capabilities.gates : [];
  document.getElementById("gates-note").textContent = gates && gates.length
    ? `Rollout gates: ${gates.join(", ").replace("analysis_only", "analysis only")} ` +
      "(pause, resume and approve act on a running rollout; analysis only is " +
      "`halcyon rollout start --analysis-only`)."
    : "Rollout gates (pause, resume, approve, analysis only) are not available on this controller yet.";
}

// -- drawing ------------------------------------------------------------------------------

function render(force) {
  const doc = ui.state;
  if (!doc) return;
  if (force) ui.rendered = {};
  const state = doc.state;
  if (changed("fleet", [state.replicas, state.routing, state.gateways, doc.fleet,
    Math.floor(now() / 5)])) {
    renderFleet(state, doc.fleet);
  }
  if (!document.getElementById("panel-traffic").hidden || force) {
    if (changed("traffic", [ui.traffic.size, Math.max(0, ...ui.traffic.keys()), state.outcomes,
      state.gateways.map((g) => g.tenants), document.getElementById("traffic-model").value])) {
      renderTraffic(state);
    }
  } else {
    ui.rendered.traffic = null;
  }
  if (changed("rollouts", [state.rollouts, ui.decisions.size, state.outcomes, ui.confirm,
    ui.operator, state.routing])) {
    ui.gates = doc.capabilities ? doc.capabilities.gates : [];
    renderRollouts({ ...state, capabilities: doc.capabilities });
  }
}

async function main() {
  setupTabs();
  document.getElementById("sign-in").addEventListener("submit", signIn);
  document.getElementById("sign-out").addEventListener("click", signOut);
  document.getElementById("traffic-model").addEventListener("change", () => render(true));
  for (const tab of TABS) {
    document.getElementById(`tab-${tab}`).addEventListener("click", () => render());
  }
  await refreshSession();
  try {
    const doc = await getJSON("/api/state");
    doc.traffic = await getJSON("/api/traffic");
    onState(doc);
  } catch (err) {
    setConnection("down");
  }
  connect();
}

document.addEventListener("DOMContentLoaded", main);
