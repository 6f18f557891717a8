"""Objects of a rendered chart: parsed, and found by kind."""

from __future__ import annotations

import yaml


def objects(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def find_one(docs: list[dict], kind: str) -> dict:
    (found,) = find(docs, kind)
    return found
