"""Pin hf:// model sources to commits at reconcile, once, so that every replica serves the same weights.

An hf:// source without a commit (no revision: main; or a branch or tag) names weights that change whenever the
branch moves, and each pod's fetch init container would resolve it on its own, when it starts: replicas started a
day apart would serve different weights under one compile key. The operator resolves such a revision to its commit
once, through the Hub API (or the mirror at HF_ENDPOINT), and gives the pods the commit. The reconcile records what
was resolved and passes it back as `known`: a source and revision found there are never asked again, so replicas,
restarts, operator upgrades and refused edits (the Failed status keeps the pins) keep the commit until the user
edits the source or the revision.

The operator never reads Secrets (it has no RBAC on them, on purpose), so it asks the Hub without a token, also for
a source fetched with spec.model.tokenSecretRef: a gated repository (Llama, say) shows its commits to anyone, only
its files need the token. A private one does not: it must name its commit in the spec, and the message says so.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from typing import Mapping, Optional, Union

from neuronmodel_operator import api

HUB_TIMEOUT_S = 10.0  # one request per unpinned source; a Hub that does not answer is retried by the reconcile
DEFAULT_REVISION = "main"  # what `neuronmodel-runtime fetch` (and the Hub) read without a revision
_COMMIT = re.compile(r"[0-9a-f]{40}")
#: What the status adds to a HubUnavailable message while the reconcile retries.
RETRYING = ("retrying with backoff (a cluster whose egress goes through a proxy or a Hub mirror sets the chart's "
            "proxy or hfEndpoint values)")


class HubUnavailable(Exception):
    """The Hub (or the mirror at HF_ENDPOINT) did not answer, or answered 429 or an error that is not the spec's:
    retry later (with backoff); the spec is not at fault."""


def known_key(source: str, revision: Optional[str]) -> str:
    """The key of a source and its revision as the spec gives it (`hf://org/name@main`, `hf://org/name@` for none)
    in `known` and in what `pin` returns."""
    return f"{source}@{revision or ''}"


def is_commit(revision: Optional[str]) -> bool:
    """A full commit sha: pinned already (a branch or tag may move; a short sha is ambiguous to the Hub)."""
    return bool(revision and _COMMIT.fullmatch(revision))


def pin(spec: api.NeuronModelSpec, known: Mapping[str, str]) -> tuple[api.NeuronModelSpec, dict[str, str]]:
    """`spec` with the revision of its hf:// model and draft model set to a commit, and the resolutions it used
    ({known_key: commit}: record them, and pass them back as `known` at the next reconcile).

    A revision that is a full commit already, and any source that is not hf://, pass through without a request; a
    source and revision in `known` take the commit recorded there.

    Raises:
        api.SpecError: an unpinned source fetched with spec.model.tokenSecretRef, or a repository or revision the
            Hub does not have (the message names the field and the fix).
        HubUnavailable: the Hub did not answer, or answered an error that is not the spec's (retryable).
    """
    used: dict[str, str] = {}
    private = spec.model.token_secret_ref is not None
    update: dict[str, object] = {"model": _pinned(spec.model, "spec.model", private, known, used)}
    draft = spec.speculation.draft_model
    if draft is not None:
        pinned = _pinned(draft, "spec.speculation.draftModel", private, known, used)
        update["speculation"] = spec.speculation.model_copy(update={"draft_model": pinned})
    return spec.model_copy(update=update), used


_Source = Union[api.ModelSpec, api.DraftModel]


def _pinned(model: _Source, field: str, private: bool, known: Mapping[str, str], used: dict[str, str]) -> _Source:
    """`model` at a commit: as given, as `known` recorded it (also under a token secret added since), or as the Hub
    resolves it now; what it took is added to `used`."""
    if not model.source.startswith("hf://") or is_commit(model.revision):
        return model
    key = known_key(model.source, model.revision)
    commit = known.get(key) or used.get(key)
    if commit is None:
        commit = _hub_commit(model.source, model.revision or DEFAULT_REVISION, field, private)
    used[key] = commit
    return model.model_copy(update={"revision": commit})


def _hub_commit(source: str, revision: str, field: str, private: bool) -> str:
    """The commit `revision` of the repository of `source` is at now, asked of the Hub (HF_ENDPOINT: a mirror)
    without a token: the operator's own credentials must not see what the pods cannot. `private`: the pods fetch it
    with spec.model.tokenSecretRef, so a repository the Hub hides without a token is a private one to pin."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import (HfHubHTTPError, HFValidationError, RepositoryNotFoundError,
                                       RevisionNotFoundError)

    repo, endpoint = source.removeprefix("hf://"), os.environ.get("HF_ENDPOINT") or None
    where = f"resolving {source}@{revision}: the Hub at {endpoint or 'https://huggingface.co'}"
    try:
        info = HfApi(endpoint=endpoint, token=False).model_info(repo, revision=revision, timeout=HUB_TIMEOUT_S)
    except HFValidationError as exc:
        raise api.SpecError(f"{field}.source: {repo} is not a Hugging Face repository id ({exc})") from None
    except RevisionNotFoundError:
        raise api.SpecError(f"{field}.revision: {source} has no revision {revision!r}: use one of its branches, "
                            "tags or commits") from None
    except RepositoryNotFoundError:
        raise _hidden(source, revision, field, private) from None
    except HfHubHTTPError as exc:
        status = getattr(exc.response, "status_code", None)
        if status in (401, 403):  # what the Hub answers a request without a token for a private repository
            raise _hidden(source, revision, field, private) from None
        raise HubUnavailable(f"{where} answered HTTP {status}") from None
    except _transport_errors() as exc:
        raise HubUnavailable(f"{where} did not answer ({type(exc).__name__}: {exc})") from None
    if not is_commit(info.sha):
        raise HubUnavailable(f"{where} answered no commit sha but {info.sha!r}")
    return info.sha


def _hidden(source: str, revision: str, field: str, private: bool) -> api.SpecError:
    """The Hub shows no repository `source` without a token: a private one to pin, or a wrong name."""
    if private:
        return api.SpecError(
            f"{field}.revision: pin a commit of {source} (its 40 hex digits, from the repository's history on the "
            "Hub): the Hub does not show this repository without a token (a private one), and the operator, which never reads "
            f"Secrets (spec.model.tokenSecretRef is for the pods), cannot resolve {revision!r} to the one commit "
            "every replica must serve")
    repo = source.removeprefix("hf://")
    return api.SpecError(f"{field}.source: the Hub has no public repository {repo}: check the name; a private one "
                         f"needs spec.model.tokenSecretRef and a commit in {field}.revision")


def _transport_errors() -> tuple[type[Exception], ...]:
    """The network errors of the HTTP client huggingface_hub uses: httpx2 (2.x), httpx (1.x) or requests (0.x)."""
    found: list[type[Exception]] = []
    for module, names in (("httpx2", ("TransportError",)), ("httpx", ("TransportError",)),
                          ("requests.exceptions", ("ConnectionError", "Timeout"))):
        with contextlib.suppress(ImportError):
            found += [getattr(importlib.import_module(module), name) for name in names]
    return tuple(found)
