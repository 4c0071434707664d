"""A malformed manifest.json is refused when read: one ArtifactError naming the field and the
expected form; the CLI prints it on one line and exits 2."""

import json
import shutil

import pytest
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport import families
from seqexport.cli import cli
from seqexport.errors import ArtifactError


def _drop_sha(m):
    del m["graphs"]["decoder"]["sha256"]


def _graphs_as_list(m):
    m["graphs"] = list(m["graphs"].values())


def _rename_graph(m):
    m["graphs"]["decoder2"] = m["graphs"].pop("decoder")


def _vocab_lots(m):
    m["config"]["tgt_vocab_size"] = "lots"


def _tokenizer_type(m):
    m["tokenizer"] = {"type": "sentencepiece-of-doom"}


def _dtype_int8(m):
    m["dtype"] = "int8"


def _escape(m):
    m["graphs"]["decoder"]["file"] = "../../x/decoder.onnx"


def _absolute(m):
    m["graphs"]["decoder"]["file"] = "/etc/passwd"


def _bad_dims(m):
    m["graphs"]["encoder"]["inputs"][0]["dims"] = ["batch", "sequence"]


def _unknown_family(m):
    m["family"] = "lstm"


def _feed_to_nowhere(m):
    m["graphs"]["encoder"]["feeds"][0][0] = "present.99.encoder.key"


def _append_to_nowhere(m):
    m["graphs"]["decoder"]["appends"][0][1] = "past_key_values.99.decoder.key"


def _append_into_lengths(m):
    m["graphs"]["decoder"]["appends"][0][1] = "past_lengths"


def _no_appends(m):
    m["graphs"]["decoder"]["appends"] = []  # its past K/V would be read as static state


def _no_feeds(m):
    del m["graphs"]["decoder"]["feeds"]  # roles kept: not a 0.1.0 manifest


def _family_list(m):
    m["family"] = ["transformer"]


def _input_dtype_object(m):
    m["graphs"]["decoder"]["inputs"][0]["dtype"] = {}


def _weight_dtype_list(m):
    next(iter(m["weights"]["tensors"].values()))["dtype"] = []


def _tokens_without_vocab(m):
    del m["graphs"]["decoder"]["inputs"][0]["vocab_size"]  # well formed; the spec it builds is not


def _byte_eos_ids(m):
    m["tokenizer"]["eos_ids"] = [m["tokenizer"]["eos_id"], 5]  # a byte tokenizer has one eos


def _byte_eos_ids_malformed(m):
    m["tokenizer"]["eos_ids"] = [m["tokenizer"]["eos_id"], "x"]


def _byte_eos_id_fraction(m):
    m["tokenizer"]["eos_id"] = 2.7


CASES = {
    "missing sha256": (_drop_sha, "'graphs.decoder.sha256' is missing; expected 64 lowercase hex digits"),
    "graphs as a list": (_graphs_as_list, "'graphs' is [{"),
    "graph renamed": (_rename_graph, "expected exactly the transformer graphs ['encoder', 'decoder']"),
    "vocab 'lots'": (_vocab_lots, "'config.tgt_vocab_size' is 'lots'; expected an integer >= 1"),
    "unknown tokenizer": (_tokenizer_type, "unknown tokenizer type 'sentencepiece-of-doom'"),
    "dtype int8": (_dtype_int8, "'dtype' is 'int8'; expected one of ['float32', 'float16']"),
    "file outside the folder": (_escape, "expected a file name inside the exported folder"),
    "absolute file": (_absolute, "expected a file name inside the exported folder"),
    "unknown dim": (_bad_dims, "'graphs.encoder.inputs' is"),
    "unknown family": (_unknown_family, f"'family' is 'lstm'; expected one of {families.names()}"),
    "feed naming no output": (_feed_to_nowhere, "malformed graph spec"),
    "append naming no input": (_append_to_nowhere, "malformed graph spec"),
    "append into a non-state input": (_append_into_lengths, "appended input 'past_lengths' has role 'lengths', "
                                                            "not 'state'"),
    "appends emptied": (_no_appends, "malformed graph spec: graph 'decoder': input 'past_lengths' counts the valid "
                                     "slots of appended state, but the graph lists no appends"),
    "feeds dropped, roles kept": (_no_feeds, "malformed graph spec: graph 'decoder' declares roles or appends but "
                                             "no feeds"),
    "family a list": (_family_list, "'family' is ['transformer']; expected one of"),
    "input dtype an object": (_input_dtype_object, "'graphs.decoder.inputs' is"),
    "weight dtype a list": (_weight_dtype_list, "'weights.tensors' is"),
    "tokens input without its vocabulary": (_tokens_without_vocab, "malformed graph spec: input_ids: a tokens "
                                                                    "input needs vocab_size"),
}


def _edited_copy(source, dest, edit, message):
    """A copy of the `source` export with its manifest passed through `edit`; loading it must
    raise an ArtifactError holding `message`."""
    shutil.copytree(source, dest)
    path = dest / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))
    with pytest.raises(ArtifactError) as err:
        rt.load(dest, verify=False)
    assert message in str(err.value)
    return dest


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_manifest_is_refused_naming_the_field(transformer_tiny, tmp_path, case):
    folder = _edited_copy(transformer_tiny[1], tmp_path / "a", *CASES[case])
    commands = [["generate", str(folder), "--ids", "5 6"]]
    if case != "unknown tokenizer":  # inspect shows the record; loading the tokenizer refuses it
        commands.append(["inspect", str(folder)])
    for args in commands:
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, result.output
        assert result.output.count("\n") == 1 and result.output.startswith("error: "), result.output
        assert "Traceback" not in result.output


def _drop_logits(m):
    m["graphs"]["decoder"]["outputs"] = [t for t in m["graphs"]["decoder"]["outputs"] if t["name"] != "logits"]


def _rank_1_tokens(m):
    m["graphs"]["encoder"]["inputs"][0]["dims"] = ["batch"]


def _float_tokens(m):
    m["graphs"]["decoder"]["inputs"][0]["dtype"] = "float32"


def _weight_dims_swapped(m):
    stored = next(t for t in m["weights"]["tensors"].values() if len(t["dims"]) == 2 and len(set(t["dims"])) == 2)
    stored["dims"] = stored["dims"][::-1]  # the same length in the file


# well-formed manifests that disagree with the graph files they name (the manifest is not hashed)
DISAGREEING = {
    "an output the manifest drops": (_drop_logits, "graph 'decoder': the manifest's outputs differ from "
                                                   "decoder.onnx's at 'logits' (manifest: absent; graph: float32"),
    "tokens of rank 1": (_rank_1_tokens, "graph 'encoder': the manifest's inputs differ from encoder.onnx's at "
                                         "'input_ids' (manifest: int64, rank 1; graph: int64, rank 2)"),
    "tokens as floats": (_float_tokens, "at 'input_ids' (manifest: float32, rank 2; graph: int64, rank 2)"),
    "a weight's dims swapped": (_weight_dims_swapped, "the manifest's weights index says float32"),
}


@pytest.mark.parametrize("case", list(DISAGREEING))
def test_a_manifest_that_disagrees_with_its_graphs_is_refused_on_load(transformer_tiny, tmp_path, case):
    """Before: a dropped output failed in a step with KeyError 'logits', swapped weight dims
    as "ONNX Runtime rejected the inputs" (an InputError, blaming the caller)."""
    folder = _edited_copy(transformer_tiny[1], tmp_path / "a", *DISAGREEING[case])
    for args in (["generate", str(folder), "--ids", "5 6"], ["validate", str(folder), "--steps", "2"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2 and DISAGREEING[case][1] in result.output, result.output
        assert "Traceback" not in result.output


def _prompt_frame_number(m):
    m["tokenizer"]["prompt"] = 1


def _prompt_suffix_number(m):
    m["tokenizer"]["prompt"] = {"suffix": 5}


BYTE_RECORDS = {
    "eos_ids beyond its eos": (_byte_eos_ids, "eos_ids [2, 5]: a 'byte' tokenizer ends a text at (2,) only"),
    "eos_ids malformed": (_byte_eos_ids_malformed, "eos_ids must hold token ids (integers >= 0), got 'x'"),
    "eos_id a fraction": (_byte_eos_id_fraction, "eos_id must be a token id (integer >= 0), got 2.7"),
    "prompt frame a number": (_prompt_frame_number, "prompt must be an object with bos (true/false), suffix (a "
                                                    "string), eos (true/false), got 1"),
    "prompt suffix a number": (_prompt_suffix_number, "got {'suffix': 5}"),
}


@pytest.mark.parametrize("case", list(BYTE_RECORDS))
def test_a_byte_tokenizer_record_it_would_misread_is_refused(bundled_exports, tmp_path, case):
    """A byte tokenizer keeps one eos: an `eos_ids` listing more (or malformed) was loaded and
    ignored, a decode running on past the ids the record names; an eos_id of 2.7 was read as 2.
    Now each is one line naming the field, from the runtime and the CLI (exit 2)."""
    edit, message = BYTE_RECORDS[case]
    folder = _edited_copy(bundled_exports("transformer")[1], tmp_path / "a", edit, message)
    result = CliRunner().invoke(cli, ["generate", str(folder), "--text", "5 March 2021"])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output


def test_a_file_leading_outside_the_folder_or_a_weight_past_the_file_is_refused(transformer_tiny, tmp_path):
    """Two forms the hash check alone would let through: a graph file that is a link to a copy
    outside the folder (same bytes, same sha256), and a weight whose stored place runs past the
    end of the weights file (the file itself untouched)."""
    folder = tmp_path / "linked"
    shutil.copytree(transformer_tiny[1], folder)
    outside = tmp_path / "elsewhere.onnx"
    shutil.move(folder / "decoder.onnx", outside)
    (folder / "decoder.onnx").symlink_to(outside)
    with pytest.raises(ArtifactError, match="'graphs.decoder.file' is 'decoder.onnx'; expected a file name inside"):
        rt.load(folder)

    folder = tmp_path / "past-the-end"
    shutil.copytree(transformer_tiny[1], folder)
    path = folder / "manifest.json"
    m = json.loads(path.read_text())
    stored = next(iter(m["weights"]["tensors"].values()))
    stored["offset"] = m["weights"]["bytes"] - stored["length"] // 2  # its length as its dims say
    path.write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="'weights.tensors' is .*; expected an object: name -> "):
        rt.load(folder, verify=False)
    result = CliRunner().invoke(cli, ["inspect", str(folder)])
    assert result.exit_code == 2 and result.output.startswith("error: ") and "Traceback" not in result.output


def _field_paths(value, path=()):
    """Every field of a manifest (list items: the first three), as a path of keys."""
    if path:
        yield path
    items = value.items() if isinstance(value, dict) else enumerate(value[:3]) if isinstance(value, list) else ()
    for key, inner in items:
        yield from _field_paths(inner, (*path, key))


DELETE = object()
FIELD_VALUES = [None, 0, -1, 2.5, "x", [], {}, True, DELETE]


@pytest.mark.parametrize("family", ["transformer", "hybrid"])
def test_any_one_field_edited_loads_and_decodes_or_is_refused_by_name(bundled_exports, tmp_path, family):
    """Each of a sample of single-field edits (a field set to null, a number, a string, a list,
    an object, a bool, or deleted) either loads and decodes, or raises the project's own error
    (a SeqexportError: the CLI's one line, exit 2): never a bare TypeError, KeyError,
    IndexError or StopIteration from deep inside a step. (Every such edit of the five bundled
    exports' manifests, 18 963, before the checks they now meet: 430 raised one of those.)"""
    import copy

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from seqexport.errors import SeqexportError

    folder = tmp_path / family
    shutil.copytree(bundled_exports(family)[1], folder)
    path = folder / "manifest.json"
    original = json.loads(path.read_text())
    fields = list(_field_paths(original))

    @settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(fields), st.sampled_from(FIELD_VALUES))
    def edit(field, value):
        m = copy.deepcopy(original)
        holder = m
        for key in field[:-1]:
            holder = holder[key]
        if value is DELETE:
            del holder[field[-1]]
        else:
            holder[field[-1]] = value
        path.write_text(json.dumps(m))
        try:
            model = rt.load(folder, provider="cpu", verify=False, threads=1)
            rt.generate(model, [model.encode("5 March 2021") if model.tokenizer else [5, 6]],
                        rt.SearchOptions(max_new_tokens=2))
        except SeqexportError:
            pass

    edit()
