"""Tokenizers of exported models, behind one interface (numpy and torch free).

    tok = load_tokenizer(manifest["tokenizer"], folder)   # from an artifact's manifest
    ids = model.encode("5 March 2021")                     # a runtime model's prompt ids (encode_prompt)
    text = tok.decode(ids)                                 # stops at eos
    stream = TextStream(tok); stream.push(token) -> the text that token completes

Two kinds, told apart by the record's "type":
- "byte": UTF-8 bytes shifted past three special ids (the bundled models):
      id 0 pad, 1 bos, 2 eos, b + 3 the byte b (0..255)  -> vocab_size 259
- "hf": a Hugging Face `tokenizers` tokenizer.json copied into the artifact (the Rust
  library, torch-free), with bos/eos/pad/decoder-start ids read from the checkpoint's
  configs at export time.

Every tokenizer has `vocab_size`, `bos_id`, `eos_id`, `pad_id` (None where the model has
none), `eos_ids` (every token that ends a text: the eos and, where the checkpoint lists
several, the others, e.g. a chat model's end of turn; empty where none), `start_id` (the
transformer decoder's first token), `encode`, `decode`, `to_dict`.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from seqexport.errors import ArtifactError, InputError

TYPES = ("byte", "hf")  # and each family's own (`Family.tokenizer_types`, e.g. RWKV World's "rwkv")


class Tokenizer(Protocol):
    vocab_size: int
    bos_id: int | None
    eos_id: int | None  # the eos a framed prompt ends with
    pad_id: int | None
    frames_prompts: bool  # True: a prompt is framed by the family's (bos, suffix, eos) rule

    @property
    def eos_ids(self) -> tuple[int, ...]: ...  # every token that ends a text, eos_id first

    @property
    def start_id(self) -> int | None: ...

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]: ...

    def decode(self, ids, stop_at_eos: bool = True) -> str: ...

    def to_dict(self) -> dict: ...


@dataclass(frozen=True)
class ByteTokenizer:
    pad_id: int = 0  # padding, skipped by decode
    bos_id: int = 1  # begin of sequence, skipped by decode
    eos_id: int = 2  # end of sequence, decode stops there
    offset: int = 3  # id of byte 0
    frames_prompts = True

    @property
    def start_id(self) -> int:
        return self.bos_id

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return (self.eos_id,)

    @property
    def vocab_size(self) -> int:
        return self.offset + 256

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """text -> ids of its UTF-8 bytes, optionally framed by bos / eos."""
        ids = [b + self.offset for b in text.encode("utf-8")]
        if add_bos:
            ids.insert(0, self.bos_id)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids, stop_at_eos: bool = True) -> str:
        """ids -> text: stops at the first eos (unless told not to), skips pad, bos and eos
        (any id below `offset`); bytes that are not valid UTF-8 become U+FFFD."""
        out = bytearray()
        for i in decoded_ids(ids):
            if i == self.eos_id and stop_at_eos:
                break
            if self.offset <= i < self.vocab_size:
                out.append(i - self.offset)
        return out.decode("utf-8", errors="replace")

    def to_dict(self) -> dict:
        return {
            "type": "byte",
            "pad_id": self.pad_id,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "offset": self.offset,
            "vocab_size": self.vocab_size,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ByteTokenizer":
        """Inverse of `to_dict`; ValueError for another tokenizer type or inconsistent ids."""
        if not isinstance(d, dict) or d.get("type") != "byte":
            found = d.get("type") if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"unknown tokenizer type {found!r}; expected 'byte'")
        tok = cls(**{k: _token_id(d, k) for k in ("pad_id", "bos_id", "eos_id", "offset") if k in d})
        if "vocab_size" in d and _token_id(d, "vocab_size") != tok.vocab_size:
            raise ValueError(
                f"tokenizer vocab_size {d['vocab_size']!r} does not match offset {tok.offset} + 256"
            )
        return tok


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer (tokenizer.json) with the model's special ids.

    The tokenizer's own post-processor frames a prompt (as transformers would), so no
    family framing is added; `decode` stops at eos and skips special tokens.
    """

    frames_prompts = False

    def __init__(self, path: str | Path, bos_id=None, eos_id=None, pad_id=None, decoder_start_id=None,
                 file: str = "tokenizer.json", eos_ids=None):
        try:
            from tokenizers import Tokenizer as RustTokenizer
        except ImportError:
            raise ArtifactError("this export's tokenizer needs the `tokenizers` package: pip install tokenizers") from None
        try:
            self._tok = RustTokenizer.from_file(str(path))
        except Exception as e:  # the Rust library raises its own exception type
            raise ArtifactError(f"cannot read tokenizer {path}: {str(e).splitlines()[0] if str(e) else e}") from None
        self.file = file
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.decoder_start_id = decoder_start_id
        # every id that ends a text (a checkpoint may list several: Llama 3's end of text and
        # end of turn), eos_id first
        listed = tuple(eos_ids or ())
        self.eos_ids = listed if listed else (() if eos_id is None else (eos_id,))

    @property
    def start_id(self) -> int | None:
        return self.decoder_start_id if self.decoder_start_id is not None else self.bos_id

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False, special: bool = True) -> list[int]:
        """`special`: the tokenizer's post-processor frames the text (its bos, as transformers
        encodes a prompt); a chat template's text carries its own (`special=False`)."""
        ids = list(self._tok.encode(text, add_special_tokens=special).ids)
        if add_bos and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        if add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids, stop_at_eos: bool = True) -> str:
        ids = decoded_ids(ids)
        if stop_at_eos:
            ids = ids[: next((n for n, i in enumerate(ids) if i in self.eos_ids), len(ids))]
        return self._tok.decode(ids, skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def to_dict(self) -> dict:
        several = {"eos_ids": list(self.eos_ids)} if len(self.eos_ids) > 1 else {}
        return {"type": "hf", "file": self.file, "bos_id": self.bos_id, "eos_id": self.eos_id, **several,
                "pad_id": self.pad_id, "decoder_start_id": self.decoder_start_id, "vocab_size": self.vocab_size}


def load_tokenizer(record: dict | None, folder: str | Path | None = None) -> "Tokenizer | None":
    """The tokenizer a manifest's record describes (None for none); ArtifactError for an
    unknown type, a missing file, or ids that do not fit."""
    if not record:
        return None
    from seqexport import families

    kind = record.get("type") if isinstance(record, dict) else None
    owner = families.tokenizer_family(kind) if isinstance(kind, str) else None
    if kind not in TYPES and owner is None:
        found = kind if isinstance(record, dict) else type(record).__name__
        known = [*TYPES, *(t for f in families.REGISTRY.values() for t in f.tokenizer_types)]
        raise ArtifactError(f"unknown tokenizer type {found!r}; expected one of {known}")
    try:
        listed = _eos_ids(record)
        _check_prompt_frame(record.get("prompt"))
        tok = _from_record(record, owner, folder, listed)
        # (a byte or RWKV World tokenizer keeps one eos: more listed would be ignored, not stopped at)
        if listed is not None and tuple(listed) != tuple(tok.eos_ids):
            raise ValueError(f"eos_ids {listed}: a {record['type']!r} tokenizer ends a text at {tuple(tok.eos_ids)} "
                             "only; give the others with --eos-id (SearchOptions(eos_id=...))")
        return tok
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"tokenizer record {record!r} is malformed: {e}") from None


def _from_record(record: dict, owner, folder, eos_ids: list[int] | None) -> "Tokenizer":
    if record["type"] == "byte":
        return ByteTokenizer.from_dict(record)
    if folder is None:
        raise ArtifactError(f"a {record['type']!r} tokenizer record needs the folder holding its file")
    if owner is not None:
        return owner.part("tokenizer").from_record(record, folder)
    ids = {k: _optional_id(record, k) for k in ("bos_id", "eos_id", "pad_id", "decoder_start_id")}
    return HFTokenizer(Path(folder) / record["file"], file=record["file"], eos_ids=eos_ids, **ids)


def decoded_ids(ids) -> list[int]:
    """The ids decode() takes, as Python ints: a sequence (or 1-d array) of integers >= 0; a
    float, a string or a negative id is refused (it was truncated, iterated by character or
    dropped). Ids past the vocabulary decode to nothing, as Hugging Face's tokenizers do: a
    model's padded embedding may have more rows than its tokenizer has tokens."""
    if isinstance(ids, str | bytes) or not hasattr(ids, "__iter__"):
        raise InputError(f"decode: expected a sequence of token ids, got {type(ids).__name__}")
    out = []
    for n, i in enumerate(ids):
        i = int(i) if isinstance(i, np.integer) else i  # (a numpy bool is no np.integer: refused below)
        if not is_token_id(i):
            raise InputError(f"decode: ids[{n}] is {i!r}; expected a token id (an integer >= 0)")
        out.append(i)
    return out


def is_token_id(v) -> bool:
    """An integer >= 0 (not a bool, a float or a string): what a record's token ids must be."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _token_id(record: dict, key: str) -> int:
    v = record[key]
    if not is_token_id(v):
        raise ValueError(f"{key} must be a token id (integer >= 0), got {v!r}")
    return v


def _optional_id(record: dict, key: str) -> int | None:
    v = record.get(key)
    if v is not None and not is_token_id(v):
        raise ValueError(f"{key} must be a token id (integer >= 0) or null, got {v!r}")
    return v


def _eos_ids(record: dict) -> list[int] | None:
    """The record's "eos_ids" (several ids that end a text; absent in artifacts from before it,
    and where there is one): a list of ids holding the record's eos_id first."""
    listed = record.get("eos_ids")
    if listed is None:
        return None
    if not isinstance(listed, list) or not listed:
        raise ValueError(f"eos_ids must be a non-empty list of token ids, got {listed!r}")
    for v in listed:
        if not is_token_id(v):
            raise ValueError(f"eos_ids must hold token ids (integers >= 0), got {v!r} in {listed}")
    if listed[0] != record.get("eos_id"):
        raise ValueError(f"eos_ids {listed} must start with the eos_id {record.get('eos_id')!r}")
    return listed


FRAME = {"bos": bool, "suffix": str, "eos": bool}  # a record's "prompt": how text is framed


def _check_prompt_frame(frame) -> None:
    if frame is None:
        return
    if not isinstance(frame, dict) or not all(k in FRAME and isinstance(v, FRAME[k]) for k, v in frame.items()):
        raise ValueError(f"prompt must be an object with bos (true/false), suffix (a string), eos (true/false), "
                         f"got {frame!r}")


def encode_prompt(tok: "Tokenizer", default_frame: dict, text: str, record: dict | None = None) -> list[int]:
    """Text -> prompt ids as the model was trained. A byte tokenizer frames the text by the
    record's "prompt" ({"bos", "suffix", "eos"}, e.g. the Mamba date task's " = " suffix),
    else by the family's `default_frame` (the runtime model's `prompt_frame`); a Hugging Face
    tokenizer frames it itself."""
    if not isinstance(text, str) or not text:
        raise InputError(f"prompt text: expected a non-empty string, got {text!r}")
    if not tok.frames_prompts:
        return tok.encode(text)
    frame = {**default_frame, **((record or {}).get("prompt") or {})}
    return tok.encode(text + frame["suffix"], add_bos=frame["bos"], add_eos=frame["eos"])


UTF8_MAX = 4  # bytes of the longest UTF-8 character: a token carries at least one


class TextStream:
    """Text of a growing token sequence, piece by piece, never splitting a character:
    `push(token)` returns what that token completes ("" while a multi-byte character or a
    byte-level BPE piece is still incomplete).

    Incremental, as vLLM detokenises: each push decodes only the tokens since the last piece
    plus the few before it (`_prefix`..: the context a tokenizer needs to decode a word's start
    right), not the whole sequence, so a long generation costs linear time, not quadratic."""

    def __init__(self, tok: "Tokenizer"):
        self.tok, self.ids, self.printed = tok, [], ""
        self._prefix = 0  # ids[_prefix:_read]: already printed, decoded again as context
        self._read = 0  # ids[_read:]: not printed yet

    def push(self, token: int) -> str:
        (token,) = decoded_ids([token])  # a float or a negative id refused, as decode refuses it
        self.ids.append(token)
        window = self.ids[self._prefix:]
        # generation decides where a row ends: decode past eos
        context = self.tok.decode(window[: self._read - self._prefix], stop_at_eos=False)
        text = self.tok.decode(window, stop_at_eos=False)
        if text.endswith("\ufffd") and len(self.ids) - self._read > UTF8_MAX:
            return self._settle(context, text)
        if text.endswith("\ufffd") or len(text) <= len(context) or not text.startswith(context):
            return ""
        return self._print(context, text, len(self.ids))

    def _print(self, context: str, text: str, upto: int) -> str:
        new = text[len(context):]
        self._prefix, self._read = self._read, upto
        self.printed += new
        return new

    def _settle(self, context: str, text: str) -> str:
        """More tokens pending than a character has bytes, the text still ending unfinished: bytes
        that will never make a character (none starts with them, or a broken one). What they
        decode to (U+FFFD) is printed, up to the last UTF8_MAX tokens, which may still begin
        one, wherever the decode of the rest is already final (the whole text begins with it).
        Before, every push decoded all of them again and printed nothing: quadratic, 1.7 s of
        the engine thread for 4,000 such tokens, and a client saw no text at all."""
        cut = len(self.ids) - UTF8_MAX
        head = self.tok.decode(self.ids[self._prefix : cut], stop_at_eos=False)
        if len(head) <= len(context) or not head.startswith(context) or not text.startswith(head):
            return ""
        return self._print(context, head, cut)
