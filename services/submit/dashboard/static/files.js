// A folder's entries as the API lists them (shared/contracts/api/files.py: a volume's files, a job's outputs),
// for the pages that show them (volumes.js, job.js): the folder's path as links back up, and a table of its
// entries in which a folder opens in place, each entry downloads (a folder as a tar), and, where the page
// allows it, each can be removed.
import { ago, bytes, empty, h, tableBox } from "./app.js";

/** The last part of a path: its name. */
export function baseName(path) {
  return path.slice(path.lastIndexOf("/") + 1);
}

/** A path's query value as a `?path=` of the API ("" for the top). */
export function pathQuery(path, more = {}) {
  const q = new URLSearchParams(Object.entries(more).filter(([, v]) => v));
  if (path) q.set("path", path);
  const text = q.toString();
  return text ? `?${text}` : "";
}

/** A link that opens `path` on this page: `href` for a new tab or a reload, `open(path)` in place. */
function opener(path, text, { href, open }) {
  return h("a", { href: href(path), "data-open": path, onclick: (e) => (e.preventDefault(), open(path)) }, text);
}

/** The folder's path from the top, each folder above it a link: `top / data / train`. */
export function crumbs(path, { top, href, open, id }) {
  const parts = path ? path.split("/") : [];
  const links = [parts.length ? opener("", top, { href, open }) : h("strong", {}, top)];
  parts.forEach((part, i) => {
    const at = parts.slice(0, i + 1).join("/");
    links.push(" / ", i === parts.length - 1 ? h("strong", {}, part) : opener(at, part, { href, open }));
  });
  return h("nav", { class: "crumbs", id, "aria-label": "Folder" }, links);
}

/** A download link of an entry: a file as it is, a folder as a tar. */
export function downloadLink(entry, href) {
  const name = baseName(entry.path);
  const folder = entry.kind === "dir";
  return h("a", { class: "button download", href, download: folder ? `${name}.tar` : name },
    folder ? "Download (tar)" : "Download");
}

/** The entries of one folder: [{path, kind, size_bytes, modified_at}] with `href(path)` and `open(path)` to open
 *  a folder on the page, `download(path)` its content's address, `remove(entry)` where entries can be removed. */
export function fileTable(listing, { id, href, open, download, remove = null, emptyText, emptyHint }) {
  if (!listing.items.length) return empty(emptyText, emptyHint);
  const rows = listing.items.map((e) => h("tr", { "data-path": e.path, "data-kind": e.kind },
    h("td", { class: "name" }, e.kind === "dir"
      ? opener(e.path, `${baseName(e.path)}/`, { href, open })
      : h("span", { class: e.kind === "other" ? "muted" : null }, baseName(e.path))),
    h("td", { class: "num" }, e.kind === "file" ? bytes(e.size_bytes) : h("span", { class: "muted" }, "—")),
    h("td", {}, ago(e.modified_at)),
    h("td", {}, h("div", { class: "actions" },
      e.kind === "other"
        ? h("span", { class: "muted", title: "a link or a special file: never read" }, "not readable")
        : downloadLink(e, download(e.path)),
      remove ? h("button", { class: "danger remove", onclick: () => remove(e) }, "Remove") : null)),
  ));
  return [
    tableBox(h("table", { id, class: "files" },
      h("thead", {}, h("tr", {}, ["Name", "Size", "Modified", ""]
        .map((t) => h("th", { scope: "col", class: t === "Size" ? "num" : null }, t)))),
      h("tbody", {}, rows))),
    listing.truncated
      ? h("p", { class: "hint" }, "This folder holds more entries than one listing shows: download it whole for the rest.")
      : null,
  ];
}
