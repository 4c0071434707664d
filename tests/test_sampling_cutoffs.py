"""transformers' typical, epsilon and eta sampling (`typical_p`, `epsilon_cutoff`, `eta_cutoff`)
as seqexport samples them, against transformers' own warpers.

- The distribution a row is sampled from equals what transformers' TemperatureLogitsWarper,
  TopK, TopP, MinP, Typical, Epsilon and Eta warpers leave (softmax of their scores), in
  float64: the same tokens kept, the same probabilities, over random logits and settings.
- A checkpoint whose generation_config sets them: no "not applied" warning, they are generation
  defaults (the CLI, the Python API and a served request), and every sampled token lies where
  transformers' warpers on the model's own logits left probability.
"""

import json

import numpy as np
import openai
import pytest
import torch
import transformers
from transformers.generation import logits_process as lp

import seqexport.runtime as rt
from seqexport.errors import UsageError
from seqexport.manifest import read_manifest
from seqexport.runtime.generate import sampled_distribution
from tests.test_generation_config import PROMPT, checkpoint, cli_ids, with_generation  # noqa: F401
from tests.test_serve import plain_server


def transformers_distribution(z: np.ndarray, options: rt.SearchOptions) -> np.ndarray:
    """softmax of transformers' sampling warpers' scores (its generate's order), in float64."""
    procs = []
    if options.temperature != 1:
        procs.append(lp.TemperatureLogitsWarper(options.temperature))
    if options.top_k:
        procs.append(lp.TopKLogitsWarper(options.top_k))
    if options.top_p < 1:
        procs.append(lp.TopPLogitsWarper(options.top_p))
    if options.min_p > 0:
        procs.append(lp.MinPLogitsWarper(options.min_p))
    if options.typical_p < 1:
        procs.append(lp.TypicalLogitsWarper(options.typical_p))
    if options.epsilon_cutoff > 0:
        procs.append(lp.EpsilonLogitsWarper(options.epsilon_cutoff))
    if options.eta_cutoff > 0:
        procs.append(lp.EtaLogitsWarper(options.eta_cutoff))
    scores = torch.tensor(z, dtype=torch.float64)[None]
    for proc in procs:
        scores = proc(None, scores)
    return torch.softmax(scores, -1)[0].numpy()


@pytest.mark.parametrize("seed", range(4))
def test_the_sampled_distribution_is_transformers_warpers(seed):
    rng = np.random.default_rng(seed)
    cut = 0
    for _ in range(100):
        z = (rng.standard_normal(300) * rng.choice([0.5, 2.0, 4.0])).astype(np.float32)
        options = rt.SearchOptions(
            do_sample=True, temperature=float(rng.choice([1.0, 0.7, 1.5])), top_k=int(rng.choice([0, 60])),
            top_p=float(rng.choice([1.0, 0.9])), min_p=float(rng.choice([0.0, 0.02])),
            typical_p=float(rng.choice([1.0, 0.2, 0.5, 0.95])), epsilon_cutoff=float(rng.choice([0.0, 3e-4, 0.01])),
            eta_cutoff=float(rng.choice([0.0, 3e-4, 0.02])))
        ours = sampled_distribution(z, options)
        ours = ours / ours.sum()
        theirs = transformers_distribution(z, options)
        assert np.array_equal(ours > 0, theirs > 0), options
        np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)
        plain = rt.SearchOptions(do_sample=True, temperature=options.temperature, top_k=options.top_k,
                                 top_p=options.top_p, min_p=options.min_p)
        cut += int((sampled_distribution(z, plain) > 0).sum() != (ours > 0).sum())
    assert cut > 30  # the cutoffs removed tokens in many cases


@pytest.mark.parametrize("options, message", [
    ({"typical_p": 0}, "typical_p must be in (0, 1], got 0"),
    ({"typical_p": 1.5}, "typical_p must be in (0, 1], got 1.5"),
    ({"epsilon_cutoff": 1.0}, "epsilon_cutoff must be in [0, 1), got 1.0"),
    ({"eta_cutoff": -0.1}, "eta_cutoff must be in [0, 1), got -0.1"),
    ({"eta_cutoff": "0.1"}, "eta_cutoff must be a number, got '0.1'"),
])
def test_a_bad_cutoff_is_refused_naming_it(options, message):
    with pytest.raises(UsageError) as e:
        rt.SearchOptions(**options)
    assert message in str(e.value)


def test_a_checkpoints_cutoffs_are_applied_where_transformers_applies_them(checkpoint, tmp_path,  # noqa: F811
                                                                            tmp_path_factory):
    config = {"do_sample": True, "typical_p": 0.3, "epsilon_cutoff": 0.002, "eta_cutoff": 0.001, "max_new_tokens": 8}
    folder, out = with_generation(checkpoint, tmp_path, **config)
    assert read_manifest(out)["generation"] == {"file": "generation_config.json", "defaults": config,
                                                "not_applied": {}}
    hf = transformers.MambaForCausalLM.from_pretrained(folder).eval()
    warp = rt.SearchOptions(**{k: v for k, v in config.items() if k != "max_new_tokens"})
    plain = rt.SearchOptions(do_sample=True)
    seen, narrower = set(), 0
    for seed in range(6):
        ours, log = cli_ids(out, "--seed", str(seed))
        assert len(ours) == 8 and "does not apply" not in log
        assert "typical_p 0.3, epsilon_cutoff 0.002, eta_cutoff 0.001" in log
        with torch.no_grad():  # every sampled token where transformers' warpers left probability
            logits = hf(torch.tensor([PROMPT + ours])).logits[0, len(PROMPT) - 1:-1].double().numpy()
        kept = [transformers_distribution(row, warp) > 0 for row in logits]
        assert all(k[t] for k, t in zip(kept, ours)), ours
        narrower += sum(int(k.sum() < (transformers_distribution(row, plain) > 0).sum()) for k, row in zip(kept, logits))
        seen.add(tuple(ours))
    assert len(seen) > 1 and narrower > 0  # sampled, and the cutoffs removed tokens
    model = rt.load(out)
    assert rt.generate(model, [PROMPT], rt.model_options(model, seed=3))[0] == \
        rt.generate(model, [PROMPT], rt.SearchOptions(**config, seed=3))[0]
    # a served request samples with them too (no request field sets them)
    with plain_server(out, tmp_path_factory) as server:
        assert "typical_p 0.3" in server.log_path.read_text()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(model=out.name, prompt=PROMPT, max_tokens=8, seed=5)
        got = answer.choices[0].token_ids
    with torch.no_grad():
        logits = hf(torch.tensor([PROMPT + got])).logits[0, len(PROMPT) - 1:-1].double().numpy()
    assert all((transformers_distribution(row, warp) > 0)[t] for row, t in zip(logits, got)), got


def test_an_older_exports_cutoffs_kept_as_not_applied_are_applied_now(checkpoint, tmp_path):  # noqa: F811
    _, out = with_generation(checkpoint, tmp_path, do_sample=True, typical_p=0.3, max_new_tokens=6)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["generation"] = {"file": "generation_config.json", "defaults": {"do_sample": True, "max_new_tokens": 6},
                              "not_applied": {"typical_p": 0.3}}  # as an export before this change wrote it
    (out / "manifest.json").write_text(json.dumps(manifest))
    model = rt.load(out)
    assert model.generation_defaults["typical_p"] == 0.3 and model.generation["not_applied"] == {}
