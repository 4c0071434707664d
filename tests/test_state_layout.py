"""The state kinds (seqexport.state), judged on their own with plain numpy: which kind each state
input is, from what the specs declare; zeros; in-place appended writes and the copy on a branch;
rows joining (padded), leaving (trimmed) and being written into spare rows without the batch
being copied."""

import numpy as np
import pytest

from seqexport.families.hybrid.specs import graph_specs as hybrid_specs
from seqexport.families.mamba2.specs import graph_specs as mamba2_specs
from seqexport.families.transformer.specs import graph_specs as transformer_specs
from seqexport.state.layout import StateLayout, kinds_of
from seqexport.state.state import State

HYBRID = dict(vocab_size=50, layer_types=["mamba2", "attention", "mlp"], mamba_nheads=2, headdim=4, ngroups=1,
              d_state=3, d_conv=4, n_kv_heads=2, head_dim=5)
KEY, CONV = "past_key_values.1.key", "past_conv_state.0"


def test_kinds_come_from_what_the_specs_declare():
    tf = transformer_specs(dict(num_layers=1, n_heads=2, d_model=8, src_vocab_size=9, tgt_vocab_size=9))
    assert kinds_of(tf["decoder"]) == {"past_key_values.0.encoder.key": "static",
                                       "past_key_values.0.encoder.value": "static",
                                       "past_key_values.0.decoder.key": "appended",
                                       "past_key_values.0.decoder.value": "appended"}
    m2 = mamba2_specs(dict(n_layer=2, expand=2, d_model=8, headdim=4, ngroups=1, d_state=3, d_conv=4, vocab_size=9))
    assert set(kinds_of(m2["step"]).values()) == {"replaced"} and len(kinds_of(m2["step"])) == 4
    hy = hybrid_specs(HYBRID)["step"]
    assert kinds_of(hy) == {CONV: "replaced", "past_ssm_state.0": "replaced", KEY: "appended",
                            "past_key_values.1.value": "appended"}
    layout = StateLayout.of(tf["decoder"])
    assert layout.masks == {"encoder_attention_mask": ("past_key_values.0.encoder.key",
                                                       "past_key_values.0.encoder.value")}


@pytest.fixture
def layout():
    return StateLayout.of(hybrid_specs(HYBRID)["step"])


def filled(layout, rows: int, lengths: list[int], seed: int) -> State:
    """A state of `rows` rows whose appended slots up to each row's length hold random values."""
    spec = hybrid_specs(HYBRID)["step"]
    arrays = layout.zeros(spec, rows)
    rng = np.random.default_rng(seed)
    state = State(arrays, 0).owning()
    t = max(lengths)
    arrays, writer, counts = layout.writable(state, t)
    new = {name: rng.standard_normal(arrays[name].shape[:2] + (t,) + arrays[name].shape[3:]).astype(np.float32)
           for name in layout.axes}
    state = layout.append(arrays | {CONV: rng.standard_normal(arrays[CONV].shape).astype(np.float32)}, writer, new,
                          counts, np.array(lengths))
    return state


def test_zeros_and_in_place_writes_then_a_branch_copies(layout):
    state = filled(layout, 2, [3, 5], 0)
    assert list(state.arrays["past_lengths"]) == [3, 5] and state.length == 5
    arrays, writer, _ = layout.writable(state, 1)
    assert arrays[KEY] is state.arrays[KEY]  # the newest state writes into its own buffers
    step = layout.append(dict(arrays), writer, {n: np.ones((2, 2, 1, 5), np.float32) for n in layout.axes},
                         [3, 5], 1)
    assert (step.arrays[KEY][0, :, 3] == 1).all() and (step.arrays[KEY][1, :, 5] == 1).all()
    again, _, _ = layout.writable(state, 1)  # the older state stepped again: a branch
    assert again[KEY] is not state.arrays[KEY] and not np.shares_memory(again[KEY], state.arrays[KEY])
    np.testing.assert_array_equal(again[KEY][0, :, :3], state.arrays[KEY][0, :, :3])


def test_a_call_of_several_tokens_reads_the_held_slots_when_the_spare_ones_cost_more(layout):
    """`fed`: a one-token step reads the buffers themselves; a prefill from fresh rows reads
    empty ones; a prefill continuing rows reads the slots they hold (contents unchanged) when it
    would attend over more spare slots than it copies, else the buffers whole."""
    fresh = State(layout.zeros(hybrid_specs(HYBRID)["step"], 2), 0).owning()
    arrays, _, counts = layout.writable(fresh, 30)
    assert arrays[KEY].shape[2] >= 30 and layout.fed(arrays, counts, 30)[KEY].shape == (2, 2, 0, 5)
    assert layout.fed(arrays, counts, 30)[CONV] is arrays[CONV]  # replaced state: as it is
    state = filled(layout, 2, [3, 40], 0)
    arrays, _, counts = layout.writable(state, 1)
    assert layout.fed(arrays, counts, 1) is arrays
    spare = arrays[KEY].shape[2] - 40  # 40 held, a few spare: two tokens read the buffers whole
    assert 0 < 2 * spare <= 2 * 40 and layout.fed(arrays, counts, 2)[KEY] is arrays[KEY]
    arrays, _, counts = layout.writable(state, 100)  # grown for 100 more: 100 x its spare slots > 2 x 40
    cut = layout.fed(arrays, counts, 100)[KEY]
    assert cut.shape == (2, 2, 40, 5) and cut.flags.c_contiguous
    np.testing.assert_array_equal(cut, arrays[KEY][:, :, :40])


def test_join_pads_appended_buffers_and_take_trims_them(layout):
    a, b = filled(layout, 1, [2], 1), filled(layout, 2, [40, 7], 2)
    assert a.arrays[KEY].shape[2] < b.arrays[KEY].shape[2]
    joined = layout.join([a, b])
    assert joined.arrays[KEY].shape[2] == b.arrays[KEY].shape[2] and list(joined.arrays["past_lengths"]) == [2, 40, 7]
    np.testing.assert_array_equal(joined.arrays[KEY][0, :, :2], a.arrays[KEY][0, :, :2])
    np.testing.assert_array_equal(joined.arrays[CONV][1:], b.arrays[CONV])
    kept = layout.take(joined, [0])  # the 40-token row left: a buffer far larger than 2 slots is cut
    assert kept.arrays[KEY].shape[2] < joined.arrays[KEY].shape[2] and kept.length == 2
    np.testing.assert_array_equal(kept.arrays[KEY][0, :, :2], a.arrays[KEY][0, :, :2])


def test_newcomers_are_written_into_spare_rows_without_copying_the_batch(layout):
    batch = layout.extend(filled(layout, 2, [6, 9], 3), [filled(layout, 1, [4], 4)])  # reallocated with spare rows
    before = {name: batch.arrays[name] for name in batch.arrays}
    newcomer = filled(layout, 1, [5], 5)
    grown = layout.extend(batch, [newcomer])
    for name, a in before.items():  # every array: the same memory, the old rows untouched
        assert np.shares_memory(grown.arrays[name], a), name
        np.testing.assert_array_equal(grown.arrays[name][:3], a[:3])
    np.testing.assert_array_equal(grown.arrays[KEY][3, :, :5], newcomer.arrays[KEY][0, :, :5])
    assert list(grown.arrays["past_lengths"]) == [6, 9, 4, 5]
    # a leaver's place taken by the last row, in place
    kept = layout.retain(grown, [0, 3, 2])
    assert np.shares_memory(kept.arrays[KEY], before[KEY]) and list(kept.arrays["past_lengths"]) == [6, 5, 4]
    np.testing.assert_array_equal(kept.arrays[KEY][1, :, :5], newcomer.arrays[KEY][0, :, :5])


def test_a_batch_reallocated_for_its_most_rows_takes_every_later_newcomer_in_place(layout):
    batch = layout.extend(filled(layout, 2, [6, 9], 3), [filled(layout, 1, [4], 4)], rows=8)
    first = {name: batch.arrays[name] for name in (KEY, CONV)}
    newcomers = [filled(layout, 1, [i + 2], 10 + i) for i in range(5)]
    for new in newcomers:  # rows 4..8 of 8: no reallocation
        batch = layout.extend(batch, [new], rows=8)
        for name, a in first.items():
            assert np.shares_memory(batch.arrays[name], a), name
    assert batch.arrays[KEY].shape[0] == 8 and list(batch.arrays["past_lengths"]) == [6, 9, 4, 2, 3, 4, 5, 6]
    for i, new in enumerate(newcomers):
        np.testing.assert_array_equal(batch.arrays[KEY][3 + i, :, : i + 2], new.arrays[KEY][0, :, : i + 2])
        np.testing.assert_array_equal(batch.arrays[CONV][3 + i], new.arrays[CONV][0])
    # without `rows`: room for as many rows again (2 rows -> a buffer of 4)
    small = layout.extend(filled(layout, 1, [3], 20), [filled(layout, 1, [3], 21)])
    assert small.arrays[KEY].base.shape[0] == 4


TF = dict(num_layers=1, n_heads=2, d_model=8, src_vocab_size=9, tgt_vocab_size=9)
SRC_KEY, MASK = "past_key_values.0.encoder.key", "encoder_attention_mask"


def encoded(layout, sources: list[int], seed: int) -> State:
    """A transformer decoder state of one row per source length: random cross K/V over each
    row's source (zeros past it, masked), an empty self-attention cache."""
    spec = transformer_specs(TF)["decoder"]
    rng = np.random.default_rng(seed)
    cols = max(sources)
    arrays = layout.zeros(spec, len(sources))
    arrays[MASK] = (np.arange(cols) < np.array(sources)[:, None]).astype(np.int64)  # (b, s)
    for name in layout.masks[MASK]:
        arrays[name] = rng.standard_normal((len(sources), 2, cols, 4)).astype(np.float32) * arrays[MASK][:, None, :, None]
    return State(arrays, 0).owning()


def test_a_source_cut_after_a_leave_keeps_the_spare_rows_later_newcomers_are_written_into():
    layout = StateLayout.of(transformer_specs(TF)["decoder"])
    batch = layout.extend(encoded(layout, [3, 12], 1), [encoded(layout, [4], 2)], rows=6)
    kept = layout.retain(batch, [0, 2])  # the 12-column source left: 4 of 12 columns used, cut
    assert kept.arrays[MASK].shape == (2, 4) and kept.arrays[SRC_KEY].shape == (2, 2, 4, 4)
    np.testing.assert_array_equal(kept.arrays[SRC_KEY][1], batch.arrays[SRC_KEY][2, :, :4])
    new = encoded(layout, [2], 3)
    joined = layout.extend(kept, [new], rows=6)
    for name in (MASK, SRC_KEY):  # written into the cut arrays' spare rows: nothing reallocated
        assert np.shares_memory(joined.arrays[name], kept.arrays[name]), name
    np.testing.assert_array_equal(joined.arrays[MASK], [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    np.testing.assert_array_equal(joined.arrays[SRC_KEY][2, :, :2], new.arrays[SRC_KEY][0])
    assert not joined.arrays[SRC_KEY][2, :, 2:].any()  # the newcomer's columns past its source read as padding


def test_join_pads_shorter_sources_with_hidden_zero_columns():
    """States of different source lengths joined: each row's source columns past its own are
    zeros and its mask hides them (padding must never be attended), its own columns unchanged."""
    layout = StateLayout.of(transformer_specs(TF)["decoder"])
    short, long = encoded(layout, [3], 1), encoded(layout, [12, 5], 2)
    joined = layout.join([short, long])
    np.testing.assert_array_equal(joined.arrays[MASK], (np.arange(12) < np.array([[3], [12], [5]])).astype(np.int64))
    for name in layout.masks[MASK]:
        np.testing.assert_array_equal(joined.arrays[name][0, :, :3], short.arrays[name][0])
        assert not joined.arrays[name][0, :, 3:].any(), name
        np.testing.assert_array_equal(joined.arrays[name][1:], long.arrays[name])
