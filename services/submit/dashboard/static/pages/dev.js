// Dev environments (docs/dev.md): JupyterLab as a job of kind `dev`, reached through the platform at
// /dev/{id}/lab. Start one (its GPUs, name and idle timeout), open a running one in a new tab, stop one (its
// notebooks stay in the user's own volume). Kept fresh from the jobs' events.
import { ago, api, empty, errorBox, fill, h, jobLink, keepFresh, section, stateBadge, table, waitingText } from "../app.js";
import { STATE, WILDCARD } from "../contracts.js";

const startEl = section("dev-start", "Start a dev environment");
const listEl = section("dev-list", "Dev environments");
const resultEl = h("div", { id: "dev-action-result", "aria-live": "polite" });
listEl.before(resultEl);

let listing = null; // GET /v1/dev
let loadError = null;

const startForm = h("form", { class: "filters", id: "dev-form", onsubmit: (e) => (e.preventDefault(), start()) },
  h("div", {}, h("label", { for: "dev-gpus" }, "GPUs"),
    h("input", { id: "dev-gpus", name: "gpus", size: 5, value: "0", inputmode: "decimal", title: "whole GPUs, or a share of one: 0.5" })),
  h("div", {}, h("label", { for: "dev-name" }, "Name"),
    h("input", { id: "dev-name", name: "name", size: 16, title: "lower-case letters, digits and dashes (optional)" })),
  h("div", {}, h("label", { for: "dev-idle" }, "Idle timeout"),
    h("input", { id: "dev-idle", name: "idle", size: 6, placeholder: "2h", title: "stopped after this long idle: 30m, 2h, off" })),
  h("button", { type: "submit", class: "primary", id: "dev-start-button" }, "Start"));
fill(startEl, startForm);

async function load() {
  try {
    listing = await api("/v1/dev");
    loadError = null;
  } catch (err) {
    loadError = err;
  }
  draw();
}

async function start() {
  const f = startForm.elements;
  const body = { gpus: Number(f.gpus.value.trim() || "0") };
  if (f.name.value.trim()) body.name = f.name.value.trim();
  if (f.idle.value.trim()) body.idle_timeout = f.idle.value.trim();
  try {
    const dev = await api("/v1/dev", { method: "POST", body });
    fill(resultEl, h("p", { class: "ok", role: "status" }, `Started dev environment ${dev.name} (${dev.job_id}): it opens once it runs.`));
  } catch (err) {
    fill(resultEl, errorBox(err));
  }
  await load();
}

async function stop(dev) {
  if (!confirm(`Stop dev environment ${dev.name}? Its notebooks stay in ${dev.notebooks ?? "its job's folder"}.`)) return;
  try {
    const done = await api(`/v1/dev/${encodeURIComponent(dev.job_id)}`, { method: "DELETE" });
    fill(resultEl, h("p", { class: "ok", role: "status" }, `Dev environment ${dev.name}: ${done.message}.`));
  } catch (err) {
    fill(resultEl, errorBox(err));
  }
  await load();
}

const COLUMNS = [
  { title: "Name", cell: (d) => jobLink({ job_id: d.job_id, name: d.name }) },
  { title: "State", cell: (d) => h("span", { title: d.message || "" }, stateBadge(d.state)) },
  { title: "GPUs", cell: (d) => String(d.gpus), class: "num" },
  { title: "User", cell: (d) => d.user || "—" },
  { title: "Notebooks", cell: (d) => d.notebooks ?? "—" },
  { title: "Started", cell: (d) => ago(d.submitted_at) },
  { title: "", cell: (d) => actions(d) },
];

function actions(d) {
  const open = d.state === STATE.RUNNING
    ? h("a", { class: "button", href: d.url, target: "_blank", rel: "noopener", "data-open": d.job_id }, "Open")
    : h("span", { class: "muted" }, d.state === STATE.QUEUED && d.message ? waitingText({ message: d.message }) : "opens once it runs");
  const stopButton = h("button", { type: "button", class: "danger", "data-stop": d.job_id, onclick: () => stop(d) }, "Stop");
  return h("span", { class: "actions" }, open, " ", stopButton);
}

function draw() {
  if (loadError) {
    fill(listEl, errorBox(loadError));
    return;
  }
  if (!listing) return;
  fill(
    listEl,
    listing.items.length
      ? table(COLUMNS, listing.items, { rowClass: () => "dev-environment" })
      : empty("No dev environment runs.", "Start one above, or with `gpuyard dev start --gpus 0.5`."),
  );
}

keepFresh(load, { subject: WILDCARD.JOB, everyMs: 5000 });
