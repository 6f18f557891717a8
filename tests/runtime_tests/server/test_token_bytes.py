"""A token's raw bytes and display text for logprobs: exact for byte-level BPE (SmolLM2), SentencePiece byte
fallback and tiktoken-style tokenizers, also for tokens that hold part of a character."""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_tests.helpers.fakes_runner import ByteTokenizer
from neuronmodel_runtime.server.tokenizer import token_bytes, token_text

TINY_TARGET = Path(__file__).resolve().parents[2] / "assets" / "tiny" / "target"
TEXTS = [
    "emoji 😀😃 👩‍👩‍👧‍👦, flag 🇫🇷, 👍🏽 and 𝄞",
    "中文字符测试：世界你好。日本語のテキスト、한국어 텍스트",
    "héllo wörld, ça va? naïve café ½ ∑∫√∞ →⇒",
    "  spaces\n\nnew lines\ttabs ",
]


@pytest.mark.smollm2
@pytest.mark.parametrize("text", TEXTS)
def test_byte_level_bpe_bytes_concatenate_to_the_text(smollm2_tokenizer, text):
    tok = smollm2_tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    assert b"".join(token_bytes(tok, i) for i in ids) == text.encode("utf-8")
    assert tok.decode(ids) == text


@pytest.mark.smollm2
def test_byte_level_bpe_partial_characters_keep_their_raw_bytes(smollm2_tokenizer):
    tok = smollm2_tokenizer
    first, second = tok.encode(" 😀", add_special_tokens=False)  # 'ĠðŁĺ', 'Ģ'
    assert token_bytes(tok, first) == b" \xf0\x9f\x98" and token_bytes(tok, second) == b"\x80"
    assert tok.decode([first]) == " \ufffd"  # what decode(...).encode() used to give: U+FFFD's 3 bytes
    assert token_text(tok, first) == "bytes: \\xf0\\x9f\\x98" and token_text(tok, second) == "bytes:\\x80"
    assert token_bytes(tok, tok.eos_token_id) == b"<|im_end|>" and token_text(tok, tok.eos_token_id) == "<|im_end|>"


@pytest.mark.smollm2
def test_every_smollm2_token_agrees_with_transformers_decode(smollm2_tokenizer):
    """Whole tokens: the very text decode([id]) gives; partial ones: raw bytes whose lossy decode is decode's."""
    tok = smollm2_tokenizer
    partial = 0
    for i in range(len(tok)):
        text, raw = tok.decode([i]), token_bytes(tok, i)
        try:
            assert raw.decode("utf-8") == text == token_text(tok, i), i  # U+FFFD itself is a token too
        except UnicodeDecodeError:
            assert raw.decode("utf-8", errors="replace") == text and token_text(tok, i).startswith("bytes:"), i
            partial += 1
    assert partial > 100


def sentencepiece_tokenizer(decoder: str):
    """A tiny SentencePiece-style fast tokenizer with byte fallback: few pieces, so most characters fall back to
    <0xNN> byte tokens. Decoders: Llama's (strips the first space), Gemma's (keeps it), Metaspace (no byte
    fallback: T5-style)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, normalizers

    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "▁", "▁hello", "▁w", "r", "ld", "h"]
    backend = Tokenizer(models.Unigram([(p, -1.0 - len(pieces) + n) for n, p in enumerate(pieces)], 0, True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    fallback = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = {
        "llama": decoders.Sequence([*fallback, decoders.Strip(" ", 1, 0)]),
        "gemma": decoders.Sequence(fallback),
        "metaspace": decoders.Metaspace(),
    }[decoder]
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")


@pytest.mark.parametrize("decoder", ["llama", "gemma"])
def test_sentencepiece_byte_fallback_and_space_marker(decoder):
    tok = sentencepiece_tokenizer(decoder)
    text = "hello wörld 😀 世界"
    ids = tok.encode(text, add_special_tokens=False)
    pieces = tok.convert_ids_to_tokens(ids)
    assert "<0xF0>" in pieces and "▁hello" in pieces  # the test exercises both kinds of piece
    # The bytes are what each piece adds to the text, the first piece's space included (Llama's decoder strips
    # it, at the start of a decode only).
    assert b"".join(token_bytes(tok, i) for i in ids) == (" " + text).encode("utf-8")
    assert tok.decode(ids).lstrip(" ") == text
    assert token_bytes(tok, tok.convert_tokens_to_ids("<0xF0>")) == b"\xf0"
    assert token_text(tok, tok.convert_tokens_to_ids("<0xF0>")) == "bytes:\\xf0"
    assert token_text(tok, tok.convert_tokens_to_ids("▁hello")) == " hello"
    assert token_bytes(tok, tok.eos_token_id) == b"</s>"


def test_sentencepiece_metaspace_decoder():
    tok = sentencepiece_tokenizer("metaspace")
    ids = tok.encode("hello wrld", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == ["▁hello", "▁w", "r", "ld"] and tok.decode(ids) == "hello wrld"
    assert b"".join(token_bytes(tok, i) for i in ids) == b" hello wrld"


class DecodeOnlyByteTokenizer:
    """The fake without tiktoken's per-token bytes method: only decode() shows what a token is."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return ByteTokenizer().decode(ids, skip_special_tokens)


def test_byte_tokenizer_fake():
    text = "a€😀 z"
    ids = ByteTokenizer().encode(text)
    exact = ByteTokenizer()  # has tiktoken's decode_single_token_bytes
    assert b"".join(token_bytes(exact, i) for i in ids) == text.encode("utf-8")
    assert token_text(exact, 0xE2) == "bytes:\\xe2" and token_text(exact, ord("a")) == "a"
    # Without a way to see a token's bytes, its decode() is all there is: exact for whole characters only.
    plain = DecodeOnlyByteTokenizer()
    assert token_bytes(plain, ord("a")) == b"a" and token_text(plain, ord("a")) == "a"
    assert token_bytes(plain, 0xE2) == "\ufffd".encode("utf-8")


def test_the_committed_tiny_tokenizer_agrees_with_decode_on_every_token():
    """Byte-level BPE without the embedded model (tests/assets/tiny/target)."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(TINY_TARGET))
    for i in range(len(tok)):
        text, raw = tok.decode([i]), token_bytes(tok, i)
        assert raw.decode("utf-8", errors="replace") == text, i
    ids = tok.encode(TEXTS[0], add_special_tokens=False)
    assert b"".join(token_bytes(tok, i) for i in ids) == TEXTS[0].encode("utf-8")


def test_the_per_tokenizer_cache_does_not_keep_a_tokenizer_alive():
    import gc
    import weakref

    tok = sentencepiece_tokenizer("llama")
    assert token_bytes(tok, tok.convert_tokens_to_ids("<0xF0>")) == b"\xf0"
    gone = weakref.ref(tok)
    del tok
    gc.collect()
    assert gone() is None
