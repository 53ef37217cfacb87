"""Tokens kept hashed in a file every submit instance re-reads when it changes: created, listed and revoked by
admins through the API and the CLI; a revocation or an expiry counts on the very next request, everywhere."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from gpuyard import cli
from gpuyard.client import Client
from gpuyard.services.submit.app import create_app
from gpuyard.shared.auth.tokens import TokenRefused, Tokens
from gpuyard.supervisor.datadir import ensure_admin_token
from tests.unit.services.submit.submitctx import another_instance, submit_context

LEGACY = {
    "tokens": {
        "tok-admin": {"tenant": "ops", "user": "root", "admin": True},
        "tok-vision": {"tenant": "vision"},
    }
}
ADMIN = {"Authorization": "Bearer tok-admin"}
VISION = {"Authorization": "Bearer tok-vision"}
SPEC = {"name": "train", "command": "python train.py", "resources": {"gpus": 1}}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def tokens_file(tmp_path):
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(LEGACY))  # the format before tokens were hashed
    return path


@pytest.fixture
def instances(tmp_path, tokens_file):
    """Two submit apps, each with its own reading of the one tokens file (two instances on one machine)."""
    with (
        submit_context(tmp_path, Tokens(tokens_file)) as ctx,
        TestClient(create_app(ctx)) as a,
        TestClient(create_app(another_instance(ctx, Tokens(tokens_file)))) as b,
    ):
        yield a, b


@pytest.fixture
def api(instances):
    return instances[0]


def create(api, **body):
    response = api.post("/v1/admin/tokens", json={"tenant": "nlp", "user": "bo", **body}, headers=ADMIN)
    assert response.status_code == 201, response.text
    return response.json()


def test_a_revoked_token_is_refused_on_the_next_request_by_every_instance_without_a_restart(instances):
    a, b = instances
    created = create(a)
    token = created["token"]
    assert created["tenant"] == "nlp" and created["user"] == "bo" and created["expires"] is None
    for api in (a, b):  # the other instance takes the new token at once too
        assert api.post("/v1/jobs", json=SPEC, headers=bearer(token)).status_code == 202  # the fast path
        assert api.get("/v1/jobs", headers=bearer(token)).status_code == 200  # a route
    assert b.delete(f"/v1/admin/tokens/{created['id']}", headers=ADMIN).status_code == 204
    for api in (a, b):
        for response in (
            api.post("/v1/jobs", json=SPEC, headers=bearer(token)),
            api.get("/v1/jobs", headers=bearer(token)),
        ):
            assert response.status_code == 401 and response.json()["detail"] == "unknown or revoked token"
    assert a.get("/v1/jobs", headers=VISION).status_code == 200  # the others still work
    assert created["id"] not in [t["id"] for t in a.get("/v1/admin/tokens", headers=ADMIN).json()]
    assert b.delete(f"/v1/admin/tokens/{created['id']}", headers=ADMIN).status_code == 404


def test_an_expired_token_gets_401_saying_it_expired(api):
    ctx = api.app.state.ctx
    expired = datetime.now(UTC) - timedelta(seconds=1)
    token, entry = ctx.tokens.create(tenant="nlp", expires=expired)
    for response in (
        api.post("/v1/jobs", json=SPEC, headers=bearer(token)),
        api.get("/v1/jobs", headers=bearer(token)),
    ):
        assert response.status_code == 401
        assert response.json()["detail"] == f"token {entry.id} expired at {expired.isoformat()}"
    listed = {t["id"]: t for t in api.get("/v1/admin/tokens", headers=ADMIN).json()}
    assert datetime.fromisoformat(listed[entry.id]["expires"]) == expired


def test_an_expiry_is_given_as_a_duration_or_a_time(api):
    before = datetime.now(UTC)
    in_a_day = datetime.fromisoformat(create(api, expires_in="1d")["expires"])
    assert before + timedelta(days=1) <= in_a_day <= datetime.now(UTC) + timedelta(days=1)
    at = (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0)
    assert datetime.fromisoformat(create(api, expires_at=at.isoformat())["expires"]) == at


def test_a_token_lives_100_years_at_most(api):
    """An expiry further than a date can hold (year 9999) is no refusal: the token expires in 100 years."""
    expires = datetime.fromisoformat(create(api, expires_in=1e12)["expires"])
    assert timedelta(days=365 * 100 - 1) < expires - datetime.now(UTC) <= timedelta(days=365 * 100)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"expires_in": "1h", "expires_at": "2999-01-01T00:00:00Z"}, "not both"),
        ({"expires_at": "2000-01-01T00:00:00Z"}, "already past"),
        ({"expires_at": "2999-01-01T00:00:00"}, "timezone"),
        ({"expires_in": 0}, "must be positive"),
        ({"expires_in": "soon"}, "duration"),
        ({"tenant": "Bad_Tenant"}, "lowercase"),
        ({"tenant": None}, "valid string"),
        ({"admins": True}, "Extra inputs"),
    ],
)
def test_a_bad_token_request_gets_422_with_its_reason(api, body, words):
    response = api.post("/v1/admin/tokens", json={"tenant": "nlp", **body}, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert words in json.dumps(response.json()["detail"]), response.text


def test_the_list_and_the_file_never_hold_a_token(api, tokens_file):
    token = create(api, admin=True)["token"]
    listing = api.get("/v1/admin/tokens", headers=ADMIN)
    assert listing.status_code == 200
    assert {(t["tenant"], t["admin"]) for t in listing.json()} == {
        ("ops", True),
        ("vision", False),
        ("nlp", True),
    }
    stored = tokens_file.read_text()
    for secret in (token, "tok-admin", "tok-vision"):  # the new one, and the plain ones the write migrated
        digest = hashlib.sha256(secret.encode()).hexdigest()
        assert secret not in listing.text and digest not in listing.text
        assert secret not in stored and f"sha256:{digest}" in stored
    assert tokens_file.stat().st_mode & 0o777 == 0o600
    for secret in (token, "tok-admin", "tok-vision"):  # all still stand for their principal
        assert api.get("/v1/jobs", headers=bearer(secret)).status_code == 200


def test_an_entry_keeps_its_id_when_the_file_is_migrated(api):
    before = {t["id"] for t in api.get("/v1/admin/tokens", headers=ADMIN).json()}
    create(api)
    assert before < {t["id"] for t in api.get("/v1/admin/tokens", headers=ADMIN).json()}


def test_only_an_admin_manages_tokens(api):
    for method, url in (
        ("POST", "/v1/admin/tokens"),
        ("GET", "/v1/admin/tokens"),
        ("DELETE", "/v1/admin/tokens/x"),
    ):
        body = {"json": {"tenant": "nlp"}} if method == "POST" else {}
        assert api.request(method, url, headers=VISION, **body).status_code == 403
        assert api.request(method, url, **body).status_code == 401
    assert len(api.get("/v1/admin/tokens", headers=ADMIN).json()) == 2  # nothing created


def test_a_tokens_file_that_cannot_be_read_refuses_its_tokens_until_fixed(api, tokens_file):
    tokens_file.write_text('{"tokens": {"tok-vision": {"tenant": "vision"} [')
    assert api.get("/v1/jobs", headers=VISION).status_code == 401
    ctx = api.app.state.ctx
    ctx.tokens.inline = Tokens(
        None, "tok-settings=ops::admin"
    ).inline  # an admin the broken file does not hold
    refused = api.post("/v1/admin/tokens", json={"tenant": "nlp"}, headers=bearer("tok-settings"))
    assert refused.status_code == 409 and "cannot be read, fix it first" in refused.json()["detail"]
    assert "line 1, column" in refused.json()["detail"] and "tok-vision" not in refused.text  # never a token
    assert tokens_file.read_text().endswith("[")  # left for its author to fix
    tokens_file.write_text(json.dumps(LEGACY) + "\n")
    assert api.get("/v1/jobs", headers=VISION).status_code == 200


def test_tokens_set_by_the_settings_are_not_revoked_here(tmp_path):
    settings_only = Tokens(None, "tok-admin=ops:root:admin")
    with submit_context(tmp_path, settings_only) as ctx, TestClient(create_app(ctx)) as api:
        [entry] = api.get("/v1/admin/tokens", headers=ADMIN).json()
        assert entry["inline"] is True
        refused = api.delete(f"/v1/admin/tokens/{entry['id']}", headers=ADMIN)
        assert refused.status_code == 409 and "GPUYARD_TOKENS" in refused.json()["detail"]
        no_file = api.post("/v1/admin/tokens", json={"tenant": "nlp"}, headers=ADMIN)
        assert no_file.status_code == 409 and "GPUYARD_TOKENS_FILE" in no_file.json()["detail"]


# ---------------------------------------------------------------- the CLI, against the real app


@pytest.fixture
def cli_api(api, monkeypatch):
    class AppClient(Client):
        def __init__(self, server=None, token=None, timeout=30):
            super().__init__("http://testserver", token or "tok-admin")
            self.http = api
            self.http.headers["Authorization"] = f"Bearer {self.token}"

    monkeypatch.setattr(cli.common, "Client", AppClient)
    return api


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_create_prints_the_token_once_ls_a_table_and_revoke_ends_it(cli_api, capsys):
    code, out, err = run(
        capsys, "admin", "tokens", "create", "--tenant", "nlp", "--user", "bo", "--expires-in", "30d"
    )
    assert code == 0, err
    token = out.strip()
    assert token.startswith("gy_") and "\n" not in token  # stdout is the token alone (for scripts)
    assert "shown this once" in err and token not in err
    assert cli_api.get("/v1/jobs", headers=bearer(token)).status_code == 200

    code, out, err = run(capsys, "admin", "tokens", "ls")
    assert code == 0, err
    header, *lines = out.strip().splitlines()
    assert header.split() == ["ID", "TENANT", "USER", "ADMIN", "CREATED", "EXPIRES"]
    [row] = [line for line in lines if " nlp " in line]
    token_id = row.split()[0]
    assert "bo" in row.split() and "UTC" in row and token not in out

    code, out, err = run(capsys, "admin", "tokens", "revoke", token_id)
    assert code == 0 and token_id in out, err
    assert cli_api.get("/v1/jobs", headers=bearer(token)).status_code == 401
    code, out, err = run(capsys, "admin", "tokens", "revoke", token_id)
    assert code == 1 and f"no token '{token_id}' (HTTP 404)" in err and "Traceback" not in err


def test_cli_a_non_admin_is_told_in_one_line(cli_api, capsys):
    code, _, err = run(capsys, "admin", "tokens", "ls", "--token", "tok-vision")
    assert code == 1 and "this needs an admin token (HTTP 403)" in err
    with pytest.raises(SystemExit) as exit_:  # argparse: one expiry
        cli.main(["admin", "tokens", "create", "--tenant", "nlp", "--expires-in", "1h", "--expires-at", "x"])
    assert exit_.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_each_write_is_seen_even_within_one_tick_of_the_file_clock(tmp_path):
    """File times come from a coarse clock: two writes of the same size could share one. Each write is given a
    later mtime than the last, so a reader's check sees it (here the last one is set ahead of the clock)."""
    path = tmp_path / "tokens.json"
    writer, reader = Tokens(path), Tokens(path)
    first, entry = writer.create(tenant="a", user="x")
    ahead = path.stat().st_mtime_ns + 10**12
    os.utime(path, ns=(ahead, ahead))
    reader.authenticate(first)
    writer.revoke(entry.id)
    assert path.stat().st_mtime_ns > ahead
    with pytest.raises(TokenRefused):
        reader.authenticate(first)


def up_minted(path) -> list[dict]:
    """The entries of the tokens file that `gpuyard up` marked as its admin token."""
    stored = json.loads(path.read_text())["tokens"].values()
    return [e for e in stored if e.get("minted_by") == "gpuyard up"]


def test_gpuyard_up_keeps_the_saved_admin_token_while_the_file_takes_it(tmp_path):
    path = tmp_path / "tokens.json"
    token, new = ensure_admin_token(tmp_path, [])
    assert new and Tokens(path).authenticate(token).admin and token not in path.read_text()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert ensure_admin_token(tmp_path, [token]) == (token, False)
    assert ensure_admin_token(tmp_path, ["gy_another-platforms", token]) == (token, False)  # the first taken
    assert len(up_minted(path)) == 1 and len(Tokens(path).entries()) == 1  # restarts pile up nothing


def test_a_new_admin_token_of_gpuyard_up_revokes_the_one_before_it_and_no_other(tmp_path):
    path = tmp_path / "tokens.json"
    lost, _ = ensure_admin_token(tmp_path, [])  # its saved copy is lost (another config dir, deleted)
    by_hand, _ = Tokens(path).create(tenant="ops", user="root", admin=True)
    team, _ = Tokens(path).create(tenant="vision", user="ana")
    token, new = ensure_admin_token(tmp_path, ["gy_not-in-this-file", team])  # not an admin's: not kept
    assert new and token not in (lost, by_hand, team)
    with pytest.raises(TokenRefused):
        Tokens(path).authenticate(lost)
    assert Tokens(path).authenticate(by_hand).admin and Tokens(path).authenticate(team).tenant == "vision"
    assert [e["id"] for e in up_minted(path)] == [Tokens(path).entry(token).id]


def test_an_expired_admin_token_is_replaced_and_revoked(tmp_path):
    path = tmp_path / "tokens.json"
    past = datetime.now(UTC) - timedelta(days=1)
    expired, _ = Tokens(path).create(tenant="default", user="admin", admin=True, expires=past)
    token, new = ensure_admin_token(tmp_path, [expired])
    assert new and token != expired and len(Tokens(path).entries()) == 2  # a hand-made one: kept, expired


def test_a_token_of_an_older_gpuyard_up_is_kept_and_becomes_the_marked_one(tmp_path):
    path = tmp_path / "tokens.json"
    older, _ = Tokens(path).create(tenant="default", user="admin", admin=True)  # as gpuyard up made them
    Tokens(path).create(tenant="vision", user="ana")
    assert ensure_admin_token(tmp_path, [older]) == (older, False)
    stored = json.loads(path.read_text())["tokens"].values()
    assert [e.get("minted_by") for e in stored] == ["gpuyard up", None]  # (only where it is set)


def test_a_tokens_file_gpuyard_up_cannot_read_is_one_line(tmp_path):
    (tmp_path / "tokens.json").write_text("tokens: [not, a, table")
    with pytest.raises(SystemExit) as refused:
        ensure_admin_token(tmp_path, [])
    assert str(refused.value.code).startswith("the admin token: the tokens file cannot be read")
