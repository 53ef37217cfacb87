"""The HTML around every dashboard page: head, navigation, who is logged in, and the page's script. The pages
themselves are drawn by their scripts from the JSON API; nothing here is specific to one page."""

from __future__ import annotations

import hashlib
from functools import cache
from html import escape
from importlib.resources import files

from gpuyard.services.submit.dashboard.pages import NAV, Page
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.contracts.events.envelope import type_of
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.contracts.version import VERSION

STATIC = "/static/dashboard"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def page_headers(scheme: str, hostname: str | None, serving_url: str = "") -> dict[str, str]:
    """SECURITY_HEADERS for a page served to `scheme://hostname`: its scripts may also call the serving entry
    point (the Models page's inference form and request rates): `serving_url`, and the other ports of the
    page's own host."""
    sources = [f"{scheme}://{f'[{hostname}]' if ':' in hostname else hostname}:*"] if hostname else []
    if serving_url:
        sources.append(serving_url.rstrip("/"))
    if not sources:
        return SECURITY_HEADERS
    policy = SECURITY_HEADERS["Content-Security-Policy"] + f"; connect-src 'self' {' '.join(sources)}"
    return {**SECURITY_HEADERS, "Content-Security-Policy": policy}


@cache
def asset_version() -> str:
    """A digest of the static files, appended to their addresses: a new release is never served stale."""
    digest = hashlib.sha256(VERSION.encode())
    root = files(__package__) / "static"
    for path in sorted(_walk(root), key=str):
        digest.update(str(path).encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def _walk(folder):
    for item in folder.iterdir():
        yield from _walk(item) if item.is_dir() else (item,)


def asset(name: str) -> str:
    return f"{STATIC}/{name}?v={asset_version()}"


def _head(title: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · GPUYARD</title>"
        f'<link rel="stylesheet" href="{asset("app.css")}">'
        f'<link rel="icon" href="{asset("favicon.svg")}" type="image/svg+xml">'
    )


def page_html(page: Page, principal: Principal, csrf: str, params: dict[str, str]) -> str:
    links = "".join(
        f'<a href="{p.path}"{" aria-current=page" if p is page else ""}>{escape(p.nav or "")}</a>'
        for p in NAV
    )
    who = escape(principal.name) + (
        " · admin" if principal.admin else f" · tenant {escape(principal.tenant)}"
    )
    data = "".join(f' data-{escape(k.replace("_", "-"))}="{escape(v)}"' for k, v in params.items())
    return (
        _head(page.title)
        + f'<meta name="csrf-token" content="{escape(csrf)}">'
        + f'<meta name="event-types" content="{",".join(type_of(s) for s in Subject)}">'
        + f'<script type="module" src="{asset("pages/" + page.script)}"></script></head><body>'
        '<header class="top"><a class="brand" href="/">GPUYARD</a>'
        f'<nav aria-label="Pages">{links}</nav>'
        f'<span class="who" data-tenant="{escape(principal.tenant)}" data-admin="{str(principal.admin).lower()}">'
        f"{who}</span>"
        f'<form method="post" action="/logout" class="logout"><input type="hidden" name="csrf" value="{escape(csrf)}">'
        '<button type="submit">Log out</button></form>'
        '<span id="live" class="live" title="Live updates from the event stream">connecting…</span></header>'
        f'<main id="page" data-page="{escape(page.script.removesuffix(".js"))}"{data}>'
        f"<h1>{escape(page.title)}</h1>"
        '<noscript><p class="error">The dashboard needs JavaScript. The same data is in the API: <a href="/docs">'
        "/docs</a>.</p></noscript></main></body></html>"
    )


def login_html(error: str = "", next_path: str = "/") -> str:
    message = f'<p class="error" role="alert">{escape(error)}</p>' if error else ""
    return (
        _head("Log in") + '</head><body class="login"><main><h1>GPUYARD</h1>'
        "<p>Log in with your token (<code>gpuyard up</code> prints one; admins create more with "
        "<code>gpuyard admin tokens create</code>).</p>"
        f'{message}<form method="post" action="/login">'
        f'<input type="hidden" name="next" value="{escape(next_path)}">'
        '<label for="token">Token</label>'
        '<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>'
        '<button type="submit">Log in</button></form></main></body></html>'
    )


def message_html(title: str, text: str) -> str:
    return (
        _head(title) + f'</head><body class="login"><main><h1>{escape(title)}</h1><p>{escape(text)}</p>'
        '<p><a href="/jobs">Jobs</a> · <a href="/">Cluster</a></p></main></body></html>'
    )
