"""Bad inputs, corrupt artifacts, interrupted exports: a clear typed error, nothing lost."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import seqexport.runtime as rt
from seqexport.cli import cli
from seqexport.errors import ArtifactError, InputError, SeqexportError, UsageError
from tests.conftest import sigint_as_a_terminal_sends_it

DTYPES = [np.int64, np.int32, np.uint8, np.float32, np.bool_]


@pytest.fixture(scope="module")
def tf(transformer_tiny):
    return rt.load(transformer_tiny[1], provider="cpu", threads=1)


@pytest.fixture(scope="module")
def mb(mamba_exports):
    return rt.load(mamba_exports("loop")[1], provider="cpu", threads=1)


def arrays(max_batch=3, max_len=5, low=-3, high=110):
    return st.tuples(
        st.sampled_from(DTYPES),
        st.lists(st.integers(0, max_len), min_size=1, max_size=3),  # shape, rank 1..3, zeros allowed
        st.integers(low, high),
        st.integers(0, 2**16),
    ).map(lambda t: np.random.default_rng(t[3]).integers(t[2], t[2] + 8, size=[min(d, max_batch) for d in t[1]])
          .astype(t[0]))


def assert_result_or_typed_error(fn):
    try:
        out = fn()
    except SeqexportError:  # InputError or UsageError: a clear message, fine
        return None
    logits = out[0]
    assert np.isfinite(logits).all(), "valid input gave NaN/Inf"
    return out


def assert_same_as_row_by_row(out, alone):
    """Each row of a batch's logits and new state equals that row fed on its own (alone(i))."""
    logits, new = out
    for i in range(logits.shape[0]):
        row_logits, row_state = alone(i)
        np.testing.assert_allclose(logits[i : i + 1], row_logits, rtol=1e-5, atol=1e-5)
        assert row_state.length == new.length
        for name, value in new.arrays.items():
            np.testing.assert_allclose(np.asarray(value)[i : i + 1], np.asarray(row_state.arrays[name]),
                                       rtol=1e-5, atol=1e-5, err_msg=name)


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(src=arrays(), tokens=arrays())
@example(src=np.array([[5, 6, 7], [8, 0, 0], [9, 10, 11]]), tokens=np.array([3, 4, 5]))  # valid cases, always run
@example(src=np.array([[5, 6], [0, 0]]), tokens=np.array([[3, 4, 5], [6, 7, 8]], np.int32))
def test_transformer_runtime_property(tf, src, tokens):
    try:
        state = tf.start(src)
    except InputError as e:
        assert str(e)
        return
    assert src.ndim == 2 and src.size and src.min() >= 0 and src.max() < 100
    out = assert_result_or_typed_error(lambda: tf.step(tokens, state))
    if out is not None:  # valid: the right shape, and the same as feeding the batch row by row
        logits, new = out
        assert logits.shape[0] == src.shape[0] and logits.shape[-1] == 100
        assert new.length == (1 if tokens.ndim == 1 else tokens.shape[1])
        assert_same_as_row_by_row(out, lambda i: tf.step(tokens[i : i + 1], tf.start(src[i : i + 1])))


@SETTINGS
@given(batch=st.one_of(st.integers(-2, 3), st.floats(0, 3), st.none()), tokens=arrays())
@example(batch=3, tokens=np.array([3, 4, 5]))  # valid cases, always run
@example(batch=2, tokens=np.array([[3, 4, 5, 6], [7, 8, 9, 10]]))
def test_mamba_runtime_property(mb, batch, tokens):
    try:
        state = mb.start(batch)
    except InputError:
        assert not (isinstance(batch, int) and batch >= 1)
        return
    out = assert_result_or_typed_error(lambda: mb.step(tokens, state))
    if out is not None:  # valid: the right shape, and the same as feeding the batch row by row
        assert out[0].shape[0] == batch and tokens.shape[0] == batch
        assert_same_as_row_by_row(out, lambda i: mb.step(tokens[i : i + 1], mb.start(1)))


def test_token_ids_at_the_vocabulary_bounds_are_refused_in_short_and_long_rows(tf, mb):
    """An id equal to the vocabulary size (one past the last) or -1 is refused by name, in a
    decode step's one id (the quick check) as in a long prompt's (the numpy check); the last
    id and 0 are taken. (Past the vocabulary, Mamba's padded embedding rows would give
    numbers for an id the model does not have.)"""
    for model, state in ((tf, lambda: tf.start(np.array([[5, 6, 7]]))), (mb, lambda: mb.start(1))):
        v = model.vocab_size
        for length in (1, 3, 80):
            for bad in (v, -1):
                ids = np.full((1, length), 2, np.int64)
                ids[0, -1] = bad
                with pytest.raises(InputError, match=rf"token id {bad} at \[0, {length - 1}\] is outside \[0, {v}\)"):
                    model.step(ids, state())
            ids = np.zeros((1, length), np.int64)
            ids[0, -1] = v - 1
            logits, _ = model.step(ids, state())
            assert np.isfinite(logits).all()


def test_an_eos_id_the_model_cannot_pick_is_refused_by_every_decoder(tf, mb):
    """An eos id at or past the vocabulary could never end a row (the decode would run to
    max_new_tokens, silently): generate(), beam search and the engine refuse it by name;
    -1 (never) and the last id are taken."""
    for model, prompt in ((tf, [5, 6, 7]), (mb, [1, 2])):
        v = model.vocab_size
        for eos in (v, (3, v + 5)):
            bad = v if eos == v else v + 5
            message = rf"eos_id {bad} is not a token id of this model: expected -1 \(never\) or an id in \[0, {v}\)"
            for beams in (1, 2):
                with pytest.raises(UsageError, match=message):
                    rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=2, eos_id=eos, num_beams=beams))
            with pytest.raises(UsageError, match=message):  # refused before it queues: no start needed
                rt.Engine(model, max_rows=2).submit(prompt, rt.SearchOptions(max_new_tokens=2, eos_id=eos))
        for eos in (-1, v - 1):
            assert len(rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=2, eos_id=eos))[0]) <= 2


def test_a_start_id_is_refused_where_no_decoder_takes_it_or_it_is_no_token(tf, mb):
    """start_id starts an encoder-decoder's decoder. A decoder-only model (Mamba) ignored it
    silently, as if it had been used; past the vocabulary, the transformer's refusal named the
    graph's 'tokens' input, not the option. generate(), beam search and the engine refuse both."""
    cases = ((mb, [1, 2], 3, r"start_id 3 does not apply to this mamba model: it continues the prompt"),
             (tf, [5, 6, 7], tf.vocab_size,
              rf"start_id {tf.vocab_size} is not a token id of this model: expected an id in \[0, {tf.vocab_size}\)"))
    for model, prompt, start, message in cases:
        for beams in (1, 2):
            with pytest.raises(UsageError, match=message):
                rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=2, start_id=start, num_beams=beams))
        with pytest.raises(UsageError, match=message):
            rt.Engine(model, max_rows=2).submit(prompt, rt.SearchOptions(max_new_tokens=2, start_id=start))
    with pytest.raises(UsageError, match=r"start_id must be >= 0, got -1"):
        rt.SearchOptions(start_id=-1)
    assert len(rt.generate(tf, [[5, 6, 7]], rt.SearchOptions(max_new_tokens=2, start_id=tf.vocab_size - 1))[0]) <= 2


def test_row_operations_refuse_rows_and_states_that_are_not_the_batchs(tf, mb):
    """take / retain / join are public (a branch, a beam's reorder). A negative row wrapped
    round to a row from the end silently; one past the batch, or join([None]), was a bare
    IndexError or AttributeError. Repeats stay fine: a beam takes one row several times."""
    for model, fresh in ((tf, lambda: tf.start(np.array([[5, 6, 7], [4, 5, 6]]))), (mb, lambda: mb.start(2))):
        state = fresh()
        for bad, message in (([2], r"rows: 2 is not a row of this batch of 2; expected indices in \[0, 2\)"),
                             ([0, -1], r"rows: -1 is not a row of this batch of 2"),
                             ([[0, 1]], r"rows: expected a list of row indices \(integers\)"),
                             ([0.5], r"rows: expected a list of row indices \(integers\)")):
            with pytest.raises(InputError, match=message):
                model.take(state, bad)
            with pytest.raises(InputError, match=message):
                model.retain(fresh(), bad)
        for bad, message in (([], "join: expected a non-empty list of states"),
                             ([state, None], "join: states\\[1\\] is a NoneType, not a State")):
            with pytest.raises(InputError, match=message):
                model.join(bad)
        with pytest.raises(InputError, match=r"extend: newcomers\[0\] is a NoneType, not a State"):
            model.extend(fresh(), [None])
        got = model.take(state, [1, 1, 0])
        for name, a in state.numpy().arrays.items():
            if got.arrays[name].shape == a[[1, 1, 0]].shape:  # (a transformer's cache may be trimmed)
                np.testing.assert_array_equal(got.arrays[name], a[[1, 1, 0]])


def test_decode_refuses_ids_that_are_not_token_ids_and_skips_those_past_the_vocabulary(tmp_path):
    """decode([1.5]) truncated to 1, decode("abc") raised a bare ValueError, a negative id
    vanished: each is now one InputError naming it. An id past the vocabulary decodes to
    nothing, as Hugging Face's own tokenizers do (checked against them)."""
    from tokenizers import Tokenizer, models

    from seqexport.families.rwkv import WORLD_VOCAB_FILE
    from seqexport.families.rwkv.tokenizer import RwkvWorldTokenizer
    from seqexport.runtime.tokenizer import ByteTokenizer, HFTokenizer, TextStream

    hf = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    hf.save(str(tmp_path / "tokenizer.json"))
    for tok, good in ((ByteTokenizer(), [70, 71]), (HFTokenizer(tmp_path / "tokenizer.json"), [0, 1]),
                      (RwkvWorldTokenizer(WORLD_VOCAB_FILE), [70, 71])):
        for ids, message in (([5, 1.5], r"decode: ids\[1\] is 1.5; expected a token id \(an integer >= 0\)"),
                             ([-1], r"decode: ids\[0\] is -1"), ([True], r"decode: ids\[0\] is True"),
                             ("abc", "decode: expected a sequence of token ids, got str"),
                             (7, "decode: expected a sequence of token ids, got int"),
                             (np.array([[5, 6]]), r"decode: ids\[0\] is array")):
            with pytest.raises(InputError, match=message):
                tok.decode(ids)
        assert tok.decode([10**9]) == hf.decode([10**9]) == ""
        assert tok.decode(np.array(good)) == tok.decode(good) != ""
        stream = TextStream(tok)  # a streamed decode takes the same ids
        assert stream.push(np.int64(good[0])) + stream.push(good[1]) == tok.decode(good)
        with pytest.raises(InputError, match=r"decode: ids\[0\] is 1.5"):
            stream.push(1.5)


def test_the_python_api_refuses_arguments_of_the_wrong_kind_by_name(tf, mb, transformer_tiny):
    """Each was a bare TypeError / AttributeError, taken silently, or failed later on the engine
    thread (stop=5 ended the request as an "error", on_event=5 cancelled it, saying nothing)."""
    folder = transformer_tiny[1]
    for kwargs, message in (({"folder": None}, "folder: expected the path of an exported folder, got NoneType"),
                            ({"folder": 5}, "folder: expected the path of an exported folder, got int"),
                            ({"folder": folder, "io_binding": "yes"}, "io_binding: expected True or False, got 'yes'"),
                            ({"folder": folder, "verify": 0}, "verify: expected True or False, got 0")):
        with pytest.raises(UsageError, match=re.escape(message)):
            rt.load(**kwargs)
    with pytest.raises(UsageError, match=re.escape("options: expected SearchOptions (or None), got dict: use SearchOptions(**options)")):
        rt.generate(mb, [[1, 2]], {"max_new_tokens": 2})
    with pytest.raises(UsageError, match=re.escape("options: expected SearchOptions (or None), got dict")):
        rt.Generator(mb, {"max_new_tokens": 2})
    with pytest.raises(UsageError, match=re.escape("on_token: expected a function or None, got list")):
        rt.generate(mb, [[1, 2]], on_token=[])
    for kwargs, message in (({"max_state_bytes": -1}, "max_state_bytes must be an integer >= 1 or None, got -1"),
                            ({"max_prompt_tokens": "8"}, "max_prompt_tokens must be an integer >= 1 or None, got '8'")):
        with pytest.raises(UsageError, match=re.escape(message)):
            rt.Engine(mb, **kwargs)
    with pytest.raises(UsageError, match=re.escape("model: expected a model from seqexport.runtime.load")):
        rt.Engine(str(folder))
    engine = rt.Engine(tf, max_rows=2)
    for kwargs, message in (({"stop": 5}, "stop: expected a function or None, got int"),
                            ({"on_event": "print"}, "on_event: expected a function or None, got str"),
                            ({"request_id": 7}, "request_id: expected a string or None, got int"),
                            ({"timeout": "1"}, "timeout must be > 0 seconds, got '1'"),
                            ({"timeout": True}, "timeout must be > 0 seconds, got True")):
        with pytest.raises(UsageError, match=re.escape(message)):
            engine.submit([5, 6, 7], rt.SearchOptions(max_new_tokens=2), **kwargs)
    req = engine.submit([5, 6, 7], rt.SearchOptions(max_new_tokens=2), stop=lambda ids: False, timeout=30,
                        request_id="mine", on_event=lambda r, t: None)
    engine.run_until_done()
    assert req.finish_reason == "length" and len(req.tokens) == 2


def test_a_thread_count_that_is_not_one_is_the_callers_error_not_the_graphs(transformer_tiny, monkeypatch):
    """threads=2.5 or SEQEXPORT_THREADS=abc read "ONNX Runtime cannot load <graph>" (an
    ArtifactError, as if the file were at fault): now a UsageError naming the value."""
    folder = transformer_tiny[1]
    for threads in (-3, 2.5, "2", True):
        with pytest.raises(UsageError, match=rf"threads: expected an integer >= 0 or None .*got {re.escape(repr(threads))}$"):
            rt.load(folder, provider="cpu", threads=threads)
    for env in ("abc", "-1", "2.0"):
        monkeypatch.setenv("SEQEXPORT_THREADS", env)
        with pytest.raises(UsageError, match=rf"SEQEXPORT_THREADS='{re.escape(env)}': expected a whole number >= 0"):
            rt.load(folder, provider="cpu")
        assert rt.load(folder, provider="cpu", threads=1).vocab_size == 100  # an explicit count needs no variable
    monkeypatch.setenv("SEQEXPORT_THREADS", "1")
    graph = next(iter(rt.load(folder, provider="cpu").graphs.values()))
    assert graph.session.get_session_options().intra_op_num_threads == 1


def test_messages_name_input_given_and_expected(tf, mb):
    state = tf.start(np.array([[5, 6, 7]]))
    with pytest.raises(InputError, match=r"token id 150 at \[0, 0\] is outside \[0, 100\)"):
        tf.step(np.array([150]), state)
    with pytest.raises(InputError, match=r"encoder_attention_mask: batch = 1 on axis 0, but input_ids has batch = 2"):
        tf.step(np.array([3, 4]), state)
    with pytest.raises(InputError, match="token ids must be integers, got dtype float32"):
        tf.step(np.array([3.0], np.float32), state)
    with pytest.raises(InputError, match=r"empty input of shape \(1, 0\)"):
        tf.step(np.zeros((1, 0), np.int64), state)
    with pytest.raises(InputError, match="exceeds the positional table"):
        tf.step(np.ones((1, 600), np.int64), state)
    bad = rt.State(dict(state.arrays), state.length)
    bad.arrays["past_key_values.1.decoder.value"] = bad.arrays["past_key_values.1.decoder.value"].astype(np.float64)
    with pytest.raises(InputError, match="past_key_values.1.decoder.value: dtype float64 given, float32 expected"):
        tf.step(np.array([3]), bad)
    s = mb.start(2)
    s.arrays["past_ssm_state.0"] = s.arrays["past_ssm_state.0"][:, :, :3]
    with pytest.raises(InputError, match=r"past_ssm_state.0: shape \(2, 128, 3\), expected 16 on axis 2"):
        mb.step(np.array([1, 2]), s)
    with pytest.raises(InputError, match="batch_size: expected a positive integer, got 0"):
        mb.start(0)
    for rows in (0, -3, 2.5, "8", True):  # the most rows a running batch may hold, for extend
        with pytest.raises(InputError, match=rf"rows: expected an integer >= 1 \(the most rows the batch may hold\) "
                                             rf"or None, got {re.escape(repr(rows))}$"):
            tf.extend(tf.start(np.array([[5, 6]])), [tf.start(np.array([[7]]))], rows)
        with pytest.raises(InputError, match=r"rows: expected an integer >= 1"):
            mb.extend(mb.start(1), [mb.start(1)], rows)
    assert tf.tokenizer is None  # a preset's export: text needs a tokenizer
    with pytest.raises(UsageError, match="has no tokenizer in its manifest; give the prompt as token ids"):
        tf.encode("5 March 2021")
    src = np.array([[5, 6, 7], [8, 9, 0]])
    for mask, value in (([[1, 1, 1], [1, 2, 0]], "2"), ([[1, 1, 1], [-1, 1, 0]], "-1"),
                        ([[1.0, 1.0, 1.0], [1.0, 0.5, 0.0]], "0.5")):
        with pytest.raises(InputError, match=rf"src_mask: expected 0/1 \(or bool\) values, 1 = token, 0 = padding; got {value}$"):
            tf.start(src, np.array(mask))
    with pytest.raises(InputError, match="src_mask: row 1 hides every source token"):
        tf.start(src, np.array([[1, 1, 1], [0, 0, 0]]))
    with pytest.raises(InputError, match=r"src_mask: shape \(2, 2\) differs from src_ids \(2, 3\)"):
        tf.start(src, np.ones((2, 2), np.int64))
    with pytest.raises(InputError, match=r"src_mask: expected 0/1 \(or bool\) values, 1 = token, 0 = padding; got nan$"):
        tf.start(src, np.array([[1.0, 1.0, 1.0], [1.0, np.nan, 0.0]]))
    with pytest.raises(InputError, match=r"src_mask: expected 0/1 .* got dtype\('<U1'\)$"):
        tf.start(src, np.array([["a", "b", "c"], ["a", "b", "c"]]))
    ints = tf.start(src, np.array([[1, 1, 1], [1, 1, 0]]))
    for mask in ([[True, True, True], [True, True, False]], [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]):  # bool, float 0/1
        same = tf.start(src, np.array(mask))
        assert all(np.array_equal(same.arrays[k], ints.arrays[k]) for k in ints.arrays)
        assert same.arrays["encoder_attention_mask"].dtype == np.int64


# --- artifacts ---------------------------------------------------------------------------------


@pytest.fixture
def artifact(transformer_tiny, tmp_path):
    out = tmp_path / "a"
    shutil.copytree(transformer_tiny[1], out)
    return out


def test_manifest_faults(artifact):
    m = artifact / "manifest.json"
    data = json.loads(m.read_text())
    m.write_text(json.dumps({**data, "format_version": 99}))
    with pytest.raises(ArtifactError, match="format_version 99; this seqexport reads version 1"):
        rt.load(artifact)
    m.write_text("{ corrupt")
    with pytest.raises(ArtifactError, match="manifest.json is corrupt"):
        rt.load(artifact)
    m.unlink()
    with pytest.raises(ArtifactError, match="has no manifest.json"):
        rt.load(artifact)
    with pytest.raises(ArtifactError, match="not an exported folder"):
        rt.load(artifact / "nope")


def test_manifest_of_seqexport_0_1_still_runs_and_validates(tmp_path):
    """Manifests written before roles and feeds were declared (over the graphs of that time, whose
    decoder concatenates its cache): same tokens, validate passes."""
    artifact = tmp_path / "old"
    shutil.copytree(Path(__file__).parent / "data" / "transformer-tiny-concat-cache", artifact)
    before = rt.generate(rt.load(artifact), [[5, 6, 7], [8]], rt.SearchOptions(max_new_tokens=6))
    m = artifact / "manifest.json"
    data = json.loads(m.read_text())
    for g in data["graphs"].values():
        del g["feeds"]
        for t in g["inputs"]:
            t.pop("role", None)
            t.pop("vocab_size", None)
    m.write_text(json.dumps(data))
    model = rt.load(artifact)
    assert model.specs["decoder"].feeds and model.specs["encoder"].feeds
    assert rt.generate(model, [[5, 6, 7], [8]], rt.SearchOptions(max_new_tokens=6)) == before
    result = CliRunner().invoke(cli, ["validate", str(artifact), "--steps", "4"])
    assert result.exit_code == 0, result.output


def test_graph_file_faults(artifact):
    dec = artifact / "decoder.onnx"
    original = dec.read_bytes()
    dec.write_bytes(original[: len(original) // 2])
    with pytest.raises(ArtifactError, match=r"decoder.onnx has \d+ bytes, the manifest says \d+ \(truncated"):
        rt.load(artifact)
    with pytest.raises(ArtifactError, match="ONNX Runtime cannot load .*decoder.onnx"):
        rt.load(artifact, verify=False)  # hash check skipped: ORT still refuses it, clearly
    flipped = bytearray(original)
    flipped[-5] ^= 0xFF
    dec.write_bytes(bytes(flipped))
    with pytest.raises(ArtifactError, match=r"sha256 of .*decoder.onnx is .*the manifest says .*\(file altered\)"):
        rt.load(artifact)
    dec.unlink()
    with pytest.raises(ArtifactError, match="decoder.onnx is missing"):
        rt.load(artifact)


# --- export: atomic, interrupted ----------------------------------------------------------------


def _snapshot(target):
    """Every file under `target` (relative path -> bytes); None when the folder is gone."""
    if not target.is_dir():
        return None
    return {str(p.relative_to(target)): p.read_bytes() for p in sorted(target.rglob("*")) if p.is_file()}


def _export_then_interrupt(target, sig, before):
    """Start an export over `target` and send `sig` once it is midway: its temporary folder has
    existed for a second (the graphs are being traced; they are written together at the end, one
    weights file for all), or (a writer that is not atomic) the target itself has changed. Polls
    without asserting, so that the caller always gets to compare the target.

    Returns (process, midway): midway is False when the signal could not have come midway: the
    export had already ended, or had written its last graph (decoder.onnx) or its manifest (the
    commit may be done or a moment away, on a machine busy enough to slow this loop down)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqexport.cli", "export", "transformer", "--preset", "tiny", "--seed", "1",
         "--out", str(target), "--overwrite"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=sigint_as_a_terminal_sends_it,
    )
    deadline = time.time() + 120
    begun = None
    try:
        while time.time() < deadline and proc.poll() is None:
            if begun is None and list(target.parent.glob(f".{target.name}.tmp-*")):
                begun = time.time()
            if (begun is not None and time.time() > begun + 1.0) or _snapshot(target) != before:
                break
            time.sleep(0.05)
        now = _snapshot(target)
        last_graph = any((t / "decoder.onnx").exists() for t in target.parent.glob(f".{target.name}.tmp-*"))
        new_manifest = now is not None and now.get("manifest.json", before["manifest.json"]) != before["manifest.json"]
        midway = proc.poll() is None and not last_graph and not new_manifest
        if proc.poll() is None:
            proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:  # never leave the export running
            proc.kill()
            proc.wait()
    return proc, midway


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_interrupted_export_leaves_earlier_export_intact(transformer_tiny, tmp_path, sig):
    for attempt in range(3):  # a signal that came too late to be midway proves nothing: again
        parent = tmp_path / f"attempt{attempt}"
        target = parent / "model"
        shutil.copytree(transformer_tiny[1], target)
        before = _snapshot(target)
        assert before and "decoder.onnx" in before and "manifest.json" in before
        proc, midway = _export_then_interrupt(target, sig, before)
        if midway:
            break
    stderr = proc.stderr.read().decode()
    what = f"interrupted midway: {midway}, exit code {proc.returncode}, stderr: {stderr[-2000:]}"
    # first, whatever happened: the earlier export, every file of it, byte for byte
    after = _snapshot(target)
    assert after is not None, f"the earlier export was removed; {what}"
    assert after.keys() == before.keys(), what
    assert after == before, f"changed: {[k for k in before if after[k] != before[k]]}; {what}"
    assert midway, f"never interrupted midway in 3 attempts: {what}"
    assert proc.returncode != 0
    leftovers = list(parent.glob(".model.*"))
    if sig == signal.SIGKILL:  # no chance to clean up; the next export to the target does
        from seqexport.export.atomic import remove_stale

        remove_stale(target)
    else:
        assert leftovers == [], leftovers
    assert list(parent.glob(".model.*")) == []
    rt.load(target)  # and it still loads, hashes checked


def test_existing_target_is_kept_without_overwrite(transformer_tiny, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(transformer_tiny[1], target)
    result = CliRunner().invoke(cli, ["export", "transformer", "--preset", "tiny", "--out", str(target)])
    assert result.exit_code == 2 and "already exists; pass --overwrite" in result.output


# --- CLI: one line, exit 2 -----------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["validate", "/no/such/folder"], "not an exported folder"),
    (["generate", "/no/such/folder", "--ids", "1 2"], "not an exported folder"),
    (["export", "transformer", "--checkpoint", "/no/such/ckpt"], "is not a folder"),
    (["export", "mamba", "--preset", "tiny", "--scan", "unrolled"], "give --seq-len"),
    (["export", "mamba", "--preset", "tiny", "--seq-len", "4"], "--seq-len applies to --scan unrolled only"),
])
def test_cli_errors_are_one_line_exit_2(args, message):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert result.output.strip().count("\n") == 0


def test_an_output_folder_under_a_file_is_named_by_every_command_that_writes_one(transformer_tiny, tmp_path):
    """--out below a file was "[Errno 17] File exists: '<the file>'" from export, quantize and
    web alike; now which path cannot be written and why, and nothing is left behind."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    folder = str(transformer_tiny[1])
    for args in (["export", "transformer", "--preset", "tiny"], ["quantize", folder], ["web", folder]):
        result = CliRunner().invoke(cli, [*args, "--out", str(blocker / "out")])
        assert result.exit_code == 2, result.output
        assert result.output.strip() == f"error: cannot write {blocker / 'out'}: {blocker} is a file, not a folder"
    report = blocker / "report.json"  # a report file below one: was "the folder ... does not exist"
    result = CliRunner().invoke(cli, ["validate", folder, "--steps", "2", "--report", str(report)])
    assert result.exit_code == 2 and result.output.strip() == f"error: --report {report}: {blocker} is a file, not a folder"
    deeper = blocker / "sub" / "report.json"  # the file two folders up is named too
    result = CliRunner().invoke(cli, ["validate", folder, "--steps", "2", "--report", str(deeper)])
    assert result.exit_code == 2 and result.output.strip() == f"error: --report {deeper}: {blocker} is a file, not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_cli_generate_input_errors(transformer_tiny):
    folder = str(transformer_tiny[1])
    result = CliRunner().invoke(cli, ["generate", folder, "--ids", "1 2", "--ids", "1 2 999"])
    assert result.exit_code == 2 and "--ids #2: token id 999 is outside this model's vocabulary [0, 100)" in result.output
    result = CliRunner().invoke(cli, ["generate", folder, "--ids", "1 -2"])
    assert result.exit_code == 2 and "token id -2 is negative" in result.output
    # an eos the model cannot pick would never end a row: refused, -1 (never) kept
    result = CliRunner().invoke(cli, ["generate", folder, "--ids", "1 2", "--eos-id", "100"])
    assert result.exit_code == 2 and "eos_id 100 is not a token id of this model" in result.output, result.output
    result = CliRunner().invoke(cli, ["generate", folder, "--ids", "1 2", "--eos-id", "99", "--eos-id", "-1",
                                      "--max-new-tokens", "3"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["generate", folder, "--text", "hello"])
    assert result.exit_code == 2 and "has no tokenizer" in result.output
    result = CliRunner().invoke(cli, ["generate", folder, "--ids", "1 x"])
    assert result.exit_code == 2 and "expected integers" in result.output


def test_debug_shows_the_traceback():
    result = CliRunner().invoke(cli, ["--debug", "validate", "/no/such/folder"])
    assert result.exit_code != 0 and isinstance(result.exception, ArtifactError)


def test_generate_cli_streams_ids(transformer_tiny):
    folder = str(transformer_tiny[1])
    result = CliRunner().invoke(cli, ["generate", folder, "--ids", "5 9 13", "--max-new-tokens", "4"])
    assert result.exit_code == 0, result.output
    m = rt.load(folder)
    # the ids on stdout; the provider line goes to stderr
    assert result.stdout.split() == [str(t) for t in rt.generate(m, [[5, 9, 13]], rt.SearchOptions(max_new_tokens=4))[0]]
    assert "CPUExecutionProvider" in result.stderr


def test_module_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "seqexport.cli", "--help"], capture_output=True, text=True,
                         env={**os.environ}, timeout=60)
    assert out.returncode == 0 and "export" in out.stdout
