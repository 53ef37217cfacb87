"""The dashboard's login, session cookie, CSRF protection and pages (services/submit/dashboard/)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from gpuyard.services.submit.dashboard.pages import NAV, PAGES
from gpuyard.shared.auth import sessions
from tests.unit.services.submit.dashboard.conftest import HOST, login

SPEC = {"name": "train", "command": "python train.py", "resources": {"gpus": 0}}


def csrf_of(page_html: str) -> str:
    return re.search(r'<meta name="csrf-token" content="([^"]+)"', page_html).group(1)


def submit_as(client, token: str) -> str:
    response = client.post("/v1/jobs", json=SPEC, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 202, response.text
    return response.json()["job_id"]


def test_a_visitor_without_a_session_gets_the_login_form_and_pages_send_back_to_it(client):
    home = client.get("/")
    assert home.status_code == 200 and 'name="token"' in home.text and 'action="/login"' in home.text
    jobs = client.get("/jobs?state=queued", follow_redirects=False)
    assert jobs.status_code == 303 and jobs.headers["location"] == "/?next=/jobs%3Fstate%3Dqueued"
    assert client.get("/v1/jobs").status_code == 401


def test_login_sets_an_httponly_samesite_cookie_that_expires_and_lands_where_asked(client):
    response = login(client, "tok-vision", "/jobs")
    assert response.status_code == 303 and response.headers["location"] == "/jobs"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{sessions.COOKIE}=") and "tok-vision" not in cookie
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Max-Age=3600" in cookie
    page = client.get("/jobs")
    assert page.status_code == 200 and "tenant vision" in page.text
    assert client.get("/v1/jobs").status_code == 200  # the API takes the session too


@pytest.mark.parametrize("token", ["", "nope", "gyjob1.x.y"])
def test_a_wrong_token_is_refused_in_words(client, token):
    response = login(client, token)
    assert response.status_code == 401 and 'role="alert"' in response.text
    assert sessions.COOKIE not in response.headers.get("set-cookie", "")


@pytest.mark.parametrize("next_path", ["https://evil.example/", "//evil.example/x", "/\\evil.example"])
def test_login_never_sends_to_another_site(client, next_path):
    assert login(client, "tok-vision", next_path).headers["location"] == "/"


def test_a_login_posted_from_another_sites_page_is_refused(client):
    response = client.post(
        "/login",
        data={"token": "tok-vision"},
        headers={"Origin": "http://evil.example"},
        follow_redirects=False,
    )
    assert response.status_code == 403 and sessions.COOKIE not in response.headers.get("set-cookie", "")


def test_a_change_through_the_session_needs_the_pages_csrf_token(client):
    login(client, "tok-vision")
    csrf = csrf_of(client.get("/submit").text)
    refused = client.post("/v1/jobs", json=SPEC)
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    wrong = client.post("/v1/jobs", json=SPEC, headers={"X-CSRF-Token": csrf[:-2] + "xx"})
    assert wrong.status_code == 403
    elsewhere = client.post(
        "/v1/jobs", json=SPEC, headers={"X-CSRF-Token": csrf, "Origin": "http://evil.example"}
    )
    assert elsewhere.status_code == 403
    accepted = client.post("/v1/jobs", json=SPEC, headers={"X-CSRF-Token": csrf, "Origin": f"http://{HOST}"})
    assert accepted.status_code == 202, accepted.text
    job = client.get(f"/v1/jobs/{accepted.json()['job_id']}").json()
    assert job["tenant"] == "vision" and job["user"] == "ana"


def test_revoking_the_token_ends_its_sessions_at_the_next_request(client, ctx):
    login(client, "tok-vision")
    assert client.get("/v1/jobs").status_code == 200
    entry = ctx.tokens.entry("tok-vision")
    assert ctx.tokens.revoke(entry.id) is not None
    assert client.get("/v1/jobs").status_code == 401
    page = client.get("/")  # back to the login form, with the reason, and the dead cookie cleared
    assert 'name="token"' in page.text and "revoked" in page.text
    assert f'{sessions.COOKIE}=""' in page.headers["set-cookie"]


def test_an_expired_session_is_refused(client, ctx, monkeypatch):
    login(client, "tok-vision")
    session = sessions.read(ctx.session_secret, client.cookies.get(sessions.COOKIE))
    assert client.get("/v1/jobs").status_code == 200
    monkeypatch.setattr(
        sessions, "time", SimpleNamespace(time=lambda: float(session.expires))
    )  # (not the cookie jar's clock)
    refused = client.get("/v1/jobs")
    assert refused.status_code == 401 and "expired" in refused.json()["detail"]


def test_logout_needs_the_pages_csrf_token_and_ends_the_session(client):
    login(client, "tok-vision")
    csrf = csrf_of(client.get("/jobs").text)
    assert client.post("/logout", data={"csrf": "forged"}, follow_redirects=False).status_code == 403
    assert client.get("/v1/jobs").status_code == 200
    response = client.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/"
    assert client.get("/v1/jobs").status_code == 401


def test_every_page_has_the_same_navigation(client):
    login(client, "tok-admin")
    names = [p.nav for p in NAV]
    assert names == [
        "Cluster",
        "Jobs",
        "Submit",
        "Models",
        "Volumes",
        "Alerts",
        "Tenants",
        "Nodes",
        "Environments",
        "Dev",
    ]
    job_id = submit_as(client, "tok-admin")
    for page in PAGES:
        html = client.get(page.path.replace("{job_id}", job_id)).text
        links = re.findall(r'<nav aria-label="Pages">(.*?)</nav>', html)[0]
        assert re.findall(r">([A-Za-z]+)</a>", links) == names, page.path
        assert f"pages/{page.script}?v=" in html


def test_a_tenant_cannot_open_another_tenants_job_page(client):
    job_id = submit_as(client, "tok-nlp")
    login(client, "tok-vision")
    refused = client.get(f"/jobs/{job_id}")
    assert refused.status_code == 404 and job_id in refused.text
    assert client.get(f"/v1/jobs/{job_id}").status_code == 404
    assert job_id not in client.get("/v1/jobs").text
    own = submit_as(client, "tok-vision")
    page = client.get(f"/jobs/{own[:10]}")  # a prefix, as the CLI takes it, names the job in full
    assert page.status_code == 200 and f'data-job-id="{own}"' in page.text


def test_pages_forbid_framing_and_inline_scripts(client):
    login(client, "tok-vision")
    headers = client.get("/jobs").headers
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert "script-src" not in headers["content-security-policy"]  # default-src 'self': no inline script
    assert headers["x-content-type-options"] == "nosniff"
    # the page's scripts may call the serving entry point on another port of the same host, nothing else
    assert f"connect-src 'self' http://{HOST}:*" in headers["content-security-policy"]


def test_static_files_are_served_and_versioned(client):
    login(client, "tok-vision")
    html = client.get("/jobs").text
    for src in re.findall(r'(?:src|href)="(/static/dashboard/[^"]+)"', html):
        assert client.get(src).status_code == 200, src
