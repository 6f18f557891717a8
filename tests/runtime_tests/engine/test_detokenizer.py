"""Incremental detokenization (multi-byte UTF-8 across tokens) and stop strings that span tokens."""

import random

import pytest
from runtime_tests.helpers.fakes_runner import EOS, ByteTokenizer
from neuronmodel_runtime.engine.detokenizer import (
    CONTEXT_TOKENS,
    MAX_PENDING_TOKENS,
    IncrementalDetokenizer,
    StopStringMatcher,
)


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


def stream_after(prompt: list[int], outputs: list[int], tokenizer=None) -> list[str]:
    detok = IncrementalDetokenizer.for_prompt(tokenizer or ByteTokenizer(), prompt)
    return [detok.add(t) for t in outputs] + [detok.flush()]


def test_a_prompt_ending_inside_a_character_never_repeats_prompt_text():
    euro = list("€".encode("utf-8"))  # e2 82 ac
    # The output completes the prompt's character: it is emitted whole, as vLLM does; the prompt's text is not.
    assert "".join(stream_after([97, 98, *euro[:2]], [euro[2], 120])) == "€x"
    assert "".join(stream_after([97, 98, euro[0]], [*euro[1:], 120])) == "€x"
    # The output does not complete it: the broken character stays the prompt's, the output's text is its own.
    assert "".join(stream_after([97, 98, *euro[:2]], [120, 121])) == "xy"
    assert "".join(stream_after([97, euro[0]], [EOS, EOS])) == ""
    # A prompt made only of an incomplete character.
    assert "".join(stream_after(euro[:1], euro[1:])) == "€"


class CountingTokenizer(ByteTokenizer):
    """Counts the work of decode: calls and ids decoded."""

    def __init__(self) -> None:
        self.calls = 0
        self.decoded_ids = 0

    def decode(self, ids, skip_special_tokens=True):
        self.calls += 1
        self.decoded_ids += len(ids)
        return super().decode(ids, skip_special_tokens)


@pytest.mark.parametrize("filler", [EOS, 0x80], ids=["special-tokens", "invalid-bytes"])
def test_tokens_that_add_no_text_keep_each_add_bounded(filler):
    """EOS under ignore_eos, skipped special tokens, or bytes that never form a character: each add decodes a
    window of bounded length, instead of one that grows with every token (quadratic on the engine thread)."""
    tokenizer = CountingTokenizer()
    n = 5000
    deltas = stream_after([104, 105], [filler] * n + list("ok€".encode("utf-8")), tokenizer)
    expected = ("" if filler == EOS else "\ufffd" * n) + "ok€"
    assert "".join(deltas) == expected
    adds = n + 6
    window = CONTEXT_TOKENS + 2 * (MAX_PENDING_TOKENS + 1)  # at most: emitted context, then pending tokens
    assert tokenizer.calls <= 2 * adds
    assert tokenizer.decoded_ids <= 2 * window * adds  # without the bound: about n * n = 25,000,000


# --- SmolLM2's real byte-level BPE tokenizer, against transformers' own decode -------------------------------

TEXTS = [
    "héllo wörld, ça va? naïve café",
    "emoji 😀😃 👩‍👩‍👧‍👦 family, flag 🇫🇷 and 👍🏽!",
    "中文字符测试：世界你好。日本語のテキスト、한국어 텍스트",
    "  leading spaces\n\nnew lines\ttabs   and  trailing  ",
    "combining e\u0301 a\u0308 and ﬁ ligature, Ελληνικά, русский, עברית, العربية, हिन्दी",
    "math ∑∫√∞ ≠ ≤, arrows →⇒, box ┌─┐, music 𝄞, ancient 𐍈",
    "code:\n```python\ndef f(x):\n    return x ** 2  # ½ ¾\n```\n",
]


def expected_output_text(tokenizer, prompt: list[int], outputs: list[int]) -> str:
    """What the outputs add to the prompt's text, by transformers' decode of the whole sequence: the prompt's
    complete characters are the prompt's; a character the prompt leaves incomplete belongs to the output that
    completes it."""
    full = tokenizer.decode(prompt + outputs, skip_special_tokens=True)
    prompt_text = tokenizer.decode(prompt, skip_special_tokens=True).rstrip("\ufffd")
    assert full.startswith(prompt_text)
    return full[len(prompt_text) :]


def cut_points(tokenizer, ids: list[int]) -> list[int]:
    """Prompt lengths to try: a few ordinary ones and every one that ends inside a character."""
    inside = [k for k in range(1, len(ids)) if tokenizer.decode(ids[:k]).endswith("\ufffd")]
    return sorted({0, 1, len(ids) // 2, *inside})


@pytest.mark.smollm2
@pytest.mark.parametrize("text", TEXTS)
def test_streamed_deltas_equal_transformers_decode_of_the_outputs(smollm2_tokenizer, text):
    tok = smollm2_tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    cuts = cut_points(tok, ids)
    assert len(cuts) > 3 or text.isascii()
    for k in cuts:
        prompt, outputs = ids[:k], ids[k:]
        deltas = stream_after(prompt, outputs, tok)
        assert all("\ufffd" not in d for d in deltas), (k, deltas)
        assert "".join(deltas) == expected_output_text(tok, prompt, outputs), k
        if not tok.decode(prompt).endswith("\ufffd"):  # a clean cut: exactly the outputs' own decode
            assert "".join(deltas) == tok.decode(outputs, skip_special_tokens=True)


@pytest.mark.smollm2
@pytest.mark.parametrize("text", TEXTS)
def test_special_tokens_inside_the_output_are_skipped(smollm2_tokenizer, text):
    """EOS under ignore_eos and other special tokens, also between the tokens of one character."""
    tok = smollm2_tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    specials = [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_start|>")]
    outputs = []
    for i, t in enumerate(ids):
        outputs.append(t)
        if i % 3 == 1:
            outputs.append(specials[i % 2])
    prompt = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    deltas = stream_after(prompt, outputs, tok)
    assert "".join(deltas) == tok.decode(outputs, skip_special_tokens=True) == text


@pytest.mark.smollm2
@pytest.mark.parametrize(
    "text, stop",
    [(TEXTS[1], "👩‍👩"), (TEXTS[2], "世界"), (TEXTS[0], "é w"), (TEXTS[3], "\n\n"), (TEXTS[4], "ä and"),
     (TEXTS[5], "𝄞,"), (TEXTS[2], "not there")],
)
def test_stop_strings_on_real_tokens_cut_exactly(smollm2_tokenizer, text, stop):
    """Streams as engine/request.py does: each add goes through the stop matcher, flush only at the end."""
    tok = smollm2_tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    for k in cut_points(tok, ids):
        prompt, outputs = ids[:k], ids[k:]
        reference = expected_output_text(tok, prompt, outputs)
        detok, matcher = IncrementalDetokenizer.for_prompt(tok, prompt), StopStringMatcher((stop,))
        emitted, matched = [], None
        for t in outputs:
            matched = matcher.feed(detok.add(t))
            emitted.append(matcher.take(final=matched is not None))
            if matched is not None:
                break
        if matched is None:
            matcher.feed(detok.flush(), check=False)
            emitted.append(matcher.take(final=True))
        cut = reference.find(stop)
        assert matched == (stop if cut != -1 else None), k
        assert "".join(emitted) == (reference[:cut] if cut != -1 else reference), k


def test_random_byte_streams_match_a_whole_decode():
    """Valid UTF-8 with special tokens anywhere: exactly the whole decode. Random bytes (long invalid runs): the
    same text, up to the number of U+FFFD."""
    rng = random.Random(7)
    tokenizer = ByteTokenizer()
    pieces = [list(c.encode("utf-8")) for c in "aé€😀 \n"]
    for _ in range(2000):
        valid = [b for _ in range(rng.randrange(1, 12)) for b in rng.choice(pieces)]
        for i in sorted(rng.sample(range(len(valid) + 1), 2), reverse=True):
            valid.insert(i, EOS)
        prompt = list("hi€".encode("utf-8"))[: rng.randrange(2, 6)]  # may end inside the €
        assert "".join(stream_after(prompt, valid)) == tokenizer.decode(valid)
        noise = [rng.choice([0x41, 0x80, 0xBF, 0xC3, 0xE2, 0xF0, 0xFF, EOS]) for _ in range(rng.randrange(1, 25))]
        got = "".join(stream_after([104, 105], noise))
        assert got.replace("\ufffd", "") == tokenizer.decode(noise).replace("\ufffd", "")


def test_the_backend_decoder_decodes_as_the_tokenizer(smollm2_tokenizer):
    """The step loop decodes with the fast tokenizer's backend: the same text as transformers' decode, special
    tokens skipped, on every window of a chat."""
    from neuronmodel_runtime.engine.detokenizer import text_decoder

    decoder = text_decoder(smollm2_tokenizer)
    assert decoder is not smollm2_tokenizer
    ids = smollm2_tokenizer.apply_chat_template([{"role": "user", "content": "Ünïcödé ✓ 🎉 and spaces  ,ok"}],
                                                tokenize=False, add_generation_prompt=True)
    ids = smollm2_tokenizer.encode(ids, add_special_tokens=False)
    for start in range(len(ids)):
        for end in range(start + 1, min(start + 8, len(ids)) + 1):
            assert decoder.decode(ids[start:end], skip_special_tokens=True) == smollm2_tokenizer.decode(
                ids[start:end], skip_special_tokens=True)
