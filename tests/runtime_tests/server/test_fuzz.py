"""Fuzzing: schemathesis generates requests from the server's own OpenAPI document (valid ones and invalid ones,
fixed seed) against a real server on the torch reference runner and the tiny model. No request may get a 5xx,
every 4xx carries OpenAI's error body, and a greedy request sent over and over meanwhile, from another client,
always gets transformers' greedy text.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, seed, settings

from neuronmodel_runtime.config import RuntimeConfig
from runtime_tests.helpers.fakes import make_engine
from runtime_tests.server.conftest import TINY, TINY_SERVER

#: Examples per operation; the document has 8 (two generation routes, /v1/models/{model}, and five without
#: parameters, which give one example each), so more than 1,000 requests in all.
EXAMPLES = 250
MIN_CASES = 1000
PROMPT = "Once upon a time"
GREEDY_TOKENS = 12



def server_document() -> dict[str, Any]:
    """The document the server publishes at /openapi.json; it depends on the routes only, not on the engine
    (test_the_live_server_publishes_the_fuzzed_document checks), so it is built at collection without a model."""
    from neuronmodel_runtime.server.app import create_app

    config = RuntimeConfig.model_validate(TINY_SERVER)
    return create_app(make_engine(config), config).openapi()


# Not schemathesis.pytest.from_fixture: its lazy schemas fail under pytest 9.2 (`Function` has no `_nodeid`).
DOCUMENT = server_document()
schema = schemathesis.openapi.from_dict(DOCUMENT)
sent: list[tuple[str, int]] = []  # (operation, status) of every generated request


def test_the_live_server_publishes_the_fuzzed_document(tiny_server):
    assert httpx.get(f"{tiny_server[0]}/openapi.json", timeout=10).json() == DOCUMENT


@pytest.fixture(scope="module")
def reference_text() -> str:
    """transformers' own greedy continuation of PROMPT by the tiny model: the reference independent of our runner."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(TINY))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(TINY), dtype=torch.float32).eval()
    ids = torch.tensor([tokenizer.encode(PROMPT)])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=GREEDY_TOKENS, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


class GreedyClient:
    """Sends the same greedy completion again and again on its own thread until stopped; keeps every answer."""

    def __init__(self, url: str):
        self.answers: list[tuple[int, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self._thread.start()

    def _run(self, url: str) -> None:
        body = {"prompt": PROMPT, "max_tokens": GREEDY_TOKENS, "temperature": 0}
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                response = client.post(f"{url}/v1/completions", json=body)
                self.answers.append((response.status_code, response.json()))
                self._stop.wait(0.2)  # paced: one request in flight beside the fuzzer's

    def stop(self) -> list[tuple[int, Any]]:
        self._stop.set()
        self._thread.join(timeout=60)
        return self.answers


@pytest.fixture(scope="module")
def greedy_client(tiny_server) -> Iterator[GreedyClient]:
    client = GreedyClient(tiny_server[0])
    yield client
    client.stop()


@pytest.mark.slow  # the main suite only (.venv312's fast suite skips it: a minute of CI)
@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@seed(25)
def test_generated_requests_never_get_a_5xx_and_every_4xx_is_an_openai_error(case, tiny_server, greedy_client):
    response = case.call(base_url=tiny_server[0], timeout=60)
    sent.append((f"{case.method} {case.path}", response.status_code))
    assert response.status_code < 500, f"{case.method} {case.path} {case.body!r}: {response.text}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, response.text
        assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)


@pytest.mark.slow
def test_the_fuzzing_sent_enough_requests_and_a_greedy_client_kept_its_text(greedy_client, reference_text):
    operations = {f"{method.upper()} {path}" for path, item in DOCUMENT["paths"].items() for method in item}
    assert operations <= {operation for operation, _ in sent}, "every operation is fuzzed"
    assert len(sent) >= MIN_CASES, f"only {len(sent)} generated requests"
    served = [operation for operation, status in sent if status == 200 and operation.startswith("POST")]
    assert len(served) >= 100, \
        f"only {len(served)} generated generation requests were served: too few to test the runner"
    answers = greedy_client.stop()
    assert answers, "the greedy client sent nothing"
    for status, body in answers:
        assert status == 200, body
        assert body["choices"][0]["text"] == reference_text, (body, reference_text)


# -- regressions: what fuzzing found, each as the plain request ----------------------------------------------


@pytest.mark.parametrize(("route", "body", "param"), [
    ("completions", b'{"prompt": "ab\\ud800c", "max_tokens": 2}', "prompt"),  # was a 500 (the tokenizer's TypeError)
    ("completions", b'{"prompt": ["ok", "\\udfff"], "max_tokens": 2}', "prompt[1]"),
    ("chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content"),
    ("chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
     "messages[0].content[0].text"),
])
def test_a_lone_surrogate_in_text_is_a_400_naming_the_field(tiny_server, route, body, param):
    response = httpx.post(f"{tiny_server[0]}/v1/{route}", content=body, headers={"Content-Type": "application/json"},
                          timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "lone surrogate" in error["message"] and "valid Unicode" in error["message"]
