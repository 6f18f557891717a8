"""The model-source grammar is one definition: the pattern the CRD's CEL rules match (SOURCE_PATTERN,
CACHE_URL_PATTERN) accepts exactly the URLs `parse_source` parses, on a table of edge cases and on thousands of
generated URLs. (RE2, CEL's engine, reads these patterns as Python's re does: tests/integration/test_contract_admission.py
checks the API server's verdicts.)"""

from __future__ import annotations

import random
import re

import pytest

from neuronmodel_runtime.config.sources import (ACCEPTED_FORMS, CACHE_URL_PATTERN, FORMS, SOURCE_PATTERN, SourceError,
                                                parse_source)

EDGES = [
    "hf://org/name", "hf://org/name/", "hf://org/name//", "hf://org/name/x", "hf://org", "hf://-org/name",
    "hf://org/.name", "hf://o/n", "hf://org/na me", "hf:///name",
    "s3://abc", "s3://ab", "s3://abc/", "s3://abc//", "s3://abc//x", "s3://abc/x/", "s3://abc/./x", "s3://abc/../x",
    "s3://abc/.x/..y/...", "s3://abc/x y", "s3://ABC/x", "s3://a" + "b" * 62, "s3://a" + "b" * 61 + "c",
    "pvc://c", "pvc://c.d/x", "pvc://c-/x", "pvc://-c", "pvc://c/x/.", "pvc://" + "c" * 253, "pvc://" + "c" * 254,
    "/", "//x", "/a/../b", "/a b", "/a\tb", "relative", "", "ftp://x", "HF://org/name", "://x", "hf:/org/name",
]


def accepted(url: str) -> bool:
    try:
        parse_source(url)
    except SourceError as exc:
        assert str(exc).endswith(f"accepted: {ACCEPTED_FORMS}")
        return False
    return True


def matched(pattern: str, url: str) -> bool:
    return re.fullmatch(pattern, url, re.ASCII) is not None


def generated(count: int, seed: int = 22) -> list[str]:
    rng = random.Random(seed)
    heads = ["hf://", "s3://", "pvc://", "/", "", "x://"]
    parts = ["org", "name", "my-bucket", "ab", "c", "A", "x.y", ".", "..", "...", "-", "_", " ", "\t", "/", "//", "v1"]
    return [rng.choice(heads) + "".join(rng.choice(parts) for _ in range(rng.randint(0, 6))) for _ in range(count)]


def disagreements(url: str) -> list[str]:
    ok = accepted(url)
    wrong = [] if matched(SOURCE_PATTERN, url) == ok else ["SOURCE_PATTERN"]
    return wrong + ([] if matched(CACHE_URL_PATTERN, url) == (ok and not url.startswith("hf://")) else
                    ["CACHE_URL_PATTERN"])


@pytest.mark.parametrize("url", EDGES, ids=repr)
def test_the_cel_pattern_accepts_what_the_parser_parses(url):
    assert not disagreements(url)


def test_the_same_on_generated_urls():
    wrong = {url: found for url in generated(5000) if (found := disagreements(url))}
    assert not wrong


def test_the_patterns_are_the_forms_joined():
    assert SOURCE_PATTERN == "^(" + "|".join(FORMS.values()) + ")$"
    assert set(FORMS) == {"hf", "s3", "pvc", "path"}


def test_the_generated_urls_reach_every_verdict():
    verdicts = {(url.split("://")[0] if "://" in url else url[:1], accepted(url)) for url in generated(5000)}
    for scheme in ("hf", "s3", "pvc", "/"):
        assert {(scheme, True), (scheme, False)} <= verdicts, scheme
