"""The byte tokenizer, the dates task, the training scripts and the bundled trained models."""

import copy
import datetime as dt
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seqexport.checkpoints.io import load_checkpoint
from seqexport.families.mamba.runtime import MambaSteps
from seqexport.families.mamba.training import prompt_ids as mamba_prompt
from seqexport.runtime.tokenizer import ByteTokenizer
from seqexport.training.dates import FORMATS, WEEKDAYS, format_date, make_split, split_of
from seqexport.training.train import decode, evaluate

ROOT = Path(__file__).resolve().parent.parent
PRETRAINED = ROOT / "models" / "pretrained"
FAMILIES = ("transformer", "mamba")


# ------------------------------------------------------------------ tokenizer


@pytest.mark.parametrize("text", ["", "5 March 2021", "héllo wörld ✓ 日本語 🙂", "a\x00b\nc"])
def test_tokenizer_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert all(3 <= i < 259 for i in ids[1:-1])
    assert len(ids) == len(text.encode("utf-8")) + 2
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text)) == text


def test_tokenizer_special_ids():
    tok = ByteTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 259)
    assert tok.encode("A") == [ord("A") + 3]
    # stops at eos, skips pad and bos, replaces invalid UTF-8
    assert tok.decode([1, 0, 68, 0, 69, 2, 70]) == "AB"
    assert tok.decode([0xFF + 3, 68]) == "\ufffdA"


def test_tokenizer_dict_round_trip():
    d = ByteTokenizer().to_dict()
    assert d == {"type": "byte", "pad_id": 0, "bos_id": 1, "eos_id": 2, "offset": 3, "vocab_size": 259}
    assert ByteTokenizer.from_dict(json.loads(json.dumps(d))) == ByteTokenizer()
    with pytest.raises(ValueError, match="'bpe'"):
        ByteTokenizer.from_dict({"type": "bpe"})


# ---------------------------------------------------------------- dates task


def test_dates_deterministic_and_iso():
    a = make_split("train", 500, seed=3)
    assert a == make_split("train", 500, seed=3)
    assert a[:100] == make_split("train", 100, seed=3)
    assert a != make_split("train", 500, seed=4)
    for _, iso in a:
        assert dt.date(1950, 1, 1) <= dt.date.fromisoformat(iso) <= dt.date(2049, 12, 31)
    assert len({x for x, _ in a}) > 450  # many distinct surface forms


def test_dates_conventions():
    d = dt.date(2021, 3, 5)
    assert format_date(d, "{dd}/{mm}/{yyyy}") == "05/03/2021"  # day-first
    assert format_date(d, "{weekday}, {month} {do} {yyyy}") == "Friday, March 5th 2021"
    assert format_date(dt.date(1987, 11, 22), "{mon} {d}, {yy}", "upper") == "NOV 22, 87"
    with pytest.raises(ValueError, match="split"):
        make_split("valid", 3)


def test_dates_weekdays_are_true():
    weekday = re.compile("|".join(w[:3] for w in WEEKDAYS), re.IGNORECASE)
    checked = 0
    for text, iso in make_split("train", 3000) + make_split("test", 1000):
        m = weekday.search(text)
        if m:
            assert m.group(0).lower() == WEEKDAYS[dt.date.fromisoformat(iso).weekday()][:3].lower()
            checked += 1
    assert checked > 200
    for fmt in FORMATS:  # every format names its date unambiguously enough to check a weekday
        assert format_date(dt.date(2000, 2, 29), fmt)


def test_dates_train_test_disjoint():
    train = {iso for _, iso in make_split("train", 20000)}
    test = {iso for _, iso in make_split("test", 2000)}
    assert not train & test
    assert all(split_of(dt.date.fromisoformat(iso)) == "test" for iso in test)


def measured_exact_match(family, model, n, seed) -> float:
    """Greedy-decode the first n held-out pairs of `seed` and count exact matches, here."""
    pairs = make_split("test", n, seed=seed)
    preds = decode(family, model, [x for x, _ in pairs])
    assert len(preds) == n
    return sum(p == y for p, (_, y) in zip(preds, pairs)) / n


# ----------------------------------------------------------------- training


@pytest.mark.parametrize("family", FAMILIES)
def test_training_script_runs(family, tmp_path):
    out = tmp_path / family
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / f"train_{family}.py"),
         "--steps", "20", "--eval-n", "5", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "step    20/20" in proc.stdout
    ckpt = load_checkpoint(out, family)
    raw = json.loads((out / "config.json").read_text())
    assert raw["eval"]["n"] == 5 and raw["eval"]["split"] == "test" and raw["eval"]["seed"] == 0
    # the recorded accuracy is the one the saved model has on those 5 held-out pairs
    assert raw["eval"]["exact_match"] == measured_exact_match(family, ckpt.model, 5, raw["eval"]["seed"])
    assert ByteTokenizer.from_dict(raw["tokenizer"]) == ByteTokenizer()
    assert ckpt.family == family
    if family == "mamba":  # the runtime frames a prompt as the model was trained
        from seqexport.runtime.tokenizer import encode_prompt

        tok = ByteTokenizer()
        assert encode_prompt(tok, MambaSteps.prompt_frame, "x", raw["tokenizer"]) == mamba_prompt("x", tok)


# --------------------------------------------------------- bundled models


@pytest.fixture(autouse=True)
def one_thread():
    """Decode on one thread: on a busy 2-core machine two threads run several times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=FAMILIES)
def bundled(request):
    family = request.param
    path = PRETRAINED / f"{family}-dates"
    return family, load_checkpoint(path, family), json.loads((path / "config.json").read_text())


def test_bundled_checkpoint_records(bundled):
    family, ckpt, raw = bundled
    assert ByteTokenizer.from_dict(raw["tokenizer"]) == ByteTokenizer()
    assert raw["eval"]["split"] == "test" and raw["eval"]["n"] >= 500
    assert raw["eval"]["exact_match"] >= 0.95
    assert (ckpt.path / "model.safetensors").stat().st_size < 5 * 2**20


def test_bundled_greedy_matches_recorded_accuracy(bundled):
    """Measured on the very pairs the record names (all n of them), not a sample."""
    family, ckpt, raw = bundled
    rec = raw["eval"]
    assert rec["exact_match"] == measured_exact_match(family, ckpt.model, rec["n"], rec["seed"])


def test_evaluate_records_the_exact_match_it_measures():
    """A bundled model with noise on its output layer gets some dates wrong: `evaluate` must
    report the fraction right, on the pairs it names."""
    ckpt = load_checkpoint(PRETRAINED / "transformer-dates", "transformer")
    model = copy.deepcopy(ckpt.model)
    torch.manual_seed(0)
    with torch.no_grad():
        model.decoder.fc_out.weight.add_(torch.randn_like(model.decoder.fc_out.weight) * 0.3)
    measured = measured_exact_match("transformer", model, 100, seed=5)
    assert 0.2 < measured < 0.95  # neither all right nor all wrong: a miscount would show
    assert evaluate("transformer", model, 100, seed=5) == {"exact_match": measured, "n": 100, "split": "test",
                                                           "seed": 5}
