"""A byte-level tokenizer: UTF-8 bytes shifted past three special ids. Standard library only.

    id 0        pad
    id 1        bos (begin of sequence)
    id 2        eos (end of sequence)
    id b + 3    the byte b (0..255)             -> vocab_size = 259

The runtime imports this module, so it must never import torch or numpy.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class ByteTokenizer:
    pad_id: int = 0  # padding, skipped by decode
    bos_id: int = 1  # begin of sequence, skipped by decode
    eos_id: int = 2  # end of sequence, decode stops there
    offset: int = 3  # id of byte 0

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

    def decode(self, ids) -> str:
        """ids -> text: stops at the first eos, skips pad and bos (and any other id
        below `offset`); bytes that are not valid UTF-8 become U+FFFD."""
        out = bytearray()
        for i in ids:
            i = int(i)
            if i == self.eos_id:
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
        tok = cls(**{k: int(d[k]) for k in ("pad_id", "bos_id", "eos_id", "offset") if k in d})
        if "vocab_size" in d and int(d["vocab_size"]) != tok.vocab_size:
            raise ValueError(
                f"tokenizer vocab_size {d['vocab_size']!r} does not match offset {tok.offset} + 256"
            )
        return tok


def encode_prompt(record: dict, default_frame: dict, text: str) -> list[int]:
    """Text -> prompt ids as the model was trained: the record's "prompt" framing
    ({"bos", "suffix", "eos"}, e.g. the Mamba date task's " = " suffix), else the family's
    `default_frame` (the runtime model's `prompt_frame`)."""
    frame = {**default_frame, **record.get("prompt", {})}
    tok = ByteTokenizer.from_dict(record)
    return tok.encode(text + frame["suffix"], add_bos=frame["bos"], add_eos=frame["eos"])
