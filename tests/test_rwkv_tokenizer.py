"""The RWKV World tokenizer against the `rwkv` package's own (encode and decode equal), and
through the runtime's tokenizer interface (the record an export writes, streaming)."""

import pytest

from seqexport import families
from seqexport.errors import ArtifactError
from seqexport.families.rwkv.tokenizer import RwkvWorldTokenizer
from seqexport.runtime.tokenizer import TextStream, load_tokenizer

TEXTS = [
    "5 March 2021 = 2021-03-05",
    "Hello, world!\n\tdef f(x): return x ** 2  # code",
    "Grüße aus Köln — naïve café, ½ €",
    "東京は晴れ。日本語のテキスト、そして한국어 also",
    "emoji 🌸🙂👍🏽 and ٱلْعَرَبِيَّة and Ελληνικά and русский",
    "   spaces   and\r\nnewlines\n\n",
]


@pytest.fixture(scope="module")
def toks():
    pkg = pytest.importorskip("rwkv.rwkv_tokenizer", reason="the rwkv reference package (pip install rwkv)")
    from pathlib import Path

    ref_file = Path(pkg.__file__).parent / "rwkv_vocab_v20230424.txt"
    from seqexport.families.rwkv import WORLD_VOCAB_FILE

    return RwkvWorldTokenizer(WORLD_VOCAB_FILE), pkg.TRIE_TOKENIZER(str(ref_file)), WORLD_VOCAB_FILE


@pytest.mark.parametrize("text", TEXTS)
def test_encode_and_decode_equal_the_rwkv_package(toks, text):
    ours, ref, _ = toks
    ids = ours.encode(text)
    assert ids == ref.encode(text)
    assert ours.decode(ids) == ref.decode(ids) == text


def test_the_shipped_vocabulary_is_the_packages(toks):
    ours, ref, _ = toks
    assert ours.id_to_bytes == ref.idx2token and len(ours.id_to_bytes) == 65529


def test_record_loads_through_the_runtime_interface_and_streams(toks, tmp_path):
    _, _, vocab = toks
    record = families.get("rwkv").default_tokenizer({"vocab_size": 65536})
    assert families.get("rwkv").default_tokenizer({"vocab_size": 259}) is None
    (tmp_path / record["file"]).write_bytes(vocab.read_bytes())
    tok = load_tokenizer({k: v for k, v in record.items() if k != "source"}, tmp_path)
    text = "Köln 東京 🌸"
    ids = tok.encode(text) + [0] + tok.encode(" after eos")
    assert tok.decode(ids) == text  # stops at eos (id 0)
    stream = TextStream(tok)
    pieces = [stream.push(i) for i in tok.encode(text)]
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)


@pytest.mark.parametrize("field, value, message", [
    ("eos_id", "0", "eos_id must be a token id in [0, 65536) or null, got '0'"),
    ("eos_id", 65536, "eos_id must be a token id in [0, 65536) or null, got 65536"),
    ("vocab_size", 65536.5, "vocab_size must be an integer >= 1, got 65536.5"),
    ("eos_ids", [0, 7], "eos_ids [0, 7]: a 'rwkv' tokenizer ends a text at (0,) only"),
])
def test_a_record_the_runtime_would_misread_is_refused_naming_the_field(toks, tmp_path, field, value, message):
    """An eos_id of "0" was kept as a string that no token equals (a decode never stopped), a
    fractional vocab_size cut to an integer, an eos_ids beyond the one eos ignored."""
    _, _, vocab = toks
    record = {k: v for k, v in families.get("rwkv").default_tokenizer({"vocab_size": 65536}).items() if k != "source"}
    (tmp_path / record["file"]).write_bytes(vocab.read_bytes())
    with pytest.raises(ArtifactError) as err:
        load_tokenizer(record | {field: value}, tmp_path)
    assert message in str(err.value)
