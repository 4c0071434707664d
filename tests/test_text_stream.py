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


def byte_ids(data: bytes) -> list[int]:
    return [b + ByteTokenizer.offset for b in data]


def test_bytes_that_never_make_a_character_are_printed_as_u_fffd_in_linear_time():
    """4,000 lone lead bytes (a broken model's output): before, every push decoded all of them
    again (quadratic: 1.7 s) and printed nothing until a character came; now they print as
    Python's own decode shows them, a few tokens behind, and the decodes stay linear."""
    data = b"ok " + b"\xc3" * 4000 + " fin 🌸".encode()
    tok = CountingDecodes(ByteTokenizer())
    stream = TextStream(tok)
    pieces = [stream.push(i) for i in byte_ids(data)]
    whole = data.decode("utf-8", errors="replace")
    assert "".join(pieces) == whole
    assert "".join(pieces[:3 + 100]).startswith("ok " + "\ufffd" * 90)  # printed as they come
    assert tok.decoded < 20 * len(data)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"a", b" ", "é".encode(), "東".encode(), "🌸".encode(), b"\xc3", b"\xe6\x97",
                                 b"\xf0\x9f\x8c", b"\x80", b"\xff"]), max_size=40))
def test_any_bytes_print_as_pythons_decode_never_a_character_split(parts):
    """Valid characters, broken ones and bytes no character has, in any order: what is printed
    is always the start of Python's decode of the whole (errors replaced), never a character
    it later decodes otherwise, and at most a character's bytes of tokens stay unprinted."""
    data = b"".join(parts)
    stream = TextStream(ByteTokenizer())
    printed = ""
    for n, i in enumerate(byte_ids(data), 1):
        printed += stream.push(i)
        assert data.decode("utf-8", errors="replace").startswith(printed)
        assert data[:n].decode("utf-8", errors="replace").startswith(printed)
    whole = data.decode("utf-8", errors="replace")
    held = len(whole) - len(printed)
    assert held <= 4 and whole.startswith(printed)


class ChunkTokenizer:
    """Each id a chunk of bytes (as a byte-level BPE's tokens are): a token may end one
    character, hold bytes no character has, and begin the next."""

    CHUNKS = [b"a", b" ", "é".encode(), "🌸".encode(), b"\xc3", b"\xe6\x97", b"\xf0\x9f", b"\x8c\xb8",
              b"\x8c\xb8\xff", b"\xb8\xc3", b"\x80", b"\xff", b"\xff\xf0\x9f\x8c"]

    def decode(self, ids, stop_at_eos: bool = False) -> str:
        return b"".join(self.CHUNKS[i] for i in ids).decode("utf-8", errors="replace")


@settings(max_examples=500, deadline=None)
@given(st.lists(st.integers(0, len(ChunkTokenizer.CHUNKS) - 1), max_size=40))
def test_tokens_of_several_bytes_print_as_pythons_decode_never_a_character_split(ids):
    tok = ChunkTokenizer()
    stream = TextStream(tok)
    printed = ""
    for n in range(1, len(ids) + 1):
        printed += stream.push(ids[n - 1])
        assert tok.decode(ids).startswith(printed), (ids[:n], printed)
    assert len(tok.decode(ids)) - len(printed) <= 4 * 4  # the last tokens' characters at most
