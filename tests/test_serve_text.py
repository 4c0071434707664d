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
