"""The API's documentation pages, `/docs` (Swagger UI) and `/redoc`, with their scripts and styles served by
the platform itself from an installed package (fastapi-offline's copy of swagger-ui-dist and redoc), never
from a CDN: the pages work on a machine with no internet access."""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/static/api-docs"


def add_docs_pages(app: FastAPI) -> None:
    """Mount the assets and the two pages (the app is created with docs_url=None, redoc_url=None)."""
    app.mount(ASSETS, StaticFiles(directory=str(files("fastapi_offline") / "static")), name="api-docs")
    title = f"{app.title} API"
    openapi_url = app.openapi_url
    if openapi_url is None:
        raise ValueError("the API docs pages need the app's OpenAPI document (its openapi_url)")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=title,
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=title,
            redoc_js_url=f"{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
