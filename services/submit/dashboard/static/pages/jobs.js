// Jobs: the list, filtered and paginated on the server, live from the job events.
import {
  ago, api, elapsed, empty, errorBox, fill, h, jobLink, keepFresh, me, num, section, setQuery, stateBadge,
  tableBox, waitingText,
} from "../app.js";
import { STATE, STATES, WILDCARD } from "../contracts.js";

const PAGE_SIZE = 50;
const query = new URLSearchParams(location.search);
const filters = {
  state: (query.get("state") ?? "").split(",").filter((s) => STATES.includes(s)),
  tenant: query.get("tenant") ?? "",
  user: query.get("user") ?? "",
  name: query.get("name") ?? "",
  q: query.get("q") ?? "",
  order: query.get("order") === "oldest" ? "oldest" : "newest",
};
let cursors = [null]; // the cursor of each page seen, for Back
let sortBy = null; // a column sorted on the page itself: {key, dir}

const form = h(
  "form",
  { class: "filters", role: "search", onsubmit: (e) => (e.preventDefault(), restart()) },
  h("div", {},
    h("label", { for: "f-state" }, "State"),
    h("select", { id: "f-state", name: "state", onchange: restart },
      h("option", { value: "" }, "any"),
      h("option", { value: "queued,placed,running" }, "active (queued, placed, running)"),
      STATES.map((s) => h("option", { value: s }, s)),
    ),
  ),
  me.admin ? h("div", {}, h("label", { for: "f-tenant" }, "Tenant"), h("input", { id: "f-tenant", name: "tenant", size: 10 })) : null,
  h("div", {}, h("label", { for: "f-user" }, "User"), h("input", { id: "f-user", name: "user", size: 10 })),
  h("div", {}, h("label", { for: "f-name" }, "Name"), h("input", { id: "f-name", name: "name", size: 12 })),
  h("div", {}, h("label", { for: "f-q" }, "Search"), h("input", { id: "f-q", name: "q", type: "search", placeholder: "id, name, user, tenant", size: 22 })),
  h("div", {},
    h("label", { for: "f-order" }, "Order"),
    h("select", { id: "f-order", name: "order", onchange: restart },
      h("option", { value: "newest" }, "newest first"),
      h("option", { value: "oldest" }, "oldest first"),
    ),
  ),
  h("button", { type: "submit" }, "Filter"),
);
form.elements.state.value = filters.state.join(",");
for (const k of ["tenant", "user", "name", "q", "order"]) if (form.elements[k]) form.elements[k].value = filters[k];

const listEl = section("jobs", null);
listEl.before(form);

function restart() {
  const f = form.elements;
  filters.state = f.state.value ? f.state.value.split(",") : [];
  for (const k of ["tenant", "user", "name", "q", "order"]) filters[k] = f[k]?.value.trim() ?? "";
  setQuery({ ...filters, order: filters.order === "newest" ? "" : filters.order });
  cursors = [null];
  refresh();
}

function url(cursor) {
  const q = new URLSearchParams({ limit: PAGE_SIZE });
  for (const s of filters.state) q.append("state", s);
  for (const k of ["tenant", "user", "name", "q"]) if (filters[k]) q.set(k, filters[k]);
  if (filters.order !== "newest") q.set("order", filters.order);
  if (cursor) q.set("cursor", cursor);
  return `/v1/jobs?${q}`;
}

const COLUMNS = [
  { key: "name", title: "Job", cell: (j) => h("span", {}, jobLink(j), h("div", { class: "muted mono" }, j.job_id.slice(0, 12))), sort: (j) => j.name },
  { key: "state", title: "State", cell: (j) => stateBadge(j.state), sort: (j) => STATES.indexOf(j.state) },
  { key: "tenant", title: "Tenant", cell: (j) => j.tenant, sort: (j) => j.tenant },
  { key: "user", title: "User", cell: (j) => j.user || "—", sort: (j) => j.user },
  { key: "gpus", title: "GPUs", class: "num", cell: (j) => num(j.gpus), sort: (j) => j.gpus },
  { key: "created", title: "Submitted", cell: (j) => ago(j.created_at), sort: (j) => j.created_at },
  { key: "ran", title: "Ran for", class: "num", cell: (j) => ranFor(j), sort: (j) => seconds(j) ?? -1 },
  { key: "where", title: "Where, or why it waits", cell: where },
];

function seconds(j) {
  if (!j.started_at) return null;
  const end = j.finished_at ? new Date(j.finished_at) : new Date();
  return (end - new Date(j.started_at)) / 1000;
}

function ranFor(j) {
  return elapsed(j.started_at, j.finished_at);
}

function where(j) {
  if (j.state === STATE.QUEUED) return h("span", { class: "muted" }, waitingText(j.pending) || "waiting for the scheduler");
  if (j.placements?.length) {
    const nodes = [...new Set(j.placements.map((p) => p.node))];
    return nodes.join(", ");
  }
  if (j.failure) return h("span", { class: "error-text" }, j.failure.message);
  return h("span", { class: "muted" }, j.message || "");
}

let current = [];
let nextCursor = null;
let loading = null;

async function refresh() {
  const cursor = cursors[cursors.length - 1];
  loading?.abort();
  loading = new AbortController();
  try {
    const page = await api(url(cursor), { signal: loading.signal });
    current = page.items;
    nextCursor = page.next_cursor;
    draw();
  } catch (err) {
    if (err.name !== "AbortError") fill(listEl, errorBox(err));
  }
}

function draw() {
  const rows = [...current];
  if (sortBy) {
    const col = COLUMNS.find((c) => c.key === sortBy.key);
    rows.sort((a, b) => {
      const x = col.sort(a);
      const y = col.sort(b);
      return (x < y ? -1 : x > y ? 1 : 0) * (sortBy.dir === "ascending" ? 1 : -1);
    });
  }
  if (!rows.length) {
    const filtered = filters.state.length || filters.user || filters.name || filters.q || filters.tenant;
    fill(listEl, filtered
      ? empty("No job matches these filters.", "Clear a filter, or search for part of an id or a name.")
      : empty("No jobs yet.", "Submit one from the Submit page, or with `gpuyard submit job.yaml`."));
    return;
  }
  const tableEl = tableBox(h("table", { id: "jobs-table" },
    h("thead", {}, h("tr", {}, COLUMNS.map((c) => {
      const th = h("th", { scope: "col", class: [c.class, c.sort ? "sortable" : ""].join(" ") }, c.title);
      if (c.sort) {
        if (sortBy?.key === c.key) th.setAttribute("aria-sort", sortBy.dir);
        th.addEventListener("click", () => {
          sortBy = { key: c.key, dir: sortBy?.key === c.key && sortBy.dir === "ascending" ? "descending" : "ascending" };
          draw();
        });
      }
      return th;
    }))),
    h("tbody", {}, rows.map((j) => h("tr", { "data-job": j.job_id, "data-state": j.state }, COLUMNS.map((c) => h("td", { class: c.class }, c.cell(j)))))),
  ));
  const pageNo = cursors.length;
  const pager = h("div", { class: "pager" },
    h("button", { disabled: pageNo === 1, onclick: () => (cursors.pop(), refresh()) }, "← Previous"),
    h("span", { class: "muted" }, `page ${pageNo} · ${rows.length} job${rows.length === 1 ? "" : "s"} shown`),
    h("button", { disabled: !nextCursor, onclick: () => (cursors.push(nextCursor), refresh()) }, "Next →"),
    h("span", { class: "hint" }, "Click a column's title to sort this page."),
  );
  fill(listEl, tableEl, pager);
}

keepFresh(refresh, { subject: WILDCARD.JOB, everyMs: 30_000 });
