// Nodes: each node's inventory, heartbeat age, state, health and running jobs, filtered and paged (a thousand
// nodes stay one screen at a time); a node's GPUs one by one on demand. Admins cordon, drain and uncordon a node
// or one GPU (a drain asks first: it evicts the jobs there). Live: node events reload the list, heartbeats and
// samples change the figures in place.
import {
  api, applySample, byNodeName, bytes, duration, empty, errorBox, fill, gpuState, h, holderText, holdersKey,
  keepSampled, kind, liveJobs, me, num, onEvent, section, setQuery, tableBox, throttle,
} from "../app.js";
import { SUBJECT, WILDCARD } from "../contracts.js";

const PAGE_SIZE = 50;
const STATES = ["ready", "lost", "cordoned", "draining"];
const STALE_HEARTBEATS = 3; // a heartbeat older than this many intervals reads as late
const HEARTBEAT_SECONDS = 5; // a node's heartbeat interval until its next heartbeat event says
const query = new URLSearchParams(location.search);
const filters = { q: query.get("node") ?? query.get("q") ?? "", state: STATES.includes(query.get("state")) ? query.get("state") : "" };
const opened = new Set(query.get("node") ? [query.get("node")] : []); // nodes whose GPUs are shown
let pageNo = 0;

let nodes = []; // GET /v1/nodes, live figures applied
let byName = new Map(); // the same nodes by name
let seenAt = new Map(); // node -> when it was last heard of (ms, this browser's clock)
const intervals = new Map(); // node -> its heartbeat interval (s), from its heartbeat events
let jobsByNode = new Map(); // node -> its running and placed jobs the user may see
let names = new Map();
let loadError = null;

// ---------------------------------------------------------------- layout

const form = h("form", { class: "filters", role: "search", onsubmit: (e) => e.preventDefault() },
  h("div", {},
    h("label", { for: "node-q" }, "Node"),
    h("input", { id: "node-q", type: "search", placeholder: "part of its name", size: 18, value: filters.q,
      oninput: throttle((e) => restart({ q: e.target.value.trim() }), 250) }),
  ),
  h("div", {},
    h("label", { for: "node-state" }, "State"),
    h("select", { id: "node-state", onchange: (e) => restart({ state: e.target.value }) },
      h("option", { value: "" }, "any"),
      STATES.map((s) => h("option", { value: s, selected: s === filters.state }, s)),
    ),
  ),
);
const listEl = section("nodes", null);
listEl.before(form);
const resultEl = h("div", { id: "node-action-result", "aria-live": "polite" });
form.after(resultEl);

function restart(values) {
  Object.assign(filters, values);
  setQuery({ q: filters.q, state: filters.state, node: "" });
  pageNo = 0;
  draw();
}

// ---------------------------------------------------------------- cells

function stateBadge(node) {
  const badge = h("span", { class: `state node-state-${node.state}`, "data-state": node.state }, node.state);
  const why = node.state !== "ready" && node.reason; // (the reason of its last cordon, drain or uncordon)
  return h("span", {}, badge, why ? h("div", { class: "hint" }, why) : null);
}

function age(node) {
  const seconds = (Date.now() - seenAt.get(node.node)) / 1000;
  return Math.max(0, seconds);
}

function heartbeat(node) {
  const el = h("span", { class: "heartbeat", "data-node": node.node });
  tickHeartbeat(el, node);
  return el;
}

function tickHeartbeat(el, node) {
  const seconds = age(node);
  el.textContent = `${duration(Math.round(seconds))} ago`; // (whole seconds: it ticks every second)
  el.title = new Date(seenAt.get(node.node)).toLocaleString();
  const late = seconds > STALE_HEARTBEATS * (intervals.get(node.node) ?? HEARTBEAT_SECONDS);
  el.classList.toggle("late", node.state === "lost" || late);
}

function inventory(node) {
  const models = new Map();
  for (const g of node.gpus) {
    const key = `${g.model} · ${bytes(g.memory_bytes)}`;
    models.set(key, (models.get(key) ?? 0) + 1);
  }
  return h("span", {},
    models.size ? [...models].map(([m, n]) => h("div", {}, `${n} × ${m}`)) : h("div", { class: "muted" }, "no GPUs"),
    h("div", { class: "muted" }, `${num(node.cpus)} CPUs · ${bytes(node.memory_bytes)}${node.simulated ? " · simulated" : ""}`),
    (node.notes ?? []).map((note) => h("div", { class: "hint node-note" }, note)), // (what its engine says: Slurm's)
  );
}

function health(node) {
  const bad = node.gpus.filter((g) => !g.healthy);
  const cordoned = node.gpus.filter((g) => g.cordoned && node.state === "ready");
  if (!bad.length && !cordoned.length) {
    return node.state === "lost" ? h("span", { class: "error-text" }, "not heard from") : h("span", { class: "ok" }, "all GPUs healthy");
  }
  return h("span", {},
    bad.map((g) => h("div", { class: "error-text" }, `GPU ${g.index} unhealthy: ${g.unhealthy_reason ?? "?"}`)),
    cordoned.length ? h("div", { class: "muted" }, `GPU ${cordoned.map((g) => g.index).join(", ")} cordoned`) : null,
  );
}

function running(node) {
  const jobs = jobsByNode.get(node.node) ?? [];
  const others = node.gpus.reduce((s, g) => s + g.holders.filter((x) => x.other).reduce((t, x) => t + x.fraction, 0), 0);
  if (!jobs.length && !others) return h("span", { class: "running-jobs muted" }, "none");
  const links = jobs.slice(0, 4).map((j) => h("div", {}, h("a", { href: `/jobs/${encodeURIComponent(j.job_id)}`, title: j.job_id }, j.name),
    h("span", { class: "muted" }, ` ${j.state}${me.admin ? ` · ${j.tenant}` : ""}`)));
  return h("span", { class: "running-jobs" }, links,
    jobs.length > 4 ? h("div", { class: "muted" }, `and ${jobs.length - 4} more`) : null,
    others ? h("div", { class: "muted" }, `another tenant's jobs on ${num(others)} GPU${others === 1 ? "" : "s"}`) : null);
}

/** The admin's buttons for a node, or one GPU of it (`gpu`): what applies in its state. */
function actions(node, gpu = null) {
  if (!me.admin) return null;
  const held = gpu == null ? node.state === "cordoned" || node.state === "draining" : gpu.cordoned || !gpu.healthy;
  const inherited = gpu != null && node.state !== "ready" && node.state !== "lost"; // its node's cordon
  const button = (action, cls) =>
    h("button", { class: `${action} ${cls ?? ""}`, type: "button", onclick: () => confirmAction(node, gpu, action) },
      action[0].toUpperCase() + action.slice(1));
  return h("span", { class: "actions" },
    !held && !inherited ? button("cordon") : null,
    node.state !== "draining" && !inherited ? button("drain", "danger") : null,
    held && !inherited ? button("uncordon") : null,
    inherited ? h("span", { class: "muted" }, `with ${node.node}`) : null,
  );
}

// ---------------------------------------------------------------- the table

function shownNodes() {
  const q = filters.q.toLowerCase();
  return nodes.filter((n) => (!q || n.node.toLowerCase().includes(q)) && (!filters.state || n.state === filters.state));
}

function draw() {
  if (loadError) {
    fill(listEl, errorBox(loadError));
    return;
  }
  if (!nodes.length) {
    fill(listEl, empty("No node has reported yet.",
      "A node appears with its executor's first heartbeat (gpuyard up, or gpuyard executor on a GPU machine)."));
    return;
  }
  const shown = shownNodes();
  if (!shown.length) {
    fill(listEl, empty("No node matches these filters.", "Clear the name or the state to see every node."));
    return;
  }
  const pages = Math.ceil(shown.length / PAGE_SIZE);
  pageNo = Math.min(pageNo, pages - 1);
  const rows = shown.slice(pageNo * PAGE_SIZE, (pageNo + 1) * PAGE_SIZE);
  const titles = ["Node", "State", "Heartbeat", "Inventory", "Health", "Running jobs", me.admin ? "Actions" : null];
  fill(listEl,
    tableBox(h("table", { id: "nodes-table" },
      h("thead", {}, h("tr", {}, titles.filter(Boolean).map((t) => h("th", { scope: "col" }, t)))),
      rows.map((node) => h("tbody", { "data-node": node.node },
        h("tr", { class: "node-row" },
          h("td", {},
            h("button", { class: "link toggle", type: "button", "aria-expanded": String(opened.has(node.node)),
              onclick: () => toggle(node.node) }, opened.has(node.node) ? "▾ " : "▸ ", h("strong", {}, node.node)),
            h("div", { class: "hint" }, `${node.gpus.length} GPU${node.gpus.length === 1 ? "" : "s"}`)),
          h("td", {}, stateBadge(node)),
          h("td", {}, heartbeat(node)),
          h("td", {}, inventory(node)),
          h("td", {}, health(node)),
          h("td", {}, running(node)),
          me.admin ? h("td", {}, actions(node)) : null,
        ),
        opened.has(node.node) ? h("tr", { class: "gpus-row" }, h("td", { colspan: titles.filter(Boolean).length }, gpuTable(node))) : null,
      )),
    )),
    h("div", { class: "pager" },
      h("button", { disabled: pageNo === 0, onclick: () => (pageNo--, draw()) }, "← Previous"),
      h("span", { class: "muted" }, `page ${pageNo + 1} of ${pages} · ${shown.length} of ${nodes.length} nodes`),
      h("button", { disabled: pageNo >= pages - 1, onclick: () => (pageNo++, draw()) }, "Next →"),
      h("span", { class: "hint" }, "Click a node's name for its GPUs."),
    ),
  );
}

function toggle(name) {
  if (opened.has(name)) opened.delete(name);
  else opened.add(name);
  draw();
}

function gpuTable(node) {
  const titles = ["GPU", "Model", "Use", "Memory", "Temperature", "Held by", "State", me.admin ? "Actions" : null];
  const numeric = new Set(["GPU", "Use", "Memory", "Temperature"]);
  return h("table", { class: "gpus", id: `gpus-${node.node}` },
    h("thead", {}, h("tr", {}, titles.filter(Boolean).map((t) => h("th", { scope: "col", class: numeric.has(t) ? "num" : null }, t)))),
    h("tbody", {}, node.gpus.map((g) => h("tr", { "data-gpu": g.index, "data-state": gpuState(g, node) },
      h("td", { class: "num" }, g.index),
      h("td", {}, g.model, h("div", { class: "muted mono" }, g.uuid)),
      h("td", { class: "num live-util" }, g.utilization_pct == null ? "—" : `${num(g.utilization_pct, 0)} %`),
      h("td", { class: "num live-mem" }, `${bytes(g.memory_used_bytes)} of ${bytes(g.memory_bytes)}`),
      h("td", { class: "num live-temp" }, g.temperature_c == null ? "—" : `${num(g.temperature_c, 1)} °C`),
      h("td", { class: "live-holders" }, holders(g)),
      h("td", { class: "gpu-state" }, gpuStateText(g, node)),
      me.admin ? h("td", {}, actions(node, g)) : null,
    ))),
  );
}

function holders(g) {
  if (!g.holders.length) return h("span", { class: "muted" }, "free");
  return g.holders.map((x, i) => [i ? h("br") : null, holderText(x, names, true)]);
}

function gpuStateText(g, node) {
  const state = gpuState(g, node);
  if (state === "unhealthy") return h("span", { class: "error-text" }, `unhealthy: ${g.unhealthy_reason ?? "?"}`);
  if (state === "cordoned") return h("span", { class: "state node-state-cordoned" }, "cordoned");
  return h("span", { class: "ok" }, state === "lost" ? "node lost" : "in service");
}

/** A sample's figures into the open GPU tables, in place (no redraw: a click in progress stays a click). */
function refreshFigures(node) {
  const table = document.getElementById(`gpus-${node.node}`);
  if (!table) return;
  for (const g of node.gpus) {
    const tr = table.querySelector(`tr[data-gpu="${g.index}"]`);
    if (!tr) continue;
    tr.querySelector(".live-util").textContent = g.utilization_pct == null ? "—" : `${num(g.utilization_pct, 0)} %`;
    tr.querySelector(".live-mem").textContent = `${bytes(g.memory_used_bytes)} of ${bytes(g.memory_bytes)}`;
    tr.querySelector(".live-temp").textContent = g.temperature_c == null ? "—" : `${num(g.temperature_c, 1)} °C`;
    fill(tr.querySelector(".live-holders"), holders(g));
  }
}

// ---------------------------------------------------------------- cordon, drain, uncordon

const WHAT = {
  cordon: "Nothing new is placed there; the jobs running there stay.",
  drain: "Nothing new is placed there, and the jobs running there are stopped (with their grace period) and queued again.",
  uncordon: "Jobs may be placed there again; an unhealthy mark is cleared too.",
};

function confirmAction(node, gpu, action) {
  const target = gpu == null ? node.node : `${node.node} GPU ${gpu.index}`;
  const evicted = gpu == null
    ? node.gpus.reduce((s, g) => s + g.holders.length, 0)
    : gpu.holders.length;
  const reason = h("input", { id: "action-reason", maxlength: 500, placeholder: "maintenance, a bad fan…", size: 40 });
  const dialog = h("dialog", { id: "node-action", class: "confirm" },
    h("form", { method: "dialog" },
      h("h2", {}, `${action[0].toUpperCase() + action.slice(1)} ${target}?`),
      h("p", {}, WHAT[action]),
      action === "drain" && evicted
        ? h("p", { class: "error" }, `${evicted} job replica${evicted === 1 ? "" : "s"} there will be evicted and requeued.`)
        : null,
      h("label", { for: "action-reason" }, "Reason (recorded with it)"),
      reason,
      h("div", { class: "row dialog-buttons" },
        h("button", { value: "cancel", type: "submit" }, "Cancel"),
        h("button", { value: "go", type: "submit", id: "action-confirm", class: action === "drain" ? "danger" : "primary" },
          action[0].toUpperCase() + action.slice(1)),
      ),
    ),
  );
  document.body.append(dialog);
  dialog.addEventListener("close", () => {
    dialog.remove();
    if (dialog.returnValue === "go") act(node.node, gpu?.index ?? null, action, reason.value.trim());
  });
  dialog.showModal();
  reason.focus();
}

async function act(node, gpu, action, reason) {
  const target = gpu == null ? node : `${node} GPU ${gpu}`;
  try {
    await api(`/v1/nodes/${encodeURIComponent(node)}/${action}`, { method: "POST", body: { gpu, reason } });
    fill(resultEl, h("p", { class: "ok" }, `${target}: ${action} done.`));
  } catch (err) {
    fill(resultEl, errorBox(`${target}: ${action} refused: ${err.message}`));
  }
  reloadNodes();
}

// ---------------------------------------------------------------- loading and live updates

async function loadNodes() {
  try {
    nodes = (await api("/v1/nodes"))
      .map((n) => keepSampled(n, byName.get(n.node)))
      .sort((a, b) => byNodeName(a.node, b.node));
    const now = Date.now();
    byName = new Map(nodes.map((n) => [n.node, n]));
    seenAt = new Map(nodes.map((n) => [n.node, now - n.last_seen_seconds_ago * 1000]));
    loadError = null;
  } catch (err) {
    loadError = err;
  }
  draw();
}

async function loadJobs() {
  try {
    const jobs = await liveJobs(10);
    names = new Map(jobs.map((j) => [j.job_id, j.name]));
    jobsByNode = new Map();
    for (const j of jobs) {
      for (const where of new Set(j.placements.map((p) => p.node))) {
        if (!jobsByNode.has(where)) jobsByNode.set(where, []);
        jobsByNode.get(where).push(j);
      }
    }
  } catch (err) {
    fill(resultEl, errorBox(`the running jobs could not be read: ${err.message}`));
    return;
  }
  draw();
}

const reloadNodes = throttle(loadNodes, 300);
const reloadJobs = throttle(loadJobs, 1000);

onEvent((e) => {
  const name = e.data?.node;
  if (kind(e) === SUBJECT.NODE_HEARTBEAT && seenAt.has(name) && byName.get(name)?.state !== "lost") {
    seenAt.set(name, Date.now());
    intervals.set(name, e.data.interval_seconds);
    const el = listEl.querySelector(`.heartbeat[data-node="${CSS.escape(name)}"]`);
    const node = byName.get(name);
    if (el && node) tickHeartbeat(el, node);
    return;
  }
  reloadNodes();
}, WILDCARD.NODE, () => reloadNodes());

onEvent((e) => {
  if (kind(e) !== SUBJECT.GPU_SAMPLE) return;
  const node = byName.get(e.data.node);
  if (!node) return;
  const before = holdersKey(node);
  applySample(node, e.data);
  if (holdersKey(node) !== before) reloadJobs(); // its jobs changed: the "Running jobs" column follows
  else refreshFigures(node);
}, WILDCARD.GPU);

const JOB_MOVES = [
  SUBJECT.JOB_PLACED, SUBJECT.JOB_STARTED, SUBJECT.JOB_SUCCEEDED, SUBJECT.JOB_FAILED, SUBJECT.JOB_CANCELLED,
  SUBJECT.JOB_REQUEUED,
];
onEvent((e) => JOB_MOVES.includes(kind(e)) && reloadJobs(), WILDCARD.JOB, () => reloadJobs());

setInterval(() => {
  for (const el of listEl.querySelectorAll(".heartbeat")) {
    const node = byName.get(el.dataset.node);
    if (node) tickHeartbeat(el, node);
  }
}, 1000);
setInterval(reloadNodes, 30_000);

loadNodes();
loadJobs();
