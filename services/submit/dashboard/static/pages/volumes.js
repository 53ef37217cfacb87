// Volumes: a tenant's named folders of data that its jobs mount (docs/volumes.md). Each with its size, what its
// files hold and the live jobs that mount it, and what the volumes reserve of the tenant's volume quota; make
// one; a volume's files: browse its folders, upload files from the browser into the folder shown (each with its
// progress), download (a folder as a tar), remove; delete the volume.
import {
  ApiError, ago, api, bytes, empty, errorBox, fill, h, jobLink, keepFresh, kind, me, onEvent, params, section,
  setQuery, tableBox, upload,
} from "../app.js";
import { SUBJECT, WILDCARD } from "../contracts.js";
import { crumbs, fileTable, pathQuery } from "../files.js";

const query = new URLSearchParams(location.search);
const JOB_KINDS = new Set([SUBJECT.JOB_SUBMITTED, SUBJECT.JOB_SUCCEEDED, SUBJECT.JOB_FAILED, SUBJECT.JOB_CANCELLED]);

let owner = (me.admin && query.get("tenant")) || me.tenant; // whose volumes: an admin may look at any tenant's
let selected = query.get("volume"); // the volume whose files show
let folder = query.get("path") ?? ""; // the folder of it shown
let listing = null; // GET /v1/volumes
let described = new Map(); // name -> GET /v1/volumes/{name} (its use, the jobs that mount it), or its Error
let files = null; // the folder's entries (GET …/files), or the Error that refused them
let message = null; // the last action's outcome, in the volume's part
let made = null; // the last volume made, or why not

const listEl = section("volumes", "The tenant's volumes");
const detailEl = section("volume", "Files");

const others = () => (owner !== me.tenant ? { tenant: owner } : {});
const volumeUrl = (name, tail = "", path = "") =>
  `/v1/volumes/${encodeURIComponent(name)}${tail}${pathQuery(path, others())}`;
const pageHref = (name, path = "") => pathQuery(path, { volume: name, ...others() });

// ---------------------------------------------------------------- loading

async function load() {
  try {
    listing = await api(`/v1/volumes${pathQuery("", others())}`);
  } catch (err) {
    listing = null;
    fill(listEl, me.admin ? tenantForm : null, errorBox(err));
    fill(detailEl);
    return;
  }
  if (selected && !listing.items.some((v) => v.name === selected)) [selected, folder] = [null, ""];
  selected ??= listing.items[0]?.name ?? null;
  const [views] = await Promise.all([
    Promise.all(listing.items.map((v) => api(volumeUrl(v.name)).catch((err) => err))),
    loadFiles(),
  ]);
  described = new Map(listing.items.map((v, i) => [v.name, views[i]]));
  drawList();
  drawDetail();
}

async function loadFiles() {
  files = selected ? await api(volumeUrl(selected, "/files", folder)).catch((err) => err) : null;
  if (files instanceof ApiError && files.status === 404 && folder) {
    folder = ""; // (the folder was removed meanwhile: its volume's top instead)
    setQuery({ path: "" });
    await loadFiles();
  }
}

// ---------------------------------------------------------------- the list

/** `part` of `whole` as a bar, full (red) at or past it. */
function useBar(part, whole, what) {
  const share = whole ? Math.min(1, part / whole) : 0;
  return h("div", { class: "quota-bar use-bar", role: "img", "aria-label": what, title: what },
    h("span", { class: part >= whole ? "full" : "own", style: { width: `${(100 * share).toFixed(1)}%` } }));
}

// A part beside its whole (a volume's use beside its size, what the volumes reserve beside the quota, what an
// upload sent beside the file's size) in one unit system: the whole as `bytes` writes it everywhere ("8 MB",
// "16 GiB"), the part in the same system, three figures: "3.15 MB of 8 MB", never "3 MiB of 8 MB".
const SI_UNITS = [["TB", 1e12], ["GB", 1e9], ["MB", 1e6], ["kB", 1e3]];
const BINARY_UNITS = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];

function bytesOf(part, whole) {
  if (part == null) return "—";
  const units = / (TB|GB|MB|kB)$/.test(bytes(whole)) ? SI_UNITS : BINARY_UNITS;
  for (const [unit, factor] of units) {
    if (part >= factor) {
      const value = part / factor;
      return `${value < 1000 ? Number(value.toPrecision(3)) : Math.round(value)} ${unit}`;
    }
  }
  return `${Math.trunc(part)} B`;
}

function percent(part, whole) {
  return whole ? `${Math.round((100 * part) / whole)} %` : "—";
}

function quotaLine({ quota_bytes: quota, reserved_bytes: reserved }) {
  if (!quota) {
    return h("p", { class: "hint", id: "volume-quota" },
      `The volumes of tenant ${owner} reserve ${bytes(reserved)}: it has no volume quota.`);
  }
  const what = `${bytesOf(reserved, quota)} reserved of ${bytes(quota)}`;
  return h("div", { class: "volume-quota", id: "volume-quota" },
    h("span", {}, `Tenant ${owner}'s volume quota: ${what} (${percent(reserved, quota)})`),
    useBar(reserved, quota, what));
}

const tenantForm = h("form", { class: "filters", id: "tenant-form", onsubmit: (e) => (e.preventDefault(), showTenant()) },
  h("div", {}, h("label", { for: "v-tenant" }, "Tenant"),
    h("input", { id: "v-tenant", name: "tenant", size: 12, value: owner, pattern: params.namePattern, title: "a tenant's name" })),
  h("button", { type: "submit" }, "Show its volumes"));

function showTenant() {
  owner = tenantForm.elements.tenant.value.trim() || me.tenant;
  [selected, folder, message, made] = [null, "", null, null];
  setQuery({ tenant: owner === me.tenant ? "" : owner, volume: "", path: "" });
  refresh();
}

const createForm = h("form", { class: "filters", id: "volume-form", onsubmit: (e) => (e.preventDefault(), createVolume()) },
  h("div", {}, h("label", { for: "v-name" }, "Name"),
    h("input", { id: "v-name", name: "name", required: true, size: 16, pattern: params.namePattern, title: "lower-case letters, digits and dashes" })),
  h("div", {}, h("label", { for: "v-size" }, "Size"),
    h("input", { id: "v-size", name: "size", size: 8, placeholder: params.defaultSize, title: "bytes, or with a unit: 50GB, 1.5TiB" })),
  h("button", { type: "submit", class: "primary", id: "volume-create" }, "Make a volume"));

async function createVolume() {
  const f = createForm.elements;
  const size = f.size.value.trim();
  const body = { name: f.name.value.trim(), ...(size ? { size: /^\d+$/.test(size) ? Number(size) : size } : {}) };
  try {
    const volume = await api(`/v1/volumes${pathQuery("", others())}`, { method: "POST", body });
    made = h("p", { class: "ok", role: "status" }, `Made volume ${volume.name} (${bytes(volume.size_bytes)}).`);
    createForm.reset();
    select(volume.name);
  } catch (err) {
    made = errorBox(err);
    drawList();
  }
}

function usedCell(view) {
  if (!view || view instanceof Error) return h("span", { class: "muted", title: view?.message ?? "" }, "—");
  const used = bytesOf(view.used_bytes, view.size_bytes); // (in the units of the Size column beside it)
  const what = `${used} used of ${bytes(view.size_bytes)}`;
  return [h("span", { class: "used" }, `${used} · ${percent(view.used_bytes, view.size_bytes)}`),
    useBar(view.used_bytes, view.size_bytes, what)];
}

function mountedBy(view) {
  const jobs = view instanceof Error ? [] : view?.mounted_by ?? [];
  if (!jobs.length) return h("span", { class: "muted" }, "no live job");
  return jobs.map((id, i) => [i ? ", " : "", jobLink({ job_id: id, name: id.slice(0, 12) })]);
}

function volumeRow(v) {
  const view = described.get(v.name);
  return h("tr", { "data-volume": v.name, class: v.name === selected ? "selected" : null },
    h("td", {}, h("a", { href: pageHref(v.name), onclick: (e) => (e.preventDefault(), select(v.name)) }, v.name)),
    h("td", { class: "num" }, bytes(v.size_bytes)),
    h("td", { class: "bar-cell" }, usedCell(view)),
    h("td", { class: "num" }, view instanceof Error ? "—" : view?.files ?? "—"),
    h("td", {}, ago(v.created_at), v.created_by ? h("div", { class: "muted" }, `by ${v.created_by}`) : null),
    h("td", { class: "mounted" }, mountedBy(view)));
}

function drawList() {
  const items = listing.items;
  fill(listEl,
    me.admin ? tenantForm : null,
    quotaLine(listing),
    createForm,
    h("div", { id: "create-message" }, made),
    items.length
      ? tableBox(h("table", { id: "volumes-table" },
        h("thead", {}, h("tr", {}, ["Volume", "Size", "Used", "Files", "Created", "Mounted by"]
          .map((t) => h("th", { scope: "col", class: ["Size", "Files"].includes(t) ? "num" : null }, t)))),
        h("tbody", {}, items.map(volumeRow))))
      : empty(`Tenant ${owner} has no volume yet.`,
        "Make one above, or with `gpuyard volumes create NAME --size 50GB`; a job mounts it by its name (`volumes:` in its spec)."),
  );
}

function select(name) {
  [selected, folder, message] = [name, "", null];
  setQuery({ volume: name, path: "" });
  refresh();
}

// ---------------------------------------------------------------- one volume: its files

async function openFolder(path) {
  folder = path;
  setQuery({ volume: selected, path });
  await loadFiles();
  drawDetail();
}

function volumeHead(view) {
  const v = view instanceof Error || !view ? listing.items.find((x) => x.name === selected) : view;
  const figures = view instanceof Error || !view
    ? `${bytes(v.size_bytes)}`
    : `${bytesOf(view.used_bytes, view.size_bytes)} used of ${bytes(view.size_bytes)} · ${view.files} file${view.files === 1 ? "" : "s"}`;
  const jobs = view instanceof Error ? [] : view?.mounted_by ?? [];
  return h("div", { class: "model-head" },
    h("div", {},
      h("h3", { id: "volume-name" }, v.name, h("span", { class: "muted" }, ` · tenant ${v.tenant}`)),
      h("div", { class: "muted", id: "volume-figures" }, figures),
      jobs.length ? h("div", { class: "muted", id: "volume-mounts" }, "mounted by ", mountedBy(view)) : null),
    h("div", { class: "row actions" },
      h("a", { class: "button download", id: "volume-download", href: volumeUrl(v.name, "/content"), download: `${v.name}.tar` },
        "Download all (tar)"),
      h("button", { class: "danger", id: "volume-delete", onclick: () => deleteVolume(v.name) }, "Delete volume")));
}

function drawDetail() {
  if (!listing) return;
  if (!selected) {
    fill(detailEl, h("div", { id: "volume-message" }, message),
      empty("No volume to show.", "Once a volume is made, its files show here: upload them from this page."));
    return;
  }
  uploadTarget.textContent = `into ${selected}/${folder ? `${folder}/` : ""}`;
  fill(detailEl,
    volumeHead(described.get(selected)),
    h("div", { id: "volume-message" }, message),
    uploadForm,
    crumbs(folder, { top: selected, href: (p) => pageHref(selected, p), open: openFolder, id: "volume-path" }),
    files instanceof Error ? errorBox(files) : files ? fileTable(files, {
      id: "files-table",
      href: (p) => pageHref(selected, p),
      open: openFolder,
      download: (p) => volumeUrl(selected, "/content", p),
      remove: removeEntry,
      emptyText: folder ? "This folder is empty." : "This volume is empty.",
      emptyHint: "Upload files into it above, or a folder with `gpuyard volumes upload NAME ./folder`.",
    }) : null,
  );
}

async function act(run) {
  try {
    message = h("p", { class: "ok", role: "status" }, await run());
  } catch (err) {
    message = errorBox(err);
  }
  await load();
}

function removeEntry(entry) {
  const what = entry.kind === "dir" ? `the folder ${entry.path} and everything in it` : entry.path;
  if (!confirm(`Remove ${what} from volume ${selected}?`)) return;
  const name = selected;
  return act(async () => {
    const done = await api(volumeUrl(name, "/content", entry.path), { method: "DELETE" });
    return `Removed ${done.path}: ${done.files} file${done.files === 1 ? "" : "s"}, ${bytes(done.bytes)}.`;
  });
}

function deleteVolume(name) {
  if (!confirm(`Delete volume ${name} and every file in it? No job can mount it any more.`)) return;
  return act(async () => {
    const done = await api(volumeUrl(name), { method: "DELETE" });
    return `Deleted volume ${done.name}: ${bytes(done.freed_bytes)} freed.`;
  });
}

// ---------------------------------------------------------------- uploads from the browser

const picker = h("input", { type: "file", id: "upload-files", name: "files", multiple: true });
const uploadTarget = h("span", { class: "hint", id: "upload-target" });
const uploadList = h("ul", { class: "uploads", id: "uploads" });
const uploadForm = h("form", { id: "upload-form", onsubmit: (e) => (e.preventDefault(), uploadChosen()) },
  h("div", { class: "filters" },
    h("div", {}, h("label", { for: "upload-files" }, "Upload files"), picker),
    h("button", { type: "submit", class: "primary", id: "upload-send" }, "Upload"),
    uploadTarget),
  uploadList);

/** One file's upload as a row: its name, a progress bar, the share sent, and how it ended. */
function uploadRow(file, path) {
  const bar = h("progress", { max: 100, value: 0, "data-percent": "0" });
  const share = h("span", { class: "pct" }, "0 %");
  const status = h("span", { class: "status muted" }, "waiting");
  const row = h("li", { "data-file": path }, h("span", { class: "mono file" }, path), bar, share, status);
  const show = (pct, text, cls = "muted") => {
    bar.value = pct;
    bar.dataset.percent = String(pct);
    share.textContent = `${pct} %`;
    status.textContent = text;
    status.className = `status ${cls}`;
  };
  const fail = (text) => {
    row.className = "upload-failed";
    share.textContent = "not kept"; // (what was sent is discarded: an upload is all or nothing)
    status.textContent = text;
    status.className = "status error-text";
  };
  return { file, path, row, show, fail, setClass: (cls) => (row.className = cls) };
}

async function uploadChosen() {
  const chosen = [...picker.files];
  if (!chosen.length) {
    message = errorBox("Choose one or more files to upload first.");
    drawDetail();
    return;
  }
  const [name, into] = [selected, folder];
  const batch = chosen.map((file) => uploadRow(file, into ? `${into}/${file.name}` : file.name));
  fill(uploadList, batch.map((u) => u.row));
  picker.value = "";
  for (const u of batch) await sendOne(name, u); // one after another: a tenant's uploads at a time are limited
  refresh();
}

async function sendOne(name, u) {
  const total = u.file.size;
  u.setClass("uploading");
  u.show(0, `sending ${bytes(total)}…`);
  try {
    const done = await upload(volumeUrl(name, "/content", u.path), u.file, {
      progress: (sent, of) => {
        const pct = of ? Math.floor((100 * sent) / of) : 100;
        u.show(pct, pct < 100 ? `${bytesOf(sent, of)} of ${bytes(of)} sent` : "sent: writing it in the volume…");
      },
    });
    u.setClass("upload-done");
    u.show(100, `uploaded ${bytes(done.bytes)}`, "ok");
  } catch (err) {
    u.fail(err.message);
  }
}

// ---------------------------------------------------------------- live

const refresh = keepFresh(load, { subject: WILDCARD.VOLUME, everyMs: 30_000 });
// a job submitted may mount a volume, one that ended no longer does (and what was missed while away: read again)
onEvent((e) => JOB_KINDS.has(kind(e)) && refresh(), WILDCARD.JOB, () => refresh());
