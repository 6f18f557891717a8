"""Loading a model folder's tokenizer, the token ids that end generation, and a token's bytes for logprobs."""

from __future__ import annotations

import json
import re
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from neuronmodel_runtime.config import ConfigError


#: A model folder's tokenizer files: a fast tokenizer's, or those a slow one is converted from (sentencepiece,
#: byte-level BPE's vocabulary, tiktoken's ranks).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "*.tiktoken")


def load_tokenizer(model_path: str | Path) -> Any:
    """The Hugging Face tokenizer of a model folder (local files only: no hub access in a pod).

    Raises:
        ConfigError: one line naming the folder's tokenizer files (or their absence) and the fix; transformers'
            own messages name neither.
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
    except Exception as exc:
        files = sorted(str(path) for pattern in TOKENIZER_FILES for path in Path(model_path).glob(pattern))
        if not files:
            raise ConfigError(f"model: {model_path} has no tokenizer (no {', '.join(TOKENIZER_FILES)}): copy the "
                              "model's tokenizer files into it, or re-download the model") from exc
        raise ConfigError(f"model: cannot load the tokenizer from {', '.join(files)} ({type(exc).__name__}: {exc}); "
                          "re-download or re-convert the model") from exc


def eos_token_ids(model_path: str | Path, tokenizer: Any) -> set[int]:
    """EOS ids: the tokenizer's, plus every id in generation_config.json's eos_token_id (int or list)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_config = Path(model_path) / "generation_config.json"
    if gen_config.is_file():
        value = json.loads(gen_config.read_text()).get("eos_token_id")
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    return ids


def chat_prompt_ids(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Token ids of a conversation rendered with the model's chat template, ready for the assistant's turn.

    Rendered to text first, then encoded without extra special tokens: the template already wrote the ones it
    wants (BOS), and `tokenize=True` returns different types across transformers versions.
    """
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


# --- A token's raw bytes and display text (logprobs) -----------------------------------------------------------
#
# OpenAI's logprobs carry each token's `bytes`, so that a client can join the pieces of a character that spans
# tokens. decode([id]).encode() cannot give them: a token holding part of a character decodes to U+FFFD. Each
# tokenizer family stores the bytes in its vocabulary differently; the scheme is read once per tokenizer.


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """The raw bytes token `token_id` adds to the text, also when it holds only part of a UTF-8 character.

    Exact for byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM2), SentencePiece (its '▁' space and `<0xNN>`
    byte-fallback pieces; the first piece's space included, which decode strips), tokenizers with tiktoken's
    `decode_single_token_bytes`, and added (special) tokens; otherwise `decode([token_id]).encode()`.
    """
    return _token_bytes_of(tokenizer).get(tokenizer, token_id)


def token_text(tokenizer: Any, token_id: int) -> str:
    """The `token` string of a logprob: the token's text; a token that is not whole UTF-8 (part of a character)
    as "bytes:" and its text with each stray byte escaped, e.g. "bytes: \\xf0\\x9f" (as OpenAI shows them;
    vLLM shows U+FFFD, which loses the bytes)."""
    raw = token_bytes(tokenizer, token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + raw.decode("utf-8", errors="backslashreplace")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> byte: printable bytes stand for themselves, the others
    (control characters, space, ...) for the characters from U+0100 up (so a space is 'Ġ', a newline 'Ċ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    alphabet = {chr(b): b for b in printable}
    alphabet.update((chr(256 + n), b) for n, b in enumerate(others))
    return alphabet


_BYTE_LEVEL = _byte_level_alphabet()
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPACE_MARKER = "\u2581"  # SentencePiece's '▁'


def _byte_level_piece_bytes(piece: str) -> bytes:
    """A byte-level BPE piece's bytes; a piece outside the alphabet (an added token) is its own UTF-8 text, as
    the ByteLevel decoder of `tokenizers` treats it."""
    if all(c in _BYTE_LEVEL for c in piece):
        return bytes(_BYTE_LEVEL[c] for c in piece)
    return piece.encode("utf-8")


def _sentencepiece_piece_bytes(piece: str) -> bytes:
    """A SentencePiece piece's bytes: `<0xNN>` is byte NN (byte fallback), '▁' is a space."""
    match = _BYTE_PIECE.fullmatch(piece)
    if match:
        return bytes([int(match.group(1), 16)])
    return piece.replace(_SPACE_MARKER, " ").encode("utf-8")


def _decoder_types(tokenizer: Any) -> set[str]:
    """The `type`s in a fast tokenizer's decoder (a Sequence's members included); empty for other tokenizers."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return set()
    spec = json.loads(decoder.__getstate__())
    return {d.get("type", "") for d in [spec, *spec.get("decoders", [])]}


def _piece_scheme(tokenizer: Any) -> Optional[Callable[[str], bytes]]:
    """How this tokenizer's vocabulary pieces map to bytes, or None when it is not a known scheme."""
    types = _decoder_types(tokenizer)
    if "ByteLevel" in types or hasattr(tokenizer, "byte_decoder"):  # fast, or slow GPT2Tokenizer
        return _byte_level_piece_bytes
    if types & {"ByteFallback", "Metaspace"} or hasattr(tokenizer, "sp_model"):  # fast, or slow SentencePiece
        return _sentencepiece_piece_bytes
    return None


@dataclass
class _TokenBytes:
    """How one tokenizer's tokens map to bytes (read once), and the bytes found so far, by token id. Holds no
    reference to the tokenizer, so that the cache entry goes with it."""

    tiktoken: bool  # the tokenizer has tiktoken's decode_single_token_bytes
    piece_bytes: Optional[Callable[[str], bytes]]  # vocabulary piece -> bytes; None: decode is all there is
    added: frozenset[int]  # added tokens: literal text, never byte-encoded nor part of a character, so decode is exact
    memo: dict[int, bytes] = field(default_factory=dict)

    @classmethod
    def of(cls, tokenizer: Any) -> "_TokenBytes":
        tiktoken = callable(getattr(tokenizer, "decode_single_token_bytes", None))
        added = frozenset(getattr(tokenizer, "added_tokens_decoder", None) or ())
        return cls(tiktoken, None if tiktoken else _piece_scheme(tokenizer), added)

    def get(self, tokenizer: Any, token_id: int) -> bytes:
        raw = self.memo.get(token_id)
        if raw is None:
            raw = self.memo[token_id] = self._compute(tokenizer, token_id)
        return raw

    def _compute(self, tokenizer: Any, token_id: int) -> bytes:
        if self.tiktoken:
            return bytes(tokenizer.decode_single_token_bytes(token_id))
        if self.piece_bytes is not None and token_id not in self.added:
            piece = tokenizer.convert_ids_to_tokens(token_id)
            if piece is not None:  # None: an id past the vocabulary
                return self.piece_bytes(piece)
        return tokenizer.decode([token_id]).encode("utf-8")


_CACHE: "weakref.WeakKeyDictionary[Any, _TokenBytes]" = weakref.WeakKeyDictionary()


def _token_bytes_of(tokenizer: Any) -> _TokenBytes:
    try:
        table = _CACHE.get(tokenizer)
        if table is None:
            table = _CACHE[tokenizer] = _TokenBytes.of(tokenizer)
        return table
    except TypeError:  # not hashable or not weak-referenceable: no cache
        return _TokenBytes.of(tokenizer)
