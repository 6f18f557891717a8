"""/openapi.json and /docs: a valid OpenAPI document of every endpoint, its request bodies, responses and OpenAI
error bodies, open without the API key, and accurate: real responses validate against the schemas it gives."""

import json

import httpx
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from runtime_tests.helpers.fakes import MODEL, asgi_client, live_server, make_config

ERROR = "#/components/schemas/ErrorResponse"
ROUTES = {
    "/v1/completions": {"post"},
    "/v1/chat/completions": {"post"},
    "/v1/models": {"get"},
    "/v1/models/{model}": {"get"},
    "/v1/info": {"get"},
    "/health": {"get"},
    "/ready": {"get"},
    "/metrics": {"get"},
}
#: path -> (request body schema, 200 JSON schema, error statuses besides 401).
CONTRACT = {
    "/v1/completions": ("CompletionRequest", "CompletionResponse", {400, 404, 413, 429, 500, 503}),
    "/v1/chat/completions": ("ChatCompletionRequest", "ChatCompletionResponse", {400, 404, 413, 429, 500, 503}),
    "/v1/models": (None, "ModelList", set()),
    "/v1/models/{model}": (None, "ModelCard", {404}),
    "/v1/info": (None, "ServerInfo", set()),
    "/health": (None, "Health", {503}),
    "/ready": (None, "Readiness", {503}),
}
STREAM_CHUNKS = {"/v1/completions": "CompletionResponse", "/v1/chat/completions": "ChatCompletionChunk"}


def ref(name):
    return {"$ref": f"#/components/schemas/{name}"}


def refs(node):
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def resolve(doc, pointer):
    assert pointer.startswith("#/"), pointer
    node = doc
    for part in pointer[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def schema_of(doc, path, method, status, media="application/json"):
    return doc["paths"][path][method]["responses"][str(status)]["content"][media]["schema"]


def check(doc, schema, instance):
    """Validate a real response body against a schema of the document (its $refs resolve inside `doc`)."""
    Draft202012Validator({**schema, "components": doc["components"]}).validate(instance)


def test_document_is_valid_complete_and_open_without_the_api_key():
    with live_server(make_config(**{"server.api_key": "k-1"})) as (url, _, _):
        r = httpx.get(f"{url}/openapi.json")
        docs = httpx.get(f"{url}/docs")
        assert httpx.get(f"{url}/v1/models").status_code == 401
    assert r.status_code == 200 and docs.status_code == 200 and "swagger-ui" in docs.text
    assert "/openapi.json" in docs.text
    doc = r.json()
    validate(doc)
    for pointer in set(refs(doc)):
        resolve(doc, pointer)  # every $ref resolves
    assert {p: set(ops) for p, ops in doc["paths"].items()} == ROUTES

    for path, (body, ok, errors) in CONTRACT.items():
        (method,) = ROUTES[path]
        op = doc["paths"][path][method]
        if body:
            assert op["requestBody"]["content"]["application/json"]["schema"] == ref(body)
        assert schema_of(doc, path, method, 200) == ref(ok)
        statuses = {int(s) for s in op["responses"] if s != "200"}
        assert statuses == errors | ({401} if path.startswith("/v1/") else set()), path
        for status in statuses:
            assert schema_of(doc, path, method, status) == {"$ref": ERROR}, (path, status)
        assert op.get("security") == ([{"bearer": []}] if path.startswith("/v1/") else None), path
    for path, chunk in STREAM_CHUNKS.items():
        assert schema_of(doc, path, "post", 200, "text/event-stream") == ref(chunk)
    assert "Retry-After" in doc["paths"]["/v1/completions"]["post"]["responses"]["429"]["headers"]
    assert set(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    bearer = doc["components"]["securitySchemes"]["bearer"]
    assert (bearer["type"], bearer["scheme"]) == ("http", "bearer")


def test_extension_fields_are_documented_and_no_422_without_an_api_key():
    with live_server() as (url, _, _):
        doc = httpx.get(f"{url}/openapi.json").json()
    validate(doc)
    schemas = doc["components"]["schemas"]
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        assert {"top_k", "min_tokens", "ignore_eos", "seed", "stream_options"} <= set(schemas[name]["properties"])
    assert "securitySchemes" not in doc["components"]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert "422" not in op["responses"] and "401" not in op["responses"] and "security" not in op, path
    assert "HTTPValidationError" not in schemas  # validation errors are answered as 400 with ErrorResponse


def sse_payloads(text):
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


async def test_real_responses_match_the_documented_schemas():
    async with asgi_client(make_config(**{"server.api_key": "k-2"})) as (client, _):
        doc = (await client.get("/openapi.json")).json()
        auth = {"Authorization": "Bearer k-2"}
        gets = {"/v1/models": "/v1/models", "/v1/models/{model}": f"/v1/models/{MODEL}", "/v1/info": "/v1/info",
                "/health": "/health", "/ready": "/ready"}
        for path, url in gets.items():
            r = await client.get(url, headers=auth)
            assert r.status_code == 200
            check(doc, schema_of(doc, path, "get", 200), r.json())

        bodies = {"/v1/completions": {"prompt": "hi", "max_tokens": 3, "n": 2, "top_k": 5},
                  "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}}
        for path, body in bodies.items():
            r = await client.post(path, json=body, headers=auth)
            assert r.status_code == 200
            check(doc, schema_of(doc, path, "post", 200), r.json())
            r = await client.post(path, json={**body, "stream": True, "stream_options": {"include_usage": True}},
                                  headers=auth)
            chunks = sse_payloads(r.text)
            assert chunks
            for chunk in chunks:
                check(doc, schema_of(doc, path, "post", 200, "text/event-stream"), chunk)

        errors = [
            ("/v1/completions", "post", {"prompt": "hi", "n": 0}, auth, 400),
            ("/v1/chat/completions", "post", {"messages": []}, auth, 400),
            ("/v1/completions", "post", {"prompt": "hi", "model": "nope"}, auth, 404),
            ("/v1/models/{model}", "get", None, auth, 404),
            ("/v1/completions", "post", {"prompt": "hi"}, {}, 401),
        ]
        for path, method, body, headers, status in errors:
            url = path.replace("{model}", "nope")
            r = await client.request(method.upper(), url, json=body, headers=headers)
            assert r.status_code == status, (path, r.text)
            check(doc, schema_of(doc, path, method, status), r.json())
