"""`TextStream` decodes incrementally: the pieces it returns join to the whole text (checked
against Python's own UTF-8 decode, multi-byte characters split across tokens), no piece holds
half a character, and a long generation costs decodes linear in its length, not quadratic."""

import numpy as np

from seqexport.runtime.tokenizer import ByteTokenizer, TextStream


class CountingDecodes:
    """A tokenizer that counts the ids it is asked to decode."""

    def __init__(self, tok):
        self.tok, self.decoded = tok, 0

    def decode(self, ids, stop_at_eos: bool = True) -> str:
        self.decoded += len(ids)
        return self.tok.decode(ids, stop_at_eos=stop_at_eos)


def test_pieces_join_to_the_text_and_never_split_a_character():
    text = "Köln 東京 🌸 date: 2021-03-05 — ü" * 3
    tok = ByteTokenizer()
    stream = TextStream(tok)
    pieces = [stream.push(i) for i in tok.encode(text)]
    assert "".join(pieces) == text == bytes(i - tok.offset for i in tok.encode(text)).decode("utf-8")
    assert all("\ufffd" not in p for p in pieces)
    assert pieces.count("") == len(text.encode("utf-8")) - len(text)  # a multi-byte char's leading bytes


def test_random_valid_text_streams_back_exactly():
    rng = np.random.default_rng(0)
    alphabet = "aé東🌸 \n"
    text = "".join(rng.choice(list(alphabet), 500))
    tok = ByteTokenizer()
    stream = TextStream(tok)
    assert "".join(stream.push(i) for i in tok.encode(text)) == text


def test_a_long_generation_decodes_linearly():
    tok = CountingDecodes(ByteTokenizer())
    stream = TextStream(tok)
    ids = ByteTokenizer().encode("a🌸" * 1000)  # 5000 tokens
    for i in ids:
        stream.push(i)
    # each push decodes the pending tokens and the last piece's (at most 4 bytes each here),
    # twice: a whole-sequence decode each push would be ~n^2 / 2 = 12.5 M ids
    assert tok.decoded < 20 * len(ids)
