"""Request size limits as a client meets them on a real server (the torch runner, the tiny model): a body too large
is a 413 before it is parsed, declared or chunked; each field too large is a 400 naming it, with OpenAI's body.

The server runs with max_request_bytes 64 KiB, max_model_len 64 and max_context_length 48 (conftest.TINY_SERVER);
the stop and logit_bias limits are their defaults.
"""

from __future__ import annotations

import json
import socket
from typing import Any, Iterator
from urllib.parse import urlsplit

import httpx
import pytest


def assert_error(response: httpx.Response, status: int, param: Any, *words: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
    assert all(w in error["message"] for w in words), error["message"]
    return error


@pytest.fixture(scope="module")
def url(tiny_server) -> str:
    return tiny_server[0]


def big_body(size: int) -> bytes:
    """A JSON completion request of about `size` bytes."""
    return json.dumps({"prompt": "a " * (size // 2), "max_tokens": 1}).encode()


def chunks(body: bytes, size: int = 8192) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start:start + size]


def test_a_body_over_max_request_bytes_is_413_with_an_openai_error(url):
    response = httpx.post(f"{url}/v1/completions", content=big_body(70 * 1024),
                          headers={"Content-Type": "application/json"}, timeout=30)
    error = assert_error(response, 413, None, "65536 bytes", "server.max_request_bytes")
    assert (error["type"], error["code"]) == ("invalid_request_error", "request_too_large")


def test_a_chunked_body_without_content_length_is_counted_as_it_arrives(url):
    body = big_body(70 * 1024)
    response = httpx.post(f"{url}/v1/chat/completions", content=chunks(body),
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in response.request.headers
    assert_error(response, 413, None, "server.max_request_bytes")
    # A chunked body under the limit is parsed and answered as usual.
    small = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    ok = httpx.post(f"{url}/v1/chat/completions", content=chunks(small, 7),
                    headers={"Content-Type": "application/json"}, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 2


def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_sent(url):
    """The server answers from the headers alone: the client never has to upload a gigabyte to learn the answer."""
    address = urlsplit(url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000000\r\n\r\n{")
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            data = conn.recv(65536)  # times out (a failure) if the server waits for the body
            if not data:
                break
            reply += data
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), reply
    assert json.loads(body)["error"]["code"] == "request_too_large"


def test_a_body_under_the_limit_is_parsed_and_its_prompt_checked_against_max_context_length(url):
    body = big_body(60 * 1024)
    assert len(body) < 64 * 1024
    response = httpx.post(f"{url}/v1/completions", content=body, headers={"Content-Type": "application/json"},
                          timeout=30)
    assert_error(response, 400, "prompt", "at most 48 prompt tokens", "max_context_length")


@pytest.mark.parametrize(("route", "fields", "param", "words"), [
    ("completions", {"n": 17}, "n", ("[1, 16]",)),
    ("chat/completions", {"n": 0}, "n", ("[1, 16]",)),
    ("completions", {"max_tokens": 60}, "max_tokens", ("max_model_len (64)",)),
    ("chat/completions", {"max_tokens": 64}, "max_tokens", ("max_model_len (64)",)),
    ("chat/completions", {"max_completion_tokens": 10**9}, "max_completion_tokens", ("max_model_len",)),
    ("completions", {"stop": [f"s{i}" for i in range(17)]}, "stop", ("17 strings", "at most 16")),
    ("chat/completions", {"stop": "x" * 257}, "stop", ("at most 256 characters", "257")),
    ("completions", {"logit_bias": {str(t): 1 for t in range(1025)}}, "logit_bias", ("1025 entries", "1024")),
])
def test_a_field_over_its_limit_is_400_naming_it(url, route, fields, param, words):
    base = {"prompt": "Once upon a time"} if route == "completions" else {
        "messages": [{"role": "user", "content": "Once upon a time"}]}
    response = httpx.post(f"{url}/v1/{route}", json={**base, **fields}, timeout=30)
    assert_error(response, 400, param, *words)


def test_fields_at_their_limits_are_served(url):
    fields = {"n": 2, "stop": [f"s{i}" for i in range(15)] + ["x" * 256],
              "logit_bias": {str(t): 0 for t in range(1024)}, "temperature": 0}
    prompt = "Once upon a time"
    response = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 4, **fields}, timeout=60)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    # max_tokens exactly filling max_model_len is served too.
    fill = 64 - usage["prompt_tokens"]
    full = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": fill, "ignore_eos": True},
                      timeout=60)
    assert full.status_code == 200 and full.json()["usage"]["completion_tokens"] == fill, full.text
