// Environments: the jobs' own Python environments each node holds (`environment: {pip: [...]}` in a job spec,
// docs/environments.md), with their Python, packages, size, last use and the replicas using them, and the Python
// versions each node builds for. Admins remove one (refused while a running job uses it). Kept fresh from the
// nodes' heartbeats (every few seconds).
import { ago, api, bytes, empty, errorBox, fill, h, keepFresh, me, section, table } from "../app.js";
import { SUBJECT } from "../contracts.js";

const REFRESH_MS = 5000;
const listEl = section("environments", "Environments on the nodes");
const pythonsEl = section("pythons", "Python versions the nodes offer");
const resultEl = h("div", { id: "environment-action-result", "aria-live": "polite" });
listEl.before(resultEl);

let listing = null; // GET /v1/environments
let loadError = null;

async function load() {
  try {
    listing = await api("/v1/environments");
    loadError = null;
  } catch (err) {
    loadError = err;
  }
  draw();
}

async function remove(env) {
  const where = `node ${env.node}`;
  if (!confirm(`Remove environment ${env.key} from ${where}? A later job that wants it builds it again.`)) return;
  try {
    const done = await api(`/v1/environments/${encodeURIComponent(env.key)}?node=${encodeURIComponent(env.node)}`, {
      method: "DELETE",
    });
    fill(resultEl, h("p", { class: "ok" }, `Removal of ${done.key} sent to ${done.nodes.join(", ")}.`));
  } catch (err) {
    fill(resultEl, errorBox(err));
  }
  await load();
}

const COLUMNS = [
  { title: "Key", cell: (e) => h("code", { class: "env-key" }, e.key) },
  { title: "Node", cell: (e) => e.node },
  { title: "Python", cell: (e) => e.python },
  { title: "Packages", cell: (e) => h("span", { title: `${e.package_count} package(s)` }, e.packages || "—") },
  { title: "Size", cell: (e) => bytes(e.size_bytes), class: "num" },
  { title: "Last used", cell: (e) => ago(e.last_used) },
  { title: "In use", cell: (e) => (e.in_use ? `${e.in_use} replica${e.in_use === 1 ? "" : "s"}` : "—"), class: "num" },
];
const REMOVE = {
  title: "",
  cell: (e) =>
    h("button", {
      type: "button",
      class: "danger",
      disabled: e.in_use > 0,
      title: e.in_use > 0 ? "in use by a running job" : "remove it from this node",
      "data-key": e.key,
      onclick: () => remove(e),
    }, "Remove"),
};

function draw() {
  if (loadError) {
    fill(listEl, errorBox(loadError));
    return;
  }
  if (!listing) return;
  const columns = me.admin ? [...COLUMNS, REMOVE] : COLUMNS;
  fill(
    listEl,
    listing.items.length
      ? table(columns, listing.items, { rowClass: () => "environment" })
      : empty(
          "No node holds a job environment yet.",
          "A job with `environment: {pip: [numpy]}` gets one, built once on its node and reused by the next.",
        ),
  );
  fill(
    pythonsEl,
    listing.nodes.length
      ? table(
          [
            { title: "Node", cell: (n) => n.node },
            { title: "Python versions", cell: (n) => n.pythons.join(", ") || "none" },
          ],
          listing.nodes,
          { rowClass: () => "node-pythons" },
        )
      : empty("No node heard from lately."),
  );
}

keepFresh(load, { subject: SUBJECT.NODE_LOST, everyMs: REFRESH_MS });
