"""The RWKV World tokenizer (every public RWKV-7 release), numpy and torch free.

The vocabulary (`rwkv_vocab_v20230424.txt`, Apache-2.0, from the `rwkv` package; shipped in
seqexport/families/rwkv/vocab/ and copied into each export) lists each token as
`<id> <python str or bytes literal> <byte length>`. Encoding is greedy: at each position the
longest token that the remaining bytes start with (as the `rwkv` package's trie does); id 0
is the end of a text (eos), there is no bos or pad.
"""

import ast
from pathlib import Path

from seqexport.errors import ArtifactError
from seqexport.runtime.tokenizer import decoded_ids, is_token_id

VOCAB_SIZE = 65536  # the models' embedding rows (ids above the vocabulary's are never made)
EOS_ID = 0


def read_vocab(path: str | Path) -> dict[int, bytes]:
    """id -> token bytes; ValueError naming the line that does not parse or whose length differs."""
    tokens = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                idx, rest = line.rstrip("\n").split(" ", 1)
                literal, length = rest.rsplit(" ", 1)
                token = ast.literal_eval(literal)  # a literal only: never code
                token = token.encode("utf-8") if isinstance(token, str) else token
                if not isinstance(token, bytes) or len(token) != int(length):
                    raise ValueError("token length differs from the recorded one")
            except (ValueError, SyntaxError) as e:
                raise ValueError(f"{path}:{n}: not '<id> <literal> <length>': {e}") from None
            tokens[int(idx)] = token
    return tokens


class RwkvWorldTokenizer:
    """Greedy longest-match byte tokenizer over the World vocabulary."""

    frames_prompts = False  # a prompt is the text itself (no bos)
    bos_id = None
    pad_id = None

    def __init__(self, path: str | Path, vocab_size: int = VOCAB_SIZE, eos_id: int | None = EOS_ID,
                 file: str | None = None):
        self.file, self.vocab_size, self.eos_id = file or Path(path).name, vocab_size, eos_id
        self.id_to_bytes = read_vocab(path)
        self.bytes_to_id = {t: i for i, t in self.id_to_bytes.items()}
        # the lengths of the tokens starting with each byte, longest first
        lengths: dict[int, set[int]] = {}
        for t in self.bytes_to_id:
            lengths.setdefault(t[0], set()).add(len(t))
        self._lengths = {b: sorted(ls, reverse=True) for b, ls in lengths.items()}

    @property
    def start_id(self) -> int | None:
        return None

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return () if self.eos_id is None else (self.eos_id,)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        src, ids, i = text.encode("utf-8"), [], 0
        while i < len(src):
            for n in self._lengths[src[i]]:  # every byte is a token: this always finds one
                token = self.bytes_to_id.get(src[i:i + n])
                if token is not None:
                    ids.append(token)
                    i += n
                    break
        if add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids, stop_at_eos: bool = True) -> str:
        """ids -> text: stops at eos (unless told not to) and skips it; bytes that are not valid
        UTF-8 (a character cut by the end) become U+FFFD."""
        out = bytearray()
        for i in decoded_ids(ids):
            if i == self.eos_id:
                if stop_at_eos:
                    break
                continue
            out += self.id_to_bytes.get(i, b"")
        return out.decode("utf-8", errors="replace")

    def to_dict(self) -> dict:
        return {"type": "rwkv", "file": self.file, "vocab_size": self.vocab_size, "bos_id": None,
                "eos_id": self.eos_id, "pad_id": None}

    @classmethod
    def from_record(cls, record: dict, folder: str | Path) -> "RwkvWorldTokenizer":
        """ValueError for a vocab_size or eos_id that is not a whole number in range (a string
        eos_id was kept and never matched a token: a decode that never stopped)."""
        vocab, eos = record["vocab_size"], record.get("eos_id")
        if not is_token_id(vocab) or vocab < 1:
            raise ValueError(f"vocab_size must be an integer >= 1, got {vocab!r}")
        if eos is not None and not (is_token_id(eos) and eos < vocab):
            raise ValueError(f"eos_id must be a token id in [0, {vocab}) or null, got {eos!r}")
        try:
            return cls(Path(folder) / record["file"], vocab, eos, record["file"])
        except OSError as e:
            raise ArtifactError(f"cannot read the RWKV vocabulary {e.filename}: {e.strerror}") from None


def from_record(record: dict, folder) -> RwkvWorldTokenizer:
    """The tokenizer of a manifest's "rwkv" record (the family's `tokenizer_types`)."""
    return RwkvWorldTokenizer.from_record(record, folder)
