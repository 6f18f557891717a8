"""Incremental detokenization (multi-byte UTF-8 across tokens) and stop strings that span tokens."""

from fakes_runner import ByteTokenizer
from neuronmodel_runtime.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher


def stream(text: str) -> list[str]:
    detok = IncrementalDetokenizer.for_prompt(ByteTokenizer(), [104, 105])
    deltas = [detok.add(b) for b in text.encode("utf-8")]
    return deltas + [detok.flush()]


def test_multibyte_characters_are_never_split():
    deltas = stream("añ€😀z")
    assert "".join(deltas) == "añ€😀z"
    assert all("\ufffd" not in d for d in deltas)
    # the 4-byte emoji appears only when its last byte arrives
    assert deltas.count("😀") == 1 and deltas[1 + 2 + 3 + 3] == "😀"


def test_flush_emits_an_incomplete_tail():
    detok = IncrementalDetokenizer.for_prompt(ByteTokenizer(), [])
    assert detok.add(0xE2) == ""
    assert detok.flush() == "\ufffd"


def test_stop_string_spanning_several_deltas_is_cut_and_never_emitted():
    m = StopStringMatcher(("STOP",))
    emitted = []
    for piece in ["ab", "cS", "T", "O"]:
        assert m.feed(piece) is None
        emitted.append(m.take(final=False))
    assert m.feed("Pxyz") == "STOP"
    emitted.append(m.take(final=True))
    assert "".join(emitted) == "abc"


def test_partial_stop_prefix_is_released_when_it_does_not_complete():
    m = StopStringMatcher(("STOP",))
    m.feed("abST")
    assert m.take(final=False) == "a"  # "bST" could still start "STOP"
    m.feed("x")
    assert m.take(final=True) == "bSTx"


def test_earliest_stop_string_wins():
    m = StopStringMatcher(("world", "lo"))
    assert m.feed("hello world") == "lo"
    assert m.take(final=True) == "hel"


def test_unchecked_text_before_min_tokens_can_still_complete_a_stop_later():
    m = StopStringMatcher(("ab",))
    assert m.feed("xa", check=False) is None
    assert m.feed("b") == "ab"
    assert m.take(final=True) == "x"
