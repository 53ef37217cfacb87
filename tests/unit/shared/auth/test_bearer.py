"""The one reading of an `Authorization: Bearer` header, shared by the routes and the submit fast path."""

from __future__ import annotations

import pytest

from gpuyard.shared.auth.bearer import bearer_token


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer tok-1", "tok-1"),
        ("bearer tok-1", "tok-1"),
        ("BEARER tok-1", "tok-1"),
        ("bEaReR tok-1", "tok-1"),
        ("Bearer    tok-1", "tok-1"),
        ("  Bearer tok-1  ", "tok-1"),
        ("Bearer\ttok-1", "tok-1"),
        ("Bearer Tok-1", "Tok-1"),  # the token keeps its case
    ],
)
def test_a_bearer_token_is_read_whatever_the_case_of_the_scheme_and_the_spaces(header, token):
    assert bearer_token(header) == token


@pytest.mark.parametrize(
    "header",
    [
        None,  # no header
        "",
        "   ",
        "Bearer",  # no token
        "Bearer ",
        "Bearer    ",
        "Basic dG9rOg==",  # another scheme
        "Token tok-1",
        "Bearertok-1",  # no space after the scheme
        "tok-1",  # a token alone
        "Bearer tok-1 tok-2",  # two words after the scheme
    ],
)
def test_anything_else_is_no_token(header):
    assert bearer_token(header) is None
