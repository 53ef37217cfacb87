"""/docs and /redoc load every script and style from the platform itself: they work offline."""

from __future__ import annotations

import re

import pytest

from tests.unit.services.submit.test_submit_api import api, ctx  # noqa: F401 (fixtures)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_load_their_assets_from_the_platform(api, page):  # noqa: F811
    html = api.get(page)
    assert html.status_code == 200 and "text/html" in html.headers["content-type"]
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html.text), "an asset from another host"
    assets = re.findall(r"""(?:src|href)=["']?(/[^"'\s>]+)""", html.text)
    scripts = [a for a in assets if a.endswith(".js")]
    assert scripts, html.text
    for asset in assets:
        answer = api.get(asset)
        assert answer.status_code == 200 and len(answer.content) > 1000, asset
    assert "/openapi.json" in html.text and api.get("/openapi.json").status_code == 200
