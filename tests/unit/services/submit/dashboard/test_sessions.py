"""Dashboard session cookies and CSRF tokens (shared/auth/sessions.py)."""

from __future__ import annotations

import pytest

from gpuyard.shared.auth import sessions

SECRET = b"k" * 48


def test_a_session_reads_back_as_issued_until_it_expires():
    cookie, session = sessions.issue(SECRET, "tok_abc", lifetime=60, now=1000)
    assert sessions.read(SECRET, cookie, now=1059) == session
    assert session.token_id == "tok_abc" and session.expires == 1060
    with pytest.raises(sessions.SessionRefused, match="expired"):
        sessions.read(SECRET, cookie, now=1060)


def test_a_cookie_never_carries_the_token_and_each_login_is_a_new_session():
    first, a = sessions.issue(SECRET, "tok_abc", lifetime=60)
    second, b = sessions.issue(SECRET, "tok_abc", lifetime=60)
    assert first != second and a.nonce != b.nonce
    assert sessions.csrf_token(SECRET, a) != sessions.csrf_token(SECRET, b)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda c: c.replace("tok_abc", "tok_adm"),  # another token's id
        lambda c: c.rsplit(".", 1)[0] + ".AAAA",  # another signature
        lambda c: c.replace(".", ".9", 2).replace(".9", ".", 1),  # a later expiry
        lambda c: "gys1.tok_abc",
        lambda c: "",
    ],
)
def test_an_altered_cookie_is_refused(tamper):
    cookie, _ = sessions.issue(SECRET, "tok_abc", lifetime=60)
    with pytest.raises(sessions.SessionRefused):
        sessions.read(SECRET, tamper(cookie))


def test_another_platforms_key_is_refused_with_its_reason():
    cookie, _ = sessions.issue(SECRET, "tok_abc", lifetime=60)
    with pytest.raises(sessions.SessionRefused, match="another key"):
        sessions.read(b"z" * 48, cookie)


def test_the_csrf_token_is_the_sessions_own():
    _, session = sessions.issue(SECRET, "tok_abc", lifetime=60)
    _, other = sessions.issue(SECRET, "tok_abc", lifetime=60)
    assert sessions.csrf_ok(SECRET, session, sessions.csrf_token(SECRET, session))
    assert not sessions.csrf_ok(SECRET, session, sessions.csrf_token(SECRET, other))
    assert not sessions.csrf_ok(SECRET, session, None)


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        (None, "127.0.0.1:8080", True),
        ("http://127.0.0.1:8080", "127.0.0.1:8080", True),
        ("https://gpu.example.com", "gpu.example.com", True),
        ("http://evil.example", "127.0.0.1:8080", False),
        ("http://127.0.0.1:8081", "127.0.0.1:8080", False),
        ("null", "127.0.0.1:8080", False),
    ],
)
def test_same_origin(origin, host, same):
    assert sessions.same_origin(origin, host) is same


def test_a_token_id_that_a_cookie_could_not_carry_is_refused():
    with pytest.raises(ValueError):
        sessions.issue(SECRET, "tok.with.dots", lifetime=60)
