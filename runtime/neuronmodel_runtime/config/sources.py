"""The model-source grammar: where a model, a draft model or a compile cache may be, defined once.

| form                 | ModelSource (scheme, location, path) | fetched or mounted                    |
|----------------------|--------------------------------------|---------------------------------------|
| hf://ORG/NAME        | hf, ORG/NAME, ""                     | downloaded (`neuronmodel-runtime fetch`) |
| s3://BUCKET[/PREFIX] | s3, BUCKET, PREFIX                   | downloaded                            |
| pvc://CLAIM[/PATH]   | pvc, CLAIM, PATH                     | the claim mounted by the operator     |
| /PATH                | path, /PATH, ""                      | a node path mounted by the operator   |

Each form is a regular expression built from the parts below (`FORMS`). `parse_source` checks a URL part by part
against them, so that its error says which part is wrong, and `cel_pattern` joins them into the pattern the CRD's
CEL rules match (`self.matches`): what the API server admits is what the runtime parses. The expressions use only
what RE2 (CEL) and Python's `re` read alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

ACCEPTED_FORMS = "hf://ORG/NAME, s3://BUCKET[/PREFIX], pvc://CLAIM[/PATH] or an absolute path /PATH"

#: A Hugging Face repository id, ORG/NAME.
HUB_REPO = r"[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*"
#: An S3 bucket name.
S3_BUCKET = r"[a-z0-9][-a-z0-9.]{1,61}[a-z0-9]"
#: A PersistentVolumeClaim name (a DNS subdomain).
CLAIM = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
#: One part of a path under a bucket or a claim: no whitespace, and not empty, `.` or `..` (it could not leave its
#: folder).
PART = r"([^\s/.][^\s/]*|\.[^\s/.][^\s/]*|\.\.[^\s/]+)"
#: An absolute path, without whitespace.
ABSOLUTE = r"/[^\s]*"

#: scheme -> the whole URL of that form (trailing slashes allowed: they are dropped).
FORMS = {
    "hf": rf"hf://{HUB_REPO}/*",
    "s3": rf"s3://{S3_BUCKET}(/{PART})*/*",
    "pvc": rf"pvc://{CLAIM}(/{PART})*/*",
    "path": ABSOLUTE,
}


def cel_pattern(*schemes: str) -> str:
    """`^(form|...)$` of the forms of `schemes` (all by default): the pattern a CEL `matches()` rule checks."""
    return "^(" + "|".join(FORMS[scheme] for scheme in schemes or FORMS) + ")$"


#: A model or draft model source.
SOURCE_PATTERN = cel_pattern()
#: A compile cache: a bucket, a claim or a path (not the Hub).
CACHE_URL_PATTERN = cel_pattern("s3", "pvc", "path")


class SourceError(ValueError):
    """A model source URL of none of the accepted forms; the message names the wrong part and the forms."""


@dataclass(frozen=True)
class ModelSource:
    """A parsed model source.

    scheme: "hf" (location = ORG/NAME), "s3" (location = bucket, path = key prefix), "pvc" (location = claim name,
    path = folder inside the claim) or "path" (location = an absolute path in the pod).
    """

    scheme: str
    location: str
    path: str = ""

    @property
    def url(self) -> str:
        """The canonical URL (no trailing slash); equal sources have equal URLs."""
        if self.scheme == "path":
            return self.location
        return f"{self.scheme}://{self.location}" + (f"/{self.path}" if self.path else "")

    @property
    def needs_fetch(self) -> bool:
        """hf:// and s3:// are downloaded; a claim or a path is mounted by the operator."""
        return self.scheme in ("hf", "s3")


def _matches(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text, re.ASCII) is not None


def parse_source(url: str) -> ModelSource:
    """Parse a model source: hf://ORG/NAME, s3://BUCKET[/PREFIX], pvc://CLAIM[/PATH] or an absolute path.

    Accepts exactly the URLs `SOURCE_PATTERN` matches.

    Raises:
        SourceError: the URL is none of these; the message names the wrong part and the accepted forms.
    """
    def refuse(why: str) -> SourceError:
        return SourceError(f"model source {url!r}: {why}; accepted: {ACCEPTED_FORMS}")

    if url.startswith("/"):
        if not _matches(ABSOLUTE, url):
            raise refuse("an absolute path without whitespace is needed")
        return ModelSource("path", str(PurePosixPath(url)))
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise refuse("not a URL or an absolute path")
    rest = rest.rstrip("/")
    if scheme == "hf":
        if not _matches(HUB_REPO, rest):
            raise refuse("hf:// needs a Hugging Face repository id ORG/NAME "
                         "(e.g. hf://HuggingFaceTB/SmolLM2-135M-Instruct)")
        return ModelSource("hf", rest)
    if scheme in ("s3", "pvc"):
        name, _, path = rest.partition("/")
        pattern, noun = (S3_BUCKET, "an S3 bucket") if scheme == "s3" else (CLAIM, "a PersistentVolumeClaim")
        if not _matches(pattern, name):
            raise refuse(f"{scheme}:// needs {noun} name first")
        if path and not _matches(rf"{PART}(/{PART})*", path):
            raise refuse(f"the path {path!r} has an empty, '.' or '..' part, or whitespace")
        return ModelSource(scheme, name, path)
    raise refuse(f"unknown scheme {scheme}://")
