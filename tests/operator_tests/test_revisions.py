"""hf:// revisions pinned at reconcile (revisions.py), against a local Hub over HTTP (fake_hf_hub.py of the runtime
tests, reached through HF_ENDPOINT as a mirror would be): an unpinned source becomes the commit its branch is at,
once; a moved branch does not move a pin already known; commits and other sources pass through without a request;
what cannot be resolved is a SpecError naming the field, and a Hub that does not answer a retryable HubUnavailable.
"""

from __future__ import annotations

import socket
from typing import Optional

import pytest
from runtime_tests.helpers.fake_hf_hub import FakeHub

from neuronmodel_operator import api, revisions

REPO = "org/tiny"
SOURCE = f"hf://{REPO}"
MOVED = "feed" * 10


@pytest.fixture(scope="module")
def running_hub():
    with FakeHub(REPO, {"config.json": b"{}"}) as hub:
        yield hub


@pytest.fixture
def hub(running_hub, monkeypatch):
    """The Hub, its log empty and main at its first commit, as HF_ENDPOINT."""
    monkeypatch.setattr(running_hub, "commit", running_hub.commit)  # put back after a test moves main
    running_hub.requests.clear()
    monkeypatch.setenv("HF_ENDPOINT", running_hub.url)
    monkeypatch.setenv("HF_TOKEN", "hf_operator_own_token")  # must never be sent: the pods fetch without one
    return running_hub


def spec(source: str = SOURCE, revision: Optional[str] = None, token: bool = False,
         draft: Optional[dict] = None) -> api.NeuronModelSpec:
    model = {"source": source, **({"revision": revision} if revision else {}),
             **({"tokenSecretRef": {"name": "hf-token"}} if token else {})}
    speculation = {"speculation": {"mode": "draft", "draftModel": draft}} if draft else {}
    return api.parse_spec({"model": model, "replicas": 2, **speculation})


def infos(hub: FakeHub) -> list[str]:
    return [r.path for r in hub.requests if r.path.startswith("/api/models/")]


def test_an_unpinned_source_is_pinned_to_the_commit_main_is_at(hub):
    pinned, used = revisions.pin(spec(), {})
    assert pinned.model.revision == hub.commit
    assert used == {f"{SOURCE}@": hub.commit}
    assert infos(hub) == [f"/api/models/{REPO}/revision/main"]
    assert all(r.authorization is None for r in hub.requests)  # neither HF_TOKEN nor a stored login
    assert pinned == spec(revision=hub.commit)  # nothing else changed


def test_a_branch_named_in_the_spec_is_keyed_by_its_name(hub):
    pinned, used = revisions.pin(spec(revision="main"), {})
    assert pinned.model.revision == hub.commit and used == {f"{SOURCE}@main": hub.commit}


def test_a_known_pin_stays_when_main_moves(hub):
    first = hub.commit
    _, used = revisions.pin(spec(), {})
    hub.commit = MOVED  # main moves on the Hub
    asked = len(hub.requests)
    pinned, again = revisions.pin(spec(), used)
    assert pinned.model.revision == first and again == used
    assert len(hub.requests) == asked  # a known source and revision are never asked again
    fresh, _ = revisions.pin(spec(), {})  # while a source nobody resolved yet gets the new commit
    assert fresh.model.revision == MOVED


def test_an_edited_revision_is_resolved_again(hub):
    _, used = revisions.pin(spec(), {})
    hub.commit = MOVED
    pinned, again = revisions.pin(spec(revision="main"), used)
    assert pinned.model.revision == MOVED and again == {f"{SOURCE}@main": MOVED}


@pytest.mark.parametrize(("source", "revision"), [
    (SOURCE, "0e9e39f249a16976918f6564b8830bc894c89659"),
    ("s3://models/llama", None), ("pvc://models/llama", "main"), ("/var/lib/neuronmodel/models/tiny", None),
])
def test_commits_and_other_sources_pass_through_without_a_request(hub, source, revision):
    given = spec(source, revision, token=True)
    pinned, used = revisions.pin(given, {})
    assert pinned == given and used == {}
    assert hub.requests == []


def test_the_draft_model_is_pinned_too_and_one_source_is_asked_once(hub):
    pinned, used = revisions.pin(spec(draft={"source": SOURCE}), {})
    assert pinned.model.revision == pinned.speculation.draft_model.revision == hub.commit
    assert pinned.speculation.mode == "draft" and used == {f"{SOURCE}@": hub.commit}
    assert len(infos(hub)) == 1


def test_a_gated_source_under_a_token_secret_is_pinned_without_the_token(hub):
    pinned, used = revisions.pin(spec(token=True), {})  # the Hub shows a gated repository's commits to anyone
    assert pinned.model.revision == hub.commit and used == {f"{SOURCE}@": hub.commit}
    assert all(r.authorization is None for r in hub.requests)


@pytest.mark.parametrize("draft", [False, True])
def test_an_unpinned_private_source_is_refused_with_how_to_pin_it(monkeypatch, draft):
    commit = "0e9e39f249a16976918f6564b8830bc894c89659"
    given = spec(revision=commit, token=True, draft={"source": SOURCE}) if draft else spec(token=True)
    field = "spec.speculation.draftModel.revision" if draft else "spec.model.revision"
    with FakeHub(REPO, {"config.json": b"{}"}, token="hf_the_pods_token") as private:
        monkeypatch.setenv("HF_ENDPOINT", private.url)
        with pytest.raises(api.SpecError) as raised:
            revisions.pin(given, {})
        assert private.requests and all(r.authorization is None for r in private.requests)
    message = str(raised.value)
    assert message.startswith(f"{field}: pin a commit of {SOURCE}")
    assert "spec.model.tokenSecretRef" in message and "never reads Secrets" in message


def test_a_token_secret_source_resolved_before_keeps_its_commit(hub):
    pinned, used = revisions.pin(spec(token=True), {f"{SOURCE}@": MOVED})
    assert pinned.model.revision == MOVED and used == {f"{SOURCE}@": MOVED} and hub.requests == []


def test_an_unknown_repository_names_the_source(hub):
    with pytest.raises(api.SpecError, match=r"^spec\.model\.source: the Hub has no public repository org/other"):
        revisions.pin(spec("hf://org/other"), {})


def test_an_unknown_revision_names_the_revision(hub):
    with pytest.raises(api.SpecError, match=r"^spec\.model\.revision: hf://org/tiny has no revision 'v2'"):
        revisions.pin(spec(revision="v2"), {})


def test_a_repository_id_the_hub_refuses_names_the_source(hub):
    with pytest.raises(api.SpecError, match=r"^spec\.model\.source: org/a\.\.b is not a Hugging Face repository id"):
        revisions.pin(spec("hf://org/a..b"), {})
    assert hub.requests == []


def test_a_hub_that_does_not_answer_is_retryable(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", closed)
    with pytest.raises(revisions.HubUnavailable, match=f"the Hub at {closed} did not answer"):
        revisions.pin(spec(), {})


def test_a_hub_error_is_retryable(hub, monkeypatch):
    monkeypatch.setattr(hub, "_handle", lambda handler, body: hub._reply(handler, 503, {}))
    with pytest.raises(revisions.HubUnavailable, match=f"the Hub at {hub.url} answered HTTP 503"):
        revisions.pin(spec(), {})


def test_a_mirror_that_answers_no_commit_is_retryable(hub):
    hub.commit = "main"
    with pytest.raises(revisions.HubUnavailable, match="answered no commit sha but 'main'"):
        revisions.pin(spec(), {})
