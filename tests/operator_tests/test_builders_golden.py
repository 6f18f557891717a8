"""Every builder against the committed golden manifests (git diff --exit-code style): regenerate with
`make generate` (python tests/operator_tests/golden.py) and review the diff."""

from __future__ import annotations

import difflib

from operator_tests import golden


def golden_diff(want: dict[str, str], have: dict[str, str]) -> str:
    """A unified diff of the committed golden files (`have`) against what the builders make now (`want`)."""
    lines: list[str] = []
    for rel in sorted(set(want) | set(have)):
        if want.get(rel) != have.get(rel):
            lines += difflib.unified_diff((have.get(rel) or "").splitlines(keepends=True),
                                          (want.get(rel) or "").splitlines(keepends=True),
                                          f"a/golden/{rel}" if rel in have else "/dev/null",
                                          f"b/golden/{rel}" if rel in want else "/dev/null")
    return "".join(lines)


def test_builders_match_the_golden_manifests():
    diff = golden_diff(golden.expected(), golden.committed())
    assert not diff, f"the builders' manifests differ from the golden files; run make generate\n{diff}"


def test_every_case_has_golden_files():
    cases = {rel.split("/", 1)[0] for rel in golden.committed()}
    assert cases == set(golden.CASES)


def test_a_changed_manifest_shows_as_a_diff():
    want = golden.expected()
    rel = next(iter(sorted(want)))
    changed = dict(want, **{rel: want[rel].replace("neuronmodel-operator", "someone-else", 1)})
    diff = golden_diff(changed, want)
    assert f"+++ b/golden/{rel}" in diff and "+    app.kubernetes.io/managed-by: someone-else" in diff
