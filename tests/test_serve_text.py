"""A request's output text with stop strings (`seqexport.serve.text.TextOutput`, over the
runtime's `TextStream`): a stop string that is the very first thing generated ends the text
empty, nothing of it (not even a prefix) handed out; held-back text that stops matching is
handed out."""

from seqexport.runtime.tokenizer import ByteTokenizer
from seqexport.serve.text import TextOutput


def run(text: str, stops: list[str]) -> tuple[list[str], str, bool, int]:
    """Push `text`'s tokens one by one as the engine does (stopping once `stopped`):
    (pieces handed out, flush, stopped, tokens pushed)."""
    tok = ByteTokenizer()
    out, pieces = TextOutput(tok, stops), []
    pushed = 0
    for token in tok.encode(text):
        pieces.append(out.push(token))
        pushed += 1
        if out.stopped:
            break
    return pieces, out.flush(), out.stopped, pushed


def test_a_stop_string_first_thing_generated_ends_the_text_empty():
    for stop in ("2", "20", "2021-03-05"):
        pieces, rest, stopped, pushed = run("2021-03-05", [stop])
        assert (pieces, rest, stopped, pushed) == ([""] * len(stop), "", True, len(stop)), stop


def test_a_multi_byte_stop_string_first_is_never_split_nor_sent():
    pieces, rest, stopped, pushed = run("éa", ["é", "zz"])  # é is two bytes: two tokens
    assert (pieces, rest, stopped, pushed) == (["", ""], "", True, 2)


def test_text_before_a_stop_string_is_sent_and_a_broken_prefix_is_released():
    pieces, rest, stopped, _ = run("2021-03-05", ["-0"])
    assert "".join(pieces) + rest == "2021" and stopped
    pieces, rest, stopped, _ = run("2021-03-05", ["-04"])  # "-0" held, then "-03" is no stop
    assert "".join(pieces) + rest == "2021-03-05" and not stopped
    assert pieces[5] == "" and pieces[6] == "-03"  # held back while it could still become "-04"


def test_of_two_stop_strings_completed_by_one_token_the_text_ends_before_the_earlier():
    """"-03" and "3" both complete with the token "3": the text ends where "-03" begins (the
    first stop string in the text), with nothing of either sent."""
    pieces, rest, stopped, pushed = run("2021-03-05", ["3", "-03"])
    assert "".join(pieces) + rest == "2021" and stopped and pushed == 7


# --- against a reference simple enough to trust by reading -------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

texts = st.text(alphabet="abc", max_size=60)  # few letters: stop strings overlap and repeat
stop_lists = st.lists(st.text(alphabet="abc", min_size=1, max_size=8), min_size=1, max_size=4)


def held_by_reading(text: str, stops: list[str]) -> int:
    """The longest tail of `text` that begins some stop string (shorter than it)."""
    return max((n for s in stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)


@settings(max_examples=400, deadline=None)
@given(texts, stop_lists)
def test_pieces_match_searching_the_whole_text_after_every_token(text, stops):
    """After each token: stopped exactly when a stop string is in the text so far; the text
    ends before the earliest one; and what was handed out is the text so far less the longest
    tail that may still become a stop string."""
    tok = ByteTokenizer()
    out, handed = TextOutput(tok, stops), ""
    for i in range(len(text)):
        handed += out.push(tok.encode(text[i])[0])
        so_far = text[: i + 1]
        found = [j for j in (so_far.find(s) for s in stops) if j >= 0]
        if found:
            assert out.stopped and handed + out.flush() == so_far[: min(found)]
            return
        assert not out.stopped
        assert handed == so_far[: len(so_far) - held_by_reading(so_far, stops)]
    assert handed + out.flush() == text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab", min_size=1, max_size=5), max_size=20), stop_lists)
def test_pieces_of_several_characters_stop_where_the_whole_text_says(pieces, stops):
    """Tokens that decode to several characters at once (the stop string may complete, or
    begin and end, inside one)."""
    out = TextOutput(None, stops)
    out._stream = _PieceStream(pieces)  # token i decodes to pieces[i]
    handed = "".join(out.push(i) for i in range(len(pieces)) if not out.stopped)
    # generation stops at the first token after which the text holds a stop string (a longer one
    # begun earlier but not yet complete then never completes: pieces ["bab", "b"], stops ["a",
    # "babb"] give "b"), cut where the earliest one found then begins
    so_far, found = "", []
    for piece in pieces:
        so_far += piece
        found = [j for j in (so_far.find(s) for s in stops) if j >= 0]
        if found:
            break
    assert handed + out.flush() == (so_far[: min(found)] if found else so_far)
    assert out.stopped == bool(found)


class _PieceStream:
    def __init__(self, pieces):
        self.pieces = pieces

    def push(self, token: int) -> str:
        return self.pieces[token]
