// Cluster: every GPU at a glance. Tiles of GPUs by state, a heat map of every node's GPUs (coloured by live
// utilization or by allocation, grouped by GPU model or node-name prefix, collapsible, filtered), totals per
// GPU model, and each tenant's queue. Live: a gpu.sample carries every GPU of its node, so the cells change
// from the event itself; node events reload the node list.
import {
  GPU_STATES, api, applySample, byNodeName, bytes, elapsed, empty, errorBox, fill, gpuState, h, holderText,
  keepFresh, keepSampled, kind, liveJobs, num, onEvent, section, setQuery, tableBox, throttle,
} from "../app.js";
import { STATE, SUBJECT, WILDCARD } from "../contracts.js";

const AUTO_COMPACT_GPUS = 256; // more GPUs than this: small cells, node names on hover
const query = new URLSearchParams(location.search);
const view = {
  colour: query.get("colour") === "allocation" ? "allocation" : "utilization",
  group: query.get("group") === "prefix" ? "prefix" : "model",
  size: ["large", "small"].includes(query.get("size")) ? query.get("size") : "auto",
  q: query.get("q") ?? "",
};
const collapsed = new Set(); // group keys the user folded

let nodes = new Map(); // name -> node of GET /v1/nodes, live figures applied from gpu.sample events
let names = new Map(); // job id -> name, for the holders
let cells = new Map(); // node name -> its cells (spans), in GPU order
let loadError = null;

// ---------------------------------------------------------------- layout

const tilesEl = section("gpu-states", "GPUs by state");
const mapEl = section("heatmap", "Every GPU");
const row = h("div", { class: "row" });
const modelsSection = h("section", { id: "models" }, h("h2", {}, "Per GPU model"), h("div", { class: "body" }));
const queuesSection = h("section", { id: "queues" }, h("h2", {}, "Queue per tenant"), h("div", { class: "body" }));
row.append(modelsSection, queuesSection);
mapEl.parentElement.after(row);
const modelsEl = modelsSection.querySelector(".body");
const queuesEl = queuesSection.querySelector(".body");

const select = (id, label, value, options, onchange) =>
  h("div", {},
    h("label", { for: id }, label),
    h("select", { id, onchange: (e) => onchange(e.target.value) },
      options.map(([v, text]) => h("option", { value: v, selected: v === value }, text))),
  );

const controls = h("form", { class: "filters", role: "search", onsubmit: (e) => e.preventDefault() },
  select("colour-by", "Colour by", view.colour, [["utilization", "utilization (live)"], ["allocation", "allocation"]],
    (v) => change({ colour: v })),
  select("group-by", "Group by", view.group, [["model", "GPU model"], ["prefix", "node-name prefix"]], (v) => change({ group: v })),
  select("cell-size", "Cells", view.size, [["auto", "auto"], ["large", "large, named nodes"], ["small", "small"]],
    (v) => change({ size: v })),
  h("div", {},
    h("label", { for: "node-filter" }, "Nodes"),
    h("input", { id: "node-filter", type: "search", placeholder: "part of a name", size: 16, value: view.q,
      oninput: throttle((e) => change({ q: e.target.value.trim() }), 250) }),
  ),
  h("div", { id: "legend", class: "legend", "aria-label": "Legend" }),
);
const groupsEl = h("div", { id: "heatmap-groups", class: "heat" });
const tip = h("div", { id: "gpu-tip", class: "gpu-tip", role: "tooltip", hidden: true });
fill(mapEl, controls, groupsEl);
document.body.append(tip);

function change(values) {
  Object.assign(view, values);
  setQuery({
    colour: view.colour === "utilization" ? "" : view.colour,
    group: view.group === "model" ? "" : view.group,
    size: view.size === "auto" ? "" : view.size,
    q: view.q,
  });
  drawAll();
}

// ---------------------------------------------------------------- figures

function utilClass(gpu) {
  if (gpu.utilization_pct == null) return "nodata";
  return `u${Math.min(9, Math.floor(gpu.utilization_pct / 10))}`;
}

function cellClass(gpu, node) {
  const state = gpuState(gpu, node);
  if (view.colour === "allocation") return `cell a-${state}`;
  const marks = state === "unhealthy" || state === "cordoned" || state === "lost" ? ` mark-${state}` : "";
  return `cell ${utilClass(gpu)}${marks}${gpu.holders.length ? " held" : ""}`;
}

/** A node name's prefix: its number or letter at the end cut off (gpu-h100-0042 → gpu-h100, node-a → node). */
function prefixOf(name) {
  const cut = /[-_.]?\d+$/.test(name) ? name.replace(/[-_.]?\d+$/, "") : name.replace(/[-_.][a-z]$/i, "");
  return cut || name;
}

function groupKey(node) {
  if (view.group === "prefix") return prefixOf(node.node);
  const models = [...new Set(node.gpus.map((g) => g.model))].sort();
  return models.length ? models.join(" + ") : "no GPUs";
}

/** Counts of GPUs by state, their mean utilization (of those sampled) and memory, over `list` of nodes. */
function tally(list) {
  const t = { nodes: list.length, gpus: 0, util: 0, sampled: 0, memory: 0, used: 0 };
  for (const [state] of GPU_STATES) t[state] = 0;
  for (const node of list) {
    for (const gpu of node.gpus) {
      t.gpus++;
      t[gpuState(gpu, node)]++;
      t.memory += gpu.memory_bytes;
      if (gpu.utilization_pct != null) {
        t.util += gpu.utilization_pct;
        t.sampled++;
      }
      t.used += gpu.memory_used_bytes ?? 0;
    }
  }
  t.meanUtil = t.sampled ? t.util / t.sampled : null;
  return t;
}

function pct(x) {
  return x == null ? "—" : `${Math.round(x)} %`;
}

// ---------------------------------------------------------------- drawing

function drawAll() {
  if (loadError) {
    fill(tilesEl, errorBox(loadError));
    fill(groupsEl);
    return;
  }
  drawTiles();
  drawHeatmap([...nodes.values()]);
  drawModels();
}

function drawTiles() {
  const t = tally([...nodes.values()]);
  const tile = (id, n, label, cls = "") =>
    h("div", { class: `tile ${cls}`, id: `tile-${id}` },
      h("div", { class: "n" }, typeof n === "number" ? num(n) : n),
      h("div", { class: "l" }, label));
  fill(tilesEl, h("div", { class: "tiles" },
    tile("total", t.gpus, `GPUs on ${t.nodes} node${t.nodes === 1 ? "" : "s"}`),
    GPU_STATES.filter(([s]) => s !== "lost" || t.lost).map(([s, label]) => tile(s, t[s], label, `t-${s}`)),
    tile("util", pct(t.meanUtil), "mean utilization"),
  ));
}

function legend() {
  if (view.colour === "allocation") {
    return [GPU_STATES.map(([s, label]) => h("span", { class: "key" }, h("i", { class: `cell a-${s}` }), label))];
  }
  return [
    h("span", { class: "key" }, "0 %", Array.from({ length: 10 }, (_, i) => h("i", { class: `cell u${i}` })), "100 %"),
    h("span", { class: "key" }, h("i", { class: "cell u0 held" }), "held by a job"),
    h("span", { class: "key" }, h("i", { class: "cell nodata" }), "no sample"),
    h("span", { class: "key" }, h("i", { class: "cell u0 mark-cordoned" }), "cordoned"),
    h("span", { class: "key" }, h("i", { class: "cell u0 mark-unhealthy" }), "unhealthy"),
  ];
}

/** Draw the heat map of `list` (nodes as GET /v1/nodes gives them). Exposed on window for the browser test's
 *  1,000-node check. */
function drawHeatmap(list) {
  fill(document.getElementById("legend"), legend());
  cells = new Map();
  const q = view.q.toLowerCase();
  const shown = q ? list.filter((n) => n.node.toLowerCase().includes(q)) : list;
  const gpuCount = shown.reduce((s, n) => s + n.gpus.length, 0);
  const compact = view.size === "small" || (view.size === "auto" && gpuCount > AUTO_COMPACT_GPUS);
  groupsEl.className = `heat ${compact ? "compact" : "large"}`;
  if (!list.length) {
    fill(groupsEl, empty("No node has reported yet.",
      "An executor's node appears here with its first heartbeat (gpuyard up, or gpuyard executor on a GPU machine)."));
    return;
  }
  if (!shown.length) {
    fill(groupsEl, empty(`No node's name contains “${view.q}”.`, "Clear the filter to see every node."));
    return;
  }
  const groups = new Map();
  for (const node of shown.sort((a, b) => byNodeName(a.node, b.node))) {
    const key = groupKey(node);
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(node);
  }
  const blocks = [];
  for (const [key, members] of [...groups].sort(([a], [b]) => byNodeName(a, b))) {
    const details = h("details", { class: "group", "data-group": key, open: !collapsed.has(key) },
      h("summary", {}, h("strong", {}, key), h("span", { class: "group-stats" }, groupStats(members))),
      h("div", { class: "nodes" }, members.map(nodeBlock)),
    );
    details.addEventListener("toggle", () => (details.open ? collapsed.delete(key) : collapsed.add(key)));
    blocks.push(details);
  }
  fill(groupsEl, blocks,
    h("p", { class: "hint" },
      `${shown.length} of ${list.length} nodes · hover a GPU for its figures, click it for its job (or its node).`));
}

function groupStats(members) {
  const t = tally(members);
  const held = t.allocated + t.shared;
  return ` · ${t.nodes} node${t.nodes === 1 ? "" : "s"} · ${t.gpus} GPUs · ${t.free} free · ${held} held` +
    (t.unhealthy + t.cordoned + t.lost ? ` · ${t.unhealthy + t.cordoned + t.lost} out of service` : "") +
    ` · mean ${pct(t.meanUtil)}`;
}

const CELL = document.createElement("span");

/** A node's block: its name and a cell per GPU (built without h(): a thousand nodes are 8,000 cells). */
function nodeBlock(node) {
  const box = document.createElement("div");
  box.className = "cells";
  const spans = node.gpus.map((gpu, i) => {
    const cell = CELL.cloneNode(false);
    cell.className = cellClass(gpu, node);
    cell.setAttribute("data-node", node.node);
    cell.setAttribute("data-i", i);
    mark(cell, gpu, node);
    box.appendChild(cell);
    return cell;
  });
  cells.set(node.node, spans);
  const block = document.createElement("div");
  block.className = node.state === "ready" ? "node" : `node node-${node.state}`;
  block.setAttribute("data-node", node.node);
  block.append(h("a", { class: "name", href: `/nodes?node=${encodeURIComponent(node.node)}` }, node.node), box);
  return block;
}

/** The cell's state, utilization and jobs as attributes (for the tests, and for people's devtools). */
function mark(cell, gpu, node) {
  cell.setAttribute("data-state", gpuState(gpu, node));
  cell.setAttribute("data-util", gpu.utilization_pct ?? "");
  cell.setAttribute("data-jobs", gpu.holders.map((x) => x.job_id ?? "other").join(" "));
}

/** Recolour the cells of `names` from their figures (a sample's update: no redraw of the map). */
function recolour(names) {
  for (const name of names) {
    const node = nodes.get(name);
    const spans = cells.get(name);
    if (!node || !spans) continue;
    node.gpus.forEach((gpu, i) => {
      const cell = spans[i];
      if (!cell) return;
      const cls = cellClass(gpu, node);
      if (cell.className !== cls) cell.className = cls;
      mark(cell, gpu, node);
    });
  }
}

function drawModels() {
  const byModel = new Map();
  for (const node of nodes.values()) {
    for (const gpu of node.gpus) {
      if (!byModel.has(gpu.model)) byModel.set(gpu.model, []);
      byModel.get(gpu.model).push({ ...node, gpus: [gpu] });
    }
  }
  if (!byModel.size) {
    fill(modelsEl, empty("No GPUs yet.", "Totals per model appear with the first node's heartbeat."));
    return;
  }
  const rows = [...byModel].sort(([a], [b]) => a.localeCompare(b)).map(([model, parts]) => {
    const t = tally(parts);
    t.nodes = new Set(parts.map((p) => p.node)).size;
    return { model, t };
  });
  fill(modelsEl, tableBox(h("table", { id: "models-table" },
    h("thead", {}, h("tr", {}, ["Model", "Nodes", "GPUs", "Free", "Held", "Out of service", "Mean use", "Memory used"]
      .map((t, i) => h("th", { scope: "col", class: i ? "num" : "" }, t)))),
    h("tbody", {}, rows.map(({ model, t }) => h("tr", { "data-model": model },
      h("td", {}, model),
      h("td", { class: "num" }, num(t.nodes)),
      h("td", { class: "num" }, num(t.gpus)),
      h("td", { class: "num" }, num(t.free)),
      h("td", { class: "num", title: `${t.allocated} whole, ${t.shared} shared` }, num(t.allocated + t.shared)),
      h("td", { class: "num", title: `${t.unhealthy} unhealthy, ${t.cordoned} cordoned, ${t.lost} on lost nodes` },
        num(t.unhealthy + t.cordoned + t.lost)),
      h("td", { class: "num" }, pct(t.meanUtil)),
      h("td", { class: "num" }, `${bytes(t.used)} of ${bytes(t.memory)}`),
    ))),
  )));
}

// ---------------------------------------------------------------- the hover card and clicks

function cellAt(target) {
  const cell = target?.closest?.(".cell[data-node]");
  if (!cell) return null;
  const node = nodes.get(cell.dataset.node) ?? window.gpuyardCluster?.shown?.get(cell.dataset.node);
  const gpu = node?.gpus[Number(cell.dataset.i)];
  return gpu ? { cell, node, gpu } : null;
}

function showTip(found, x, y) {
  const { node, gpu } = found;
  const label = GPU_STATES.find(([s]) => s === gpuState(gpu, node))?.[1];
  const line = (k, v) => h("div", {}, h("span", { class: "k" }, k), v);
  fill(tip,
    h("div", { class: "t" }, `${node.node} · GPU ${gpu.index}`),
    line("model", gpu.model),
    line("state", label + (gpu.unhealthy_reason ? `: ${gpu.unhealthy_reason}` : "")),
    line("utilization", pct(gpu.utilization_pct)),
    line("memory", `${bytes(gpu.memory_used_bytes)} of ${bytes(gpu.memory_bytes)}`),
    line("temperature", gpu.temperature_c == null ? "—" : `${num(gpu.temperature_c, 1)} °C`),
    line("held by", gpu.holders.length ? gpu.holders.map((x, i) => [i ? ", " : "", holderText(x, names)]) : "nobody"),
  );
  tip.hidden = false;
  place(x, y);
}

function place(x, y) {
  const box = tip.getBoundingClientRect();
  tip.style.left = `${Math.min(x + 14, innerWidth - box.width - 8)}px`;
  tip.style.top = `${y + 16 + box.height > innerHeight ? y - box.height - 10 : y + 16}px`;
}

let hovered = null;
const pointer = { x: 0, y: 0 };
groupsEl.addEventListener("mouseover", (e) => {
  hovered = cellAt(e.target);
  Object.assign(pointer, { x: e.clientX, y: e.clientY });
  if (hovered) showTip(hovered, pointer.x, pointer.y);
  else tip.hidden = true;
});
groupsEl.addEventListener("mousemove", (e) => {
  Object.assign(pointer, { x: e.clientX, y: e.clientY });
  if (hovered && !tip.hidden) place(pointer.x, pointer.y);
});
groupsEl.addEventListener("mouseleave", () => {
  hovered = null;
  tip.hidden = true;
});
groupsEl.addEventListener("click", (e) => {
  const found = cellAt(e.target);
  if (!found) return;
  const own = found.gpu.holders.find((x) => x.job_id);
  location.assign(own ? `/jobs/${encodeURIComponent(own.job_id)}` : `/nodes?node=${encodeURIComponent(found.node.node)}`);
});

// ---------------------------------------------------------------- the queues

let queues = null; // {items, at} of GET /v1/tenants, or "unavailable"

async function loadQueues() {
  if (queues === "unavailable") return;
  try {
    queues = { items: (await api("/v1/tenants")).items, at: Date.now() };
  } catch (err) {
    if (err.status === 404) queues = "unavailable";
    else {
      fill(queuesEl, errorBox(err));
      return;
    }
  }
  drawQueues();
}

function drawQueues() {
  if (queues === "unavailable") {
    fill(queuesEl, h("p", { id: "queues-unavailable", class: "muted" },
      "Queue figures unavailable: this server has no GET /v1/tenants yet."));
    return;
  }
  if (!queues) return;
  if (!queues.items.length) {
    fill(queuesEl, empty("No tenant has a quota or a live job.", "A tenant appears here with its first job."));
    return;
  }
  const waited = (t) =>
    t.oldest_queued_seconds == null
      ? h("span", { class: "muted" }, "—")
      : elapsed(new Date(queues.at - t.oldest_queued_seconds * 1000)); // (counting on: app.js)
  fill(queuesEl, tableBox(h("table", { id: "queues-table" },
    h("thead", {}, h("tr", {}, ["Tenant", "Queued", "Oldest wait", "Placed", "Running", "GPUs used", "Guaranteed", "Borrowed"]
      .map((t, i) => h("th", { scope: "col", class: i ? "num" : "" }, t)))),
    h("tbody", {}, queues.items.map((t) => h("tr", { "data-tenant": t.tenant },
      h("td", {}, h("a", { href: `/jobs?${new URLSearchParams({ tenant: t.tenant, state: STATE.QUEUED })}` }, t.tenant)),
      h("td", { class: "num" }, num(t.queued)),
      h("td", { class: "num oldest" }, waited(t)),
      h("td", { class: "num" }, num(t.placed)),
      h("td", { class: "num" }, num(t.running)),
      h("td", { class: "num" }, num(t.used_gpus)),
      h("td", { class: "num" }, t.guaranteed_gpus ? num(t.guaranteed_gpus) : h("span", { class: "muted" }, "none")),
      h("td", { class: "num" }, num(t.borrowed_gpus)),
    ))),
  )));
}

// ---------------------------------------------------------------- loading and live updates

async function loadNodes() {
  try {
    const list = await api("/v1/nodes");
    nodes = new Map(list.map((n) => [n.node, keepSampled(n, nodes.get(n.node))]));
    loadError = null;
  } catch (err) {
    loadError = err;
  }
  drawAll();
}

async function loadNames() {
  try {
    names = new Map((await liveJobs()).map((j) => [j.job_id, j.name]));
  } catch {
    /* the holders show their ids */
  }
}

const dirty = new Set();
const flush = throttle(() => {
  recolour(dirty);
  dirty.clear();
  drawTiles();
  for (const details of groupsEl.querySelectorAll("details.group")) {
    const members = [...details.querySelectorAll(".node")].map((el) => nodes.get(el.dataset.node)).filter(Boolean);
    const stats = details.querySelector(".group-stats");
    if (members.length && stats) stats.textContent = groupStats(members);
  }
  drawModels();
  if (hovered && !tip.hidden) {
    hovered = cellAt(hovered.cell); // (its node read afresh: a reload replaces the objects)
    if (hovered) showTip(hovered, pointer.x, pointer.y);
  }
}, 500);

onEvent((e) => {
  if (kind(e) !== SUBJECT.GPU_SAMPLE) return;
  if (applySample(nodes.get(e.data.node), e.data)) {
    dirty.add(e.data.node);
    flush();
  } else reloadNodes(); // a node not listed yet
}, WILDCARD.GPU);

const reloadNodes = throttle(loadNodes, 1000);
onEvent((e) => {
  const known = nodes.get(e.data.node);
  if (kind(e) === SUBJECT.NODE_HEARTBEAT && known && known.state !== "lost") return; // its figures come with its samples
  reloadNodes();
}, WILDCARD.NODE, () => reloadNodes());

loadNodes();
setInterval(reloadNodes, 30_000); // (a missed event, a node's heartbeat age)
keepFresh(() => Promise.all([loadQueues(), loadNames()]), { subject: WILDCARD.JOB, everyMs: 15_000 });

// The browser test draws 1,000 generated nodes with this (GET /v1/nodes' shape).
window.gpuyardCluster = {
  drawHeatmap(list) {
    this.shown = new Map(list.map((n) => [n.node, n]));
    drawHeatmap(list);
  },
};
