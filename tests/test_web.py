"""`seqexport web` in a real browser: every bundled model exported with `seqexport export`, one
site for all, served by http.server on 127.0.0.1 and driven in Debian's headless Chromium
(Selenium + Debian's chromedriver; Chromium resolves no other host, so a CDN fetch would fail).

The page decodes 50 held-out prompts per model to exactly the tokens the Python runtime gives
(greedy, and seeded sampling), shows a clear message for bad input, and a screenshot is taken
mid-generation ($SEQEXPORT_WEB_SHOTS, else the test's temporary folder). Without Chromium the
browser tests skip, or fail when SEQEXPORT_REQUIRE_BROWSER=1 (CI).
"""

import fcntl
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport import families
from seqexport.checkpoints import bundled
from seqexport.cli import cli
from seqexport.errors import InputError, UsageError
from seqexport.runtime.tokenizer import encode_prompt
from seqexport.training.dates import make_split
from seqexport.web import browser
from seqexport.web.site import MAX_PROMPT_TOKENS, find_node_modules

N = 50  # held-out prompts per model
MAX_NEW = 32  # `seqexport generate`'s default
BUNDLED = [f for f in families.names() if bundled(f) is not None and bundled(f).is_dir()]
SAMPLING = {"temperature": 3.0, "top_k": 40, "top_p": 0.95}  # every bundled model strays from greedy


def unavailable(why: str):
    if os.environ.get("SEQEXPORT_REQUIRE_BROWSER") == "1":
        pytest.fail(f"SEQEXPORT_REQUIRE_BROWSER=1, but {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def site(tmp_path_factory, worker_id):
    """(site folder, {family: exported folder}), made once for all xdist workers (a lock in
    their shared temporary folder): each bundled model through `seqexport export`, then
    `seqexport web` over all of them."""
    try:
        find_node_modules()
    except UsageError as e:
        unavailable(f"onnxruntime-web cannot be had: {e}")
    root = tmp_path_factory.getbasetemp()
    root = (root.parent if worker_id != "master" else root) / "web-site"
    root.mkdir(exist_ok=True)
    exports = {f: root / "exports" / f for f in BUNDLED}
    out = root / "site"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "site.json").is_file():
            for family, folder in exports.items():
                result = CliRunner().invoke(cli, ["export", family, "--checkpoint", str(bundled(family)),
                                                  "--out", str(folder), "--overwrite"])
                assert result.exit_code == 0, result.output
            result = CliRunner().invoke(cli, ["web", *map(str, exports.values()), "--out", str(out),
                                              "--example", "5 March 2021", "--example", "Mar 6, 21"])
            assert result.exit_code == 0, result.output
    return out, exports


def export_and_site(checkpoint: Path, out: Path, site: Path) -> None:
    """`seqexport export mamba` of a checkpoint, then `seqexport web` of the export."""
    runner = CliRunner()
    result = runner.invoke(cli, ["export", "mamba", "--checkpoint", str(checkpoint), "--out", str(out)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["web", str(out), "--out", str(site)])
    assert result.exit_code == 0, result.output


def site_of_a_mamba_with_generation_config(tmp_path: Path, name: str, generation: dict, seed: int):
    """A random Mamba (transformers' class, tokens that vary) with a byte-level BPE and
    `generation` as its generation_config.json, exported to tmp_path/name, its site built in
    tmp_path/site; returns the Python runtime's model of it."""
    import torch
    import transformers

    tok = byte_level_bpe()
    torch.manual_seed(seed)
    config = transformers.MambaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                                      state_size=8, pad_token_id=0, eos_token_id=None)
    hf = transformers.MambaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in hf.backbone.layers:
            layer.mixer.out_proj.weight.mul_(5.0)  # tokens that vary
    hf.save_pretrained(tmp_path / "ckpt")
    tok.save(str(tmp_path / "ckpt" / "tokenizer.json"))
    (tmp_path / "ckpt" / "generation_config.json").write_text(json.dumps(generation))
    export_and_site(tmp_path / "ckpt", tmp_path / name, tmp_path / "site")
    return rt.load(tmp_path / name, provider="cpu")


def need_page():
    """A browser and onnxruntime-web (else the test is unavailable: a skip, or a failure in CI)."""
    need_browser()
    try:
        find_node_modules()
    except UsageError as e:
        unavailable(f"onnxruntime-web cannot be had: {e}")


def need_browser():
    why = browser.browser_missing()
    if why:
        unavailable(why)


@pytest.fixture(scope="module")
def page(request):
    """(url, driver, site): the site served on 127.0.0.1 and a headless Chromium (checked for before
    the site is built: no exports for a test that will skip)."""
    need_browser()
    site = request.getfixturevalue("site")
    with browser.serve(site[0]) as url, browser.chromium() as driver:
        yield url, driver, site


def python_decode(folder, prompts, **search) -> tuple[list[list[int]], list[str]]:
    """What the Python runtime generates for each prompt alone (`seqexport generate`'s path)."""
    model = rt.load(folder, provider="cpu")
    record = model.manifest["tokenizer"]
    ids = [encode_prompt(model.tokenizer, model.prompt_frame, p, record) for p in prompts]
    if search.get("do_sample"):  # a generator per prompt, seeded as the page seeds it
        out = [rt.generate(model, [i], rt.SearchOptions(max_new_tokens=MAX_NEW, seed=s, **search))[0]
               for s, i in enumerate(ids)]
    else:
        out = rt.generate(model, ids, rt.SearchOptions(max_new_tokens=MAX_NEW))
    return out, [model.tokenizer.decode(o) for o in out]


def site_record(site, family) -> dict:
    return next(m for m in json.loads((site[0] / "site.json").read_text())["models"] if m["name"] == family)


@pytest.mark.parametrize("family", BUNDLED)
def test_page_decodes_held_out_prompts_as_the_python_runtime(page, family):
    url, driver, site = page
    prompts = [x for x, _ in make_split("test", N, seed=0)]
    want_ids, want_text = python_decode(site[1][family], prompts)
    assert browser.open_page(driver, url, family) == "ready"
    assert "WASM" in driver.find_element("id", "status").text  # which backend ran, on the page
    assert driver.find_element("id", "rules").get_attribute("hidden") is not None  # no generation config: no rules
    got = [browser.run_prompt(driver, p, maxNewTokens=MAX_NEW) for p in prompts]
    assert [g["message"] for g in got] == [None] * N
    assert [g["run"]["tokens"] for g in got] == want_ids
    assert [g["output"] for g in got] == want_text
    assert "tokens/s" in got[-1]["stats"] and "WASM" in got[-1]["stats"]
    assert browser.resource_origins(driver) == {url.split("/")[2]}  # nothing from outside the site


@pytest.mark.parametrize("family", BUNDLED)
def test_seeded_sampling_matches_the_python_runtime(page, family):
    url, driver, site = page
    prompts = [x for x, _ in make_split("test", 10, seed=1)]
    want, _ = python_decode(site[1][family], prompts, do_sample=True, **SAMPLING)
    greedy, _ = python_decode(site[1][family], prompts)
    assert want != greedy  # the draws matter
    assert browser.open_page(driver, url, family) == "ready"
    got = [browser.run_prompt(driver, p, maxNewTokens=MAX_NEW, doSample=True, temperature=SAMPLING["temperature"],
                              topK=SAMPLING["top_k"], topP=SAMPLING["top_p"], seed=s)["run"]["tokens"]
           for s, p in enumerate(prompts)]
    assert got == want


def test_unchecking_stop_at_eos_decodes_past_it_as_the_python_runtime(page):
    url, driver, site = page
    family = BUNDLED[0]
    model = rt.load(site[1][family], provider="cpu")
    ids = model.encode("5 March 2021")
    stopped = rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=MAX_NEW))[0]
    assert len(stopped) < MAX_NEW  # this decode ends at eos: the box matters
    want = rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=MAX_NEW, eos_id=-1))[0]
    assert browser.open_page(driver, url, family) == "ready"
    got = browser.run_prompt(driver, "5 March 2021", maxNewTokens=MAX_NEW, stopAtEos=False)
    assert got["message"] is None and got["run"]["tokens"] == want


EOS_LIST = """
const [ids, eosIds, n, done] = arguments;
window.seqexportPage.model.generateIds(ids, { maxNewTokens: n, eosId: eosIds }).then(done, (e) => done({ error: String(e) }));
"""


def test_the_pages_model_stops_at_any_of_several_eos_ids_as_the_python_runtime(page):
    """generateIds with a list of eos ids (a checkpoint's end of text and end of turn): the
    decode ends at the listed id it meets, the other never coming."""
    url, driver, site = page
    family = BUNDLED[0]
    model = rt.load(site[1][family], provider="cpu")
    ids = model.encode("5 March 2021")
    free = rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=MAX_NEW, eos_id=-1))[0]
    k = next(i for i in range(2, len(free)) if free[i] not in free[:i])
    eos_ids = [next(t for t in range(model.vocab_size) if t not in free), free[k]]
    want = rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=MAX_NEW, eos_id=eos_ids))[0]
    assert want == free[:k]
    assert browser.open_page(driver, url, family) == "ready"
    assert driver.execute_async_script(EOS_LIST, ids, eos_ids, MAX_NEW) == want
    # an eos the model cannot pick would never end a row: refused by name, as eos_for() refuses it
    v = model.vocab_size
    got = driver.execute_async_script(EOS_LIST, ids, [eos_ids[0], v], MAX_NEW)
    assert f"eosId {v} is not a token id of this model: expected -1 (never) or an id in [0, {v})" in got["error"]


START_ID = """
const [ids, startId, n, done] = arguments;
window.seqexportPage.model.generateIds(ids, { maxNewTokens: n, startId, eosId: -1 }).then(done, (e) => done({ error: String(e) }));
"""


def test_the_pages_model_takes_a_start_id_only_where_a_decoder_does_as_the_python_runtime(page):
    """startId starts an encoder-decoder's decoder: the page decodes as generate(start_id=...)
    does; a decoder-only model refuses it by name instead of ignoring it, and an id past the
    vocabulary is refused as SearchOptions refuses it; and an option the runtime does not know."""
    url, driver, site = page
    for family in [f for f in ("transformer", "mamba") if f in BUNDLED]:
        model = rt.load(site[1][family], provider="cpu")
        ids, v = model.encode("5 March 2021"), model.vocab_size
        assert browser.open_page(driver, url, family) == "ready"
        if model.takes_start_id:
            start = model.tokenizer.bos_id + 3  # not the default start: the decode changes with it
            want = rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=MAX_NEW, eos_id=-1, start_id=start))[0]
            assert driver.execute_async_script(START_ID, ids, start, MAX_NEW) == want
            got = driver.execute_async_script(START_ID, ids, v, MAX_NEW)
            assert f"startId {v} is not a token id of this model: expected an id in [0, {v})" in got["error"]
        else:
            got = driver.execute_async_script(START_ID, ids, 5, MAX_NEW)
            assert "startId 5 does not apply to this" in got["error"] and "it continues the prompt" in got["error"]
        # a misspelt option decoded with the default instead, silently: refused by name
        got = driver.execute_async_script(START_ID.replace("startId, eosId", "maxNewToken: 3, eosId"), ids, None, MAX_NEW)
        assert got["error"].startswith("Error: unknown option maxNewToken; expected some of maxNewTokens, ")


def test_bad_input_shows_a_message_and_the_page_keeps_working(page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url, driver, site = page
    for family in BUNDLED:
        record = site_record(site, family)
        assert browser.open_page(driver, url, family) == "ready"
        box = driver.find_element(By.ID, "prompt")
        box.clear()
        driver.find_element(By.ID, "generate").click()  # an empty prompt, as a person would send it
        assert browser.wait_state(driver, ("error", "done")) == "error"
        error = driver.find_element(By.ID, "error")
        assert error.is_displayed() and "prompt is empty" in error.text
        long = browser.run_prompt(driver, "1" * (record["max_prompt_tokens"] + 1))
        assert long["state"] == "error" and f"at most {record['max_prompt_tokens']}" in long["message"]
        if record["max_new_tokens_limit"]:
            over = browser.run_prompt(driver, "5 March 2021", maxNewTokens=record["max_new_tokens_limit"] + 1)
            assert over["state"] == "error" and f"{record['max_new_tokens_limit']} positions" in over["message"]
        bad = browser.run_prompt(driver, "5 March 2021", maxNewTokens="")
        assert bad["state"] == "error" and "not a number" in bad["message"]
        ok = browser.run_prompt(driver, "5 March 2021", maxNewTokens=MAX_NEW)  # the page still works
        assert ok["state"] == "done" and ok["output"] == "2021-03-05" and ok["message"] is None

    # a site with a graph file missing and a weights file altered
    broken = browser.copy_site(site[0], site[0].parent / f"broken-{os.getpid()}")
    missing, altered, healthy = (BUNDLED * 3)[:3] if len(BUNDLED) < 3 else BUNDLED[:3]
    manifest = json.loads((broken / "models" / missing / "manifest.json").read_text())
    gone = manifest["graphs"][next(iter(manifest["graphs"]))]["file"]
    (broken / "models" / missing / gone).unlink()
    weights = broken / "models" / altered / "weights.onnx.data"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.unlink()  # a hard link to the real site's file: a new file instead
    weights.write_bytes(bytes(data))
    with browser.serve(broken) as broken_url:
        assert browser.open_page(driver, broken_url, missing) == "load-error"
        message = driver.find_element(By.ID, "error")
        assert message.is_displayed() and gone in message.text and "404" in message.text
        assert not driver.find_element(By.ID, "generate").is_enabled()
        if altered != missing:
            Select(driver.find_element(By.ID, "model")).select_by_value(altered)
            assert browser.wait_state(driver) == "load-error"
            assert "weights.onnx.data" in message.text and "altered" in message.text
        if healthy not in (missing, altered):
            Select(driver.find_element(By.ID, "model")).select_by_value(healthy)  # the page recovers
            assert browser.wait_state(driver) == "ready" and not message.is_displayed()
            assert browser.run_prompt(driver, "Mar 6, 21")["output"] == "2021-03-06"


def test_screenshot_mid_generation_and_stop(page, tmp_path):
    from selenium.webdriver.common.by import By

    url, driver, site = page
    family = next((f for f in BUNDLED if not site_record(site, f)["max_new_tokens_limit"]), BUNDLED[0])
    limit = site_record(site, family)["max_new_tokens_limit"] or 5000
    assert browser.open_page(driver, url, family) == "ready"
    driver.execute_script("""const $ = (id) => document.getElementById(id);
        $("prompt").value = "Friday, March 5th 2021"; $("max-new-tokens").value = arguments[0];
        $("stop-at-eos").checked = false; $("options").open = true; $("generate").click();""", limit)
    tokens = driver.execute_async_script("""const done = arguments[0];
        (function poll() { const run = window.seqexportPage.lastRun;
          if (run && run.tokens.length >= 40 || document.body.dataset.state !== "running") done(run ? run.tokens.length : 0);
          else setTimeout(poll, 5); })();""")
    assert tokens >= 40 and driver.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "running"
    shots = Path(os.environ.get("SEQEXPORT_WEB_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / f"web-{family}-mid-generation.png"
    assert driver.save_screenshot(str(shot))
    print(f"\nscreenshot of the page mid-generation: {shot}", file=sys.stderr)
    driver.find_element(By.ID, "stop").click()
    assert browser.wait_state(driver, ("done", "error")) == "done"
    run = driver.execute_script("return window.seqexportPage.lastRun")
    assert 40 <= len(run["tokens"]) < limit and run["text"].startswith("2021-03-05")
    assert shot.stat().st_size > 10_000


# WebGPU here runs on SwiftShader's software Vulkan (Debian's chromium ships it), which compiles
# every shader on the CPU (7-24 s a model on 2 cores): the encoder-decoder (static state on the
# device, its appended cache on the host) and one recurrent model (replaced state on the device)
WEBGPU = [f for f in ("transformer", "mamba2") if f in BUNDLED]

STATE_LOCATIONS = """
const [prompt, done] = arguments;
const m = window.seqexportPage.model;
m.start(m.encodePrompt(prompt)).then(({ state }) => {
  const where = Object.fromEntries(Object.entries(state.tensors).map(([k, t]) => [k, t.location]));
  state.dispose();
  done({ where, appended: Object.keys(state.buffers) });
}, (e) => done({ error: String(e) }));
"""


def test_webgpu_backend_keeps_the_state_on_the_device(request):
    """The WebGPU backend decodes a held-out prompt to the Python runtime's tokens, and every
    state tensor the graphs feed back stays on the device between steps."""
    need_browser()
    site = request.getfixturevalue("site")
    prompt = "Mar 6, 21"
    with browser.serve(site[0]) as url, browser.chromium(webgpu=True) as driver:
        for family in WEBGPU:
            assert browser.open_page(driver, url, family, backend="webgpu") == "ready"
            assert "WebGPU" in driver.find_element("id", "status").text
            got = browser.run_prompt(driver, prompt, maxNewTokens=6)
            want, _ = python_decode(site[1][family], [prompt])
            assert got["message"] is None and got["run"]["backend"] == "webgpu"
            assert got["run"]["tokens"] == want[0][:6]
            state = driver.execute_async_script(STATE_LOCATIONS, prompt)
            assert state.get("where") and set(state["where"].values()) == {"gpu-buffer"}, state


BRANCH_AND_GROW = """
const [longIds, n, shortIds, k, branch, done] = arguments;
(async () => {
  const m = window.seqexportPage.model;
  const argmax = (l) => { let b = 0; for (let i = 1; i < l.length; i++) if (l[i] > l[b]) b = i; return b; };
  const greedy = async (logits, state, count) => {
    const out = [];
    for (let i = 0; i < count; i++) { const t = argmax(logits); out.push(t); ({ logits, state } = await m.step(t, state)); }
    return { out, logits, state };
  };
  const long = await m.start(longIds);
  const grown = await greedy(long.logits, long.state, n);  // past the cache buffer's first 64 slots
  const root = await m.start(shortIds);
  const line = await greedy(root.logits, root.state, k);  // in the buffer the prompt's state holds
  const b = await m.step(branch, root.state);  // the prompt's state stepped again: a branch
  const other = await greedy(b.logits, b.state, 5);
  const more = await greedy(line.logits, line.state, 3);  // the first line goes on as it was
  return { grown: grown.out, grownLogits: Array.from(grown.logits), line: line.out, branch: other.out, more: more.out,
           moreLogits: Array.from(more.logits) };
})().then(done, (e) => done({ error: String(e) }));
"""


def test_a_branch_and_a_grown_cache_in_the_page_match_the_python_runtime(page):
    """The page's model API on the hybrid (an attention KV cache beside Mamba-2 state): a decode
    that outgrows the cache's first buffer (its rows copied into a larger one); and a prompt's
    state stepped again with another token after a line went on from it (the branch must copy,
    not write into the buffer that line still reads), then that line continued. Each equals the
    Python runtime's greedy decode of the same tokens."""
    url, driver, site = page
    model = rt.load(site[1]["hybrid"], provider="cpu")
    long_ids = model.encode("5 March 2021, 6 March 2021, 7 March 2021 = ")
    n = 70 - len(long_ids)  # 70 positions: the page's buffer starts with 64 slots
    short_ids, k = model.encode("5 March 2021"), 4
    assert len(long_ids) > 30 and n > 20 and len(short_ids) + k + 3 < 64

    def greedy(prompt, count):
        return rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=count, eos_id=-1))[0]

    line = greedy(short_ids, k + 3)
    branch = (line[0] + 1) % model.vocab_size
    assert browser.open_page(driver, url, "hybrid") == "ready"
    got = driver.execute_async_script(BRANCH_AND_GROW, long_ids, n, short_ids, k, branch)
    assert "error" not in got, got
    grown = greedy(long_ids, n)
    assert got["grown"] == grown
    # the logits after the grown line's last token, not just their argmax (every slot is read)
    want, _ = model.begin([long_ids + grown])  # (1, v)
    np.testing.assert_allclose(got["grownLogits"], want[0], rtol=1e-3, atol=1e-3)
    assert got["line"] == line[:k] and got["more"] == line[k:]
    assert got["branch"] == greedy(short_ids + [branch], 5)
    want, _ = model.begin([short_ids + line])  # (1, v)
    np.testing.assert_allclose(got["moreLogits"], want[0], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("family", BUNDLED)
def test_the_pages_beam_search_gives_the_python_runtimes_tokens(page, family):
    """Beam search on the page (4 beams, no eos: decodes where the beams part from greedy; then 3
    beams, a length penalty of 0.7, stopping at eos: hypotheses that end) gives, prompt by
    prompt, the tokens of the Python runtime's beam search (itself checked against transformers'
    in tests/test_beam_recurrent.py and tests/test_runtime.py). Every family: a KV cache, Mamba's, Mamba-2's, RWKV-7's and a
    hybrid's state, each beam a branch of its parent's state."""
    url, driver, site = page
    model = rt.load(site[1][family], provider="cpu")
    prompts = [x for x, _ in make_split("test", N, seed=0)]
    ids = [model.encode(p) for p in prompts]
    never = rt.SearchOptions(max_new_tokens=MAX_NEW, eos_id=-1)
    greedy = rt.generate(model, ids, never)
    beams = [rt.generate(model, [i], rt.SearchOptions(max_new_tokens=MAX_NEW, eos_id=-1, num_beams=4))[0] for i in ids]
    differ = [j for j in range(N) if beams[j] != greedy[j]]
    assert differ, "no prompt where the beams part from greedy: the test would not tell beam search from greedy"
    chosen = differ[:4] + [j for j in range(N) if j not in differ][:2]
    ending = list(range(4))
    ended = [rt.generate(model, [ids[j]], rt.SearchOptions(max_new_tokens=MAX_NEW, num_beams=3, length_penalty=0.7))[0]
             for j in ending]
    assert browser.open_page(driver, url, family) == "ready"
    got = [browser.run_prompt(driver, prompts[j], maxNewTokens=MAX_NEW, numBeams=4, stopAtEos=False) for j in chosen]
    assert [g["message"] for g in got] == [None] * len(chosen)
    assert [g["run"]["tokens"] for g in got] == [beams[j] for j in chosen]
    assert "beam search, 4 beams" in got[0]["stats"]
    assert [g["output"] for g in got] == [model.tokenizer.decode(beams[j], stop_at_eos=False) for j in chosen]
    got = [browser.run_prompt(driver, prompts[j], maxNewTokens=MAX_NEW, numBeams=3, lengthPenalty=0.7) for j in ending]
    assert [g["run"]["tokens"] for g in got] == ended


STOPPED_API = """
const [ids, done] = arguments;
const m = window.seqexportPage.model;
(async () => {
  const aborted = AbortSignal.abort();
  const beams = await m.generateIds(ids, {numBeams: 3, eosId: -1, maxNewTokens: 50, signal: aborted});
  const greedy = await m.generateIds(ids, {eosId: -1, maxNewTokens: 50, signal: aborted});
  const said = await m.generateIds(ids, {signal: "stop"}).then(() => "decoded", (e) => `${e.constructor.name}: ${e.message}`);
  return {beams, greedy, said};
})().then(done, (e) => done({error: String(e)}));
"""


def test_stopping_a_beam_search_ends_it_with_its_best_hypothesis_so_far(page):
    """Stop pressed during a beam search ends it at once, with the tokens Python's beam search
    gives with that many new tokens (the step it stopped at taken as its last); the page says
    the tokens are the best so far. The JS runtime's `signal` does the same: aborted before a
    beam search's first step, its one-token answer; before a greedy decode's, nothing; a signal
    that is not one is a ModelError."""
    url, driver, site = page
    family = next((f for f in BUNDLED if not site_record(site, f)["max_new_tokens_limit"]), BUNDLED[0])
    model = rt.load(site[1][family], provider="cpu")
    prompt = "Friday, March 5th 2021"
    ids = model.encode(prompt)
    assert browser.open_page(driver, url, family) == "ready"
    limit = site_record(site, family)["max_new_tokens_limit"] or 5000
    got = browser.run_prompt(driver, prompt, maxNewTokens=limit, numBeams=4, stopAtEos=False, stopAfterMs=1500)
    assert got["state"] == "done" and got["message"] is None, got
    tokens = got["run"]["tokens"]
    assert 100 <= len(tokens) < limit  # stopped mid-search (not before its first steps, nor at its end)
    assert got["run"]["ms"][0] < 6000  # at once: the page's Stop was not held back until the search ended
    assert tokens == rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=len(tokens), eos_id=-1, num_beams=4))[0]
    assert "stopped: the best so far" in got["stats"]
    api = driver.execute_async_script(STOPPED_API, ids)
    assert api == {"beams": rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=1, eos_id=-1, num_beams=3))[0],
                   "greedy": [], "said": 'ModelError: signal must be an AbortSignal (or null), got "stop"'}


def test_the_page_reads_an_older_exports_rules_as_applied_and_beam_sampling_as_not(page):
    """The page reads a manifest's generation record as Python's current_record: token rules an
    older export kept as not applied become defaults; num_beams kept beside do_sample (beam
    sampling) stays not applied, and does not become the page's beam width."""
    url, driver, _ = page
    driver.get(url)
    record = {"file": "generation_config.json", "defaults": {"do_sample": True, "top_k": 3},
              "not_applied": {"num_beams": 3, "no_repeat_ngram_size": 2, "top_h": 0.5, "typical_p": 0.4}}
    got = driver.execute_async_script(
        "const [record, done] = arguments; import('./seqexport.mjs').then((m) => done("
        "{defaults: m.generationDefaults(record), skipped: m.notApplied(record)}), (e) => done(String(e)));", record)
    assert got == {"defaults": {"doSample": True, "topK": 3, "noRepeatNgramSize": 2, "typicalP": 0.4},
                   "skipped": {"num_beams": 3, "top_h": 0.5}}


BEAM_API = """
const [ids, done] = arguments;
const m = window.seqexportPage.model;
const said = {};
const calls = {
  "numBeams 0": {numBeams: 0}, "numBeams 2.5": {numBeams: 2.5}, "beams and sampling": {numBeams: 2, doSample: true},
  "earlyStopping": {numBeams: 2, earlyStopping: "sometimes"}, "lengthPenalty": {numBeams: 2, lengthPenalty: NaN},
};
(async () => {
  for (const [what, options] of Object.entries(calls)) {
    try { await m.generateIds(ids, options); said[what] = "no error"; }
    catch (e) { said[what] = `${e.constructor.name}: ${e.message}`; }
  }
  const never = await m.generateIds(ids, {numBeams: 4, eosId: -1, earlyStopping: "never", lengthPenalty: 2.0,
                                          repetitionPenalty: 1.3, presencePenalty: 0.5, maxNewTokens: 20});
  const early = await m.generateIds(ids, {numBeams: 2, minNewTokens: 12, earlyStopping: true, maxNewTokens: 20});
  const one = await m.generateIds(ids, {numBeams: 1, eosId: -1, maxNewTokens: 12});
  done({said, never, early, one});
})().catch((e) => done({error: String(e)}));
"""


def test_the_js_beam_search_takes_pythons_options_and_refuses_bad_ones(page):
    """The runtime API's beam search with the penalties (applied to each beam's float64
    log-probabilities, its history copied where a beam splits), min_new_tokens and both
    early-stopping rules gives the Python runtime's tokens; numBeams 1 is greedy; a bad beam
    option is a ModelError naming the value."""
    url, driver, site = page
    model = rt.load(site[1]["mamba"], provider="cpu")
    ids = model.encode("5 March 2021")
    assert browser.open_page(driver, url, "mamba") == "ready"
    got = driver.execute_async_script(BEAM_API, ids)
    assert "error" not in got, got
    never = rt.SearchOptions(num_beams=4, eos_id=-1, early_stopping="never", length_penalty=2.0,
                             repetition_penalty=1.3, presence_penalty=0.5, max_new_tokens=20)
    plain = rt.SearchOptions(num_beams=4, eos_id=-1, early_stopping="never", length_penalty=2.0, max_new_tokens=20)
    assert rt.generate(model, [ids], never)[0] != rt.generate(model, [ids], plain)[0]  # the penalties decide tokens
    assert got["never"] == rt.generate(model, [ids], never)[0]
    early = rt.SearchOptions(num_beams=2, min_new_tokens=12, early_stopping=True, max_new_tokens=20)
    assert len(rt.generate(model, [ids], rt.SearchOptions(num_beams=2, max_new_tokens=20))[0]) < 12  # it bites
    assert got["early"] == rt.generate(model, [ids], early)[0]
    assert got["one"] == rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=12, eos_id=-1))[0]
    assert got["said"] == {
        "numBeams 0": "ModelError: numBeams must be an integer >= 1 (and < 2**53), got 0",
        "numBeams 2.5": "ModelError: numBeams must be an integer >= 1 (and < 2**53), got 2.5",
        "beams and sampling": "ModelError: beam search and sampling cannot be combined: give numBeams 1, or doSample false",
        "earlyStopping": 'ModelError: earlyStopping must be true, false or "never", got "sometimes"',
        "lengthPenalty": "ModelError: lengthPenalty must be a finite number, got NaN",
    }


RULES_API = """
const [ids, cases, bad, done] = arguments;
const m = window.seqexportPage.model;
(async () => {
  const out = [];
  for (const options of cases) out.push(await m.generateIds(ids, options));
  const said = [];
  for (const options of bad) said.push(await m.generateIds(ids, options).then(() => "decoded", (e) => `${e.constructor.name}: ${e.message}`));
  return { out, said };
})().then(done, (e) => done({ error: String(e) }));
"""


def test_the_js_runtime_applies_transformers_token_rules_as_python(page):
    """transformers' token rules in the JS runtime's decodes, greedy and by beam search, give the
    Python runtime's tokens (itself checked against transformers' generate) on an encoder-decoder,
    whose decoder start leads the ids the rules read, and on a Mamba; each rule bites; a rule's
    id past the vocabulary is a ModelError naming it."""
    url, driver, site = page
    for family in [f for f in ("transformer", "mamba") if f in BUNDLED]:
        model = rt.load(site[1][family], provider="cpu")
        ids, v = model.encode("Friday, 5 March 2021"), model.vocab_size
        plain = rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=MAX_NEW))[0]
        start = model.start_token() if model.takes_start_id else ids[-1]
        cases = [  # (the JS options, the Python ones)
            ({"noRepeatNgramSize": 1}, {"no_repeat_ngram_size": 1}),
            ({"badWordsIds": [[start, plain[0]]]}, {"bad_words_ids": [[start, plain[0]]]}),  # (the start: first)
            ({"badWordsIds": [[plain[3]]], "minLength": 12}, {"bad_words_ids": [[plain[3]]], "min_length": 12}),
            ({"sequenceBias": [[[plain[1], plain[2]], -30.0]], "suppressTokens": [plain[4]],
              "beginSuppressTokens": [plain[0]], "forcedEosTokenId": plain[0]},
             {"sequence_bias": [[[plain[1], plain[2]], -30.0]], "suppress_tokens": [plain[4]],
              "begin_suppress_tokens": [plain[0]], "forced_eos_token_id": plain[0]}),
            ({"noRepeatNgramSize": 2, "numBeams": 3, "badWordsIds": [[plain[1]]]},
             {"no_repeat_ngram_size": 2, "num_beams": 3, "bad_words_ids": [[plain[1]]]}),
        ]
        want = [rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=MAX_NEW, **py))[0] for _, py in cases]
        assert all(w != plain for w in want), (family, want, plain)  # each bites
        bad = [{"badWordsIds": [[1, v]]}, {"forcedBosTokenId": v}, {"noRepeatNgramSize": -1},
               {"sequenceBias": [[[1], "high"]]}]
        assert browser.open_page(driver, url, family) == "ready"
        got = driver.execute_async_script(RULES_API, ids, [js | {"maxNewTokens": MAX_NEW} for js, _ in cases], bad)
        assert "error" not in got, got
        assert got["out"] == want, family
        assert got["said"] == [
            f"ModelError: badWordsIds token {v} is not a token id of this model: expected an id in [0, {v})",
            f"ModelError: forcedBosTokenId {v} is not a token id of this model: expected an id in [0, {v})",
            "ModelError: noRepeatNgramSize must be an integer >= 0 (and < 2**53), got -1",
            'ModelError: sequenceBias[0] bias must be a number (or -Infinity), got "high"']


def test_the_js_runtime_stops_at_max_length_as_python(page):
    """maxLength (transformers' max_length) in the JS runtime's decodes, greedy and by beam search:
    the Python runtime's tokens (itself checked against transformers' generate), the prompt
    counted on a Mamba and the decoder start on an encoder-decoder; maxNewTokens beside it, the
    tighter holds; a forced eos at the row's last id; min_new_tokens replacing min_length; a
    prompt that reaches it, or a length the decoder cannot hold, is a ModelError naming it. The
    manifest's max_length reaches the options where no maxNewTokens is given."""
    url, driver, site = page
    for family in [f for f in ("transformer", "mamba") if f in BUNDLED]:
        model = rt.load(site[1][family], provider="cpu")
        ids = model.encode("Friday, 5 March 2021")
        begin = 1 if model.takes_start_id else len(ids)
        plain = rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=12, eos_id=-1))[0]
        cases = [  # (the JS options, the Python ones)
            ({"maxLength": begin + 5, "eosId": -1}, {"max_length": begin + 5, "eos_id": -1}),
            ({"maxLength": begin + 7, "numBeams": 3, "eosId": -1}, {"max_length": begin + 7, "num_beams": 3, "eos_id": -1}),
            ({"maxLength": begin + 6, "numBeams": 3, "eosId": plain[2], "lengthPenalty": 2.0},
             {"max_length": begin + 6, "num_beams": 3, "eos_id": plain[2], "length_penalty": 2.0}),
            ({"maxLength": begin + 9, "maxNewTokens": 4, "eosId": -1},
             {"max_length": begin + 9, "max_new_tokens": 4, "eos_id": -1}),
            ({"maxLength": begin + 6, "forcedEosTokenId": plain[0], "eosId": -1},
             {"max_length": begin + 6, "forced_eos_token_id": plain[0], "eos_id": -1}),
            ({"minLength": begin + 12, "minNewTokens": 1, "eosId": plain[1], "maxNewTokens": 12},
             {"min_length": begin + 12, "min_new_tokens": 1, "eos_id": plain[1], "max_new_tokens": 12}),
        ]
        want = [rt.generate(model, [ids], rt.SearchOptions(**py))[0] for _, py in cases]
        assert [len(w) for i, w in enumerate(want[:5]) if i != 2] == [5, 7, 4, 6] and want[4][-1] == plain[0] != plain[5]
        assert want[5] == plain[:1]  # the eos came after min_new_tokens: min_length was not the rule
        limit = model.max_new_tokens_limit
        bad = [{"maxLength": begin}, {"maxLength": 0}] + ([{"maxLength": limit + begin + 1}] if limit else [])
        assert browser.open_page(driver, url, family) == "ready"
        got = driver.execute_async_script(RULES_API, ids, [js for js, _ in cases], bad)
        assert "error" not in got, got
        assert got["out"] == want, family
        start = "its decoder start" if model.takes_start_id else f"the prompt's {begin} tokens"
        assert got["said"][:2] == [
            f"ModelError: max length {begin} leaves no new token after {start}: expected a max length above "
            "them, or max new tokens",
            "ModelError: maxLength must be an integer >= 1 (and < 2**53), got 0"]
        if limit:
            assert got["said"][2] == (f"ModelError: max length {limit + begin + 1} ({limit + 1} new tokens) exceeds "
                                      f"what {family} can hold: its decoder has {limit} positions")
    record = {"file": "generation_config.json", "defaults": {"max_length": 40}, "not_applied": {}}
    got = driver.execute_async_script(
        "const [record, done] = arguments; import('./seqexport.mjs').then((m) => { const d = m.generationDefaults(record);"
        " done({defaults: d, alone: m.searchOptions({}, null, d).maxNewTokens, "
        " given: m.searchOptions({maxNewTokens: 5}, null, d).maxLength}); }, (e) => done(String(e)));", record)
    assert got == {"defaults": {"maxLength": 40}, "alone": 40, "given": None}


BEAM_SWEEP = """
const [prompts, cases, done] = arguments;
const m = window.seqexportPage.model;
(async () => {
  const out = [];
  for (const options of cases) {
    const rows = [];
    for (const ids of prompts) rows.push(await m.generateIds(ids, options));
    out.push(rows);
  }
  return out;
})().then(done, (e) => done(String(e)));
"""


def test_the_js_beam_search_ends_hypotheses_as_python_over_eos_tokens_widths_and_rules(tmp_path):
    """tests/test_beam_recurrent.py's sweep on the page's runtime: a random Mamba whose beams part
    from greedy, each token its beams produce taken as the eos (hypotheses of every length end),
    widths 2 and 4, length penalties 0.3, 1 and 2, and early stopping true, false and "never":
    every case gives the Python runtime's tokens (themselves transformers', by that test)."""
    from tests.test_beam_recurrent import PROMPTS, _hf_case

    need_page()
    _hf_case(tmp_path, "mamba")
    result = CliRunner().invoke(cli, ["web", str(tmp_path / "export"), "--out", str(tmp_path / "site")])
    assert result.exit_code == 0, result.output
    m = rt.load(tmp_path / "export", provider="cpu", threads=1)
    new = 16
    plain = rt.generate(m, PROMPTS, rt.SearchOptions(max_new_tokens=new, num_beams=4, eos_id=-1))
    eos_ids = np.flatnonzero(np.bincount([t for row in plain for t in row[1:]])).tolist()
    cases, want = [], []
    for eos in eos_ids:
        for length_penalty, beams in [(1.0, 2), (0.3, 4), (2.0, 4)]:
            for early in (True, False, "never"):
                cases.append({"maxNewTokens": new, "numBeams": beams, "eosId": eos, "lengthPenalty": length_penalty,
                              "earlyStopping": early})
                want.append(rt.generate(m, PROMPTS, rt.SearchOptions(
                    max_new_tokens=new, num_beams=beams, eos_id=eos, length_penalty=length_penalty,
                    early_stopping=early)))
    assert len(eos_ids) > 3 and sum(len(r) < new for rows in want for r in rows) > 50  # hypotheses end
    with browser.serve(tmp_path / "site") as url, browser.chromium() as driver:
        assert browser.open_page(driver, url, "export") == "ready"
        got = driver.execute_async_script(BEAM_SWEEP, PROMPTS, cases)
    assert got == want


def test_a_checkpoint_that_decodes_by_beam_search_opens_the_page_on_it(tmp_path):
    """A checkpoint whose generation_config.json sets num_beams 3 and a length penalty: the page
    opens on beam search with those values and gives the tokens Python's `generate` gives with
    the model's defaults; picking greedy on the page (or doSample in the API) sets the model's
    beams aside, as Python's model_options does. A beam search and a greedy decode begun
    together on one model take turns (onnxruntime-web failed the second's run mid-flight)."""
    need_page()
    model = site_of_a_mamba_with_generation_config(tmp_path, "b", {"num_beams": 3, "length_penalty": 0.6,
                                                                   "max_new_tokens": 10}, seed=1)
    prompts = ["Friday, 5 März 2021", "the 6th of May", "05/03/87"]
    want = [rt.generate(model, [model.encode(p)], rt.model_options(model))[0] for p in prompts]
    greedy = [rt.generate(model, [model.encode(p)], rt.model_options(model, do_sample=False))[0] for p in prompts]
    assert rt.model_options(model).num_beams == 3 and want != greedy
    with browser.serve(tmp_path / "site") as url, browser.chromium() as driver:
        assert browser.open_page(driver, url, "b") == "ready"
        shown = {i: driver.find_element("id", i).get_attribute("value")
                 for i in ("decoding", "beams", "length-penalty", "max-new-tokens")}
        got = [browser.run_prompt(driver, p, numBeams=3)["run"]["tokens"] for p in prompts]
        plain = [browser.run_prompt(driver, p, numBeams=1)["run"]["tokens"] for p in prompts]
        api = driver.execute_async_script(
            "const [ids, done] = arguments; const m = window.seqexportPage.model;"
            "Promise.all([m.generateIds(ids), m.generateIds(ids, {doSample: false})]).then(done, (e) => done(String(e)));",
            model.encode(prompts[0]))
    assert shown == {"decoding": "beam", "beams": "3", "length-penalty": "0.6", "max-new-tokens": "10"}
    assert got == want and plain == greedy
    assert api == [want[0], greedy[0]]


def test_a_checkpoint_that_sets_max_length_opens_the_page_with_the_length_field_empty(tmp_path):
    """A checkpoint whose generation_config.json sets max_length and no max_new_tokens: the page's
    length field opens empty, its placeholder naming the max_length, and a run gives the tokens
    Python's `generate` gives with the model's defaults (max_length minus the prompt's ids); a
    number typed into the field wins, as --max-new-tokens does."""
    need_page()
    model = site_of_a_mamba_with_generation_config(tmp_path, "l", {"max_length": 24}, seed=1)
    prompt = "Friday, 5 März 2021"
    ids = model.encode(prompt)
    want = rt.generate(model, [ids])[0]
    assert len(ids) < 24 and len(want) == 24 - len(ids)
    with browser.serve(tmp_path / "site") as url, browser.chromium() as driver:
        assert browser.open_page(driver, url, "l") == "ready"
        field = driver.find_element("id", "max-new-tokens")
        shown = (field.get_attribute("value"), field.get_attribute("placeholder"))
        got = browser.run_prompt(driver, prompt)
        typed = browser.run_prompt(driver, prompt, maxNewTokens=3)
    assert shown == ("", "to 24 ids (max_length)")
    assert got["message"] is None and got["run"]["tokens"] == want
    assert typed["run"]["tokens"] == rt.generate(model, [ids], rt.model_options(model, max_new_tokens=3))[0] == want[:3]


def test_a_model_with_its_own_hugging_face_tokenizer_reads_and_writes_text_in_the_page(tmp_path):
    """A user's checkpoint with its own tokenizer.json (a byte-level BPE), exported, put on a site:
    the page encodes the prompt, decodes and shows the text as `seqexport generate --text`
    does, and an answer whose first token is the checkpoint's eos shows empty text, no error
    (tokenizers.js threw on it: no ids to decode). With "Chat" ticked (offered since the
    checkpoint has a chat template), the prompt is a user's message through that template."""
    import torch
    import transformers

    need_page()
    tok = byte_level_bpe()
    prompts = ["Friday, 5 März 2021", "Straße über 1984-05-09"]
    torch.manual_seed(0)
    config = transformers.MambaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                                      state_size=8, pad_token_id=0)
    hf = transformers.MambaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in hf.backbone.layers:
            layer.mixer.out_proj.weight.mul_(5.0)  # tokens that vary
        first = hf(torch.tensor([tok.encode(prompts[1]).ids])).logits[0, -1].argmax().item()
    hf.config.eos_token_id = hf.generation_config.eos_token_id = first  # the second prompt's answer: empty
    hf.save_pretrained(tmp_path / "ckpt")
    tok.save(str(tmp_path / "ckpt" / "tokenizer.json"))
    (tmp_path / "ckpt" / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    export_and_site(tmp_path / "ckpt", tmp_path / "m", tmp_path / "site")
    model = rt.load(tmp_path / "m", provider="cpu")
    assert model.manifest["tokenizer"]["type"] == "hf" and list(model.tokenizer.eos_ids) == [first]
    want = [rt.generate(model, [model.encode(p)], rt.SearchOptions(max_new_tokens=MAX_NEW))[0] for p in prompts]
    assert len(want[0]) > 3 and len(set(want[0])) > 1 and want[1] == []
    chat_ids = model.encode_chat([{"role": "user", "content": prompts[0]}])
    chat_want = rt.generate(model, [chat_ids], rt.SearchOptions(max_new_tokens=MAX_NEW, eos_id=-1))[0]
    with browser.serve(tmp_path / "site") as url, browser.chromium() as driver:
        assert browser.open_page(driver, url, "m") == "ready"
        assert driver.find_element("id", "chat-row").is_displayed()  # a chat model: offered
        got = [browser.run_prompt(driver, p, maxNewTokens=MAX_NEW, chat=False) for p in prompts]
        chat = browser.run_prompt(driver, prompts[0], maxNewTokens=MAX_NEW, stopAtEos=False)
        held = driver.execute_async_script(  # an answer that starts at eos, held back for 3 tokens
            "const [ids, done] = arguments; window.seqexportPage.model.generateIds(ids, {minNewTokens: 3, "
            f"maxNewTokens: {MAX_NEW}}}).then(done, (e) => done(String(e)));", model.encode(prompts[1]))
    assert [g["message"] for g in got] == [None, None]
    assert [g["run"]["tokens"] for g in got] == want
    assert [g["output"] for g in got] == [model.tokenizer.decode(w) for w in want]
    assert got[0]["output"] and got[1]["output"] == ""
    assert held == rt.generate(model, [model.encode(prompts[1])],
                               rt.SearchOptions(max_new_tokens=MAX_NEW, min_new_tokens=3))[0] and len(held) >= 3
    # the prompt as a user's message through the checkpoint's chat template, as the Python runtime puts it
    assert chat["message"] is None and chat["run"]["tokens"] == chat_want != want[0]


def test_a_granite_hybrid_with_experts_decodes_in_the_page_as_the_python_runtime(tmp_path):
    """Granite-4.0-H's shape with a mixture of experts, exported in both forms (onnxruntime-web
    runs ONNX Runtime's com.microsoft.MoE kernel as well as the standard dense form): the page
    gives the Python runtime's greedy and seeded sampled tokens for each."""
    import torch
    import transformers

    from tests.test_hybrid_model import _randomize

    need_page()
    tok = byte_level_bpe()
    config = transformers.GraniteMoeHybridConfig(
        hidden_size=64, num_hidden_layers=3, vocab_size=tok.get_vocab_size(), shared_intermediate_size=96,
        num_local_experts=6, num_experts_per_tok=2, intermediate_size=48,
        layer_types=["full_attention", "linear_attention", "full_attention"], num_attention_heads=4,
        num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=16,
        position_embedding_type="rope", eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    _randomize(transformers.GraniteMoeHybridForCausalLM(config), 0).save_pretrained(tmp_path / "ckpt")
    tok.save(str(tmp_path / "ckpt" / "tokenizer.json"))
    runner, prompt = CliRunner(), "Friday, 5 March 2021"
    for form in ("kernel", "dense"):
        result = runner.invoke(cli, ["export", "hybrid", "--checkpoint", str(tmp_path / "ckpt"),
                                     "--out", str(tmp_path / form), "--experts", form])
        assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["web", str(tmp_path / "kernel"), str(tmp_path / "dense"), "--out", str(tmp_path / "site")])
    assert result.exit_code == 0, result.output
    model = rt.load(tmp_path / "kernel", provider="cpu")
    ids = model.encode(prompt)
    greedy = rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=12))[0]
    sampled = rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=12, do_sample=True, seed=3, **SAMPLING))[0]
    assert len(set(greedy)) > 3 and sampled != greedy
    with browser.serve(tmp_path / "site") as url, browser.chromium() as driver:
        for form in ("kernel", "dense"):
            assert browser.open_page(driver, url, form) == "ready"
            got = browser.run_prompt(driver, prompt, maxNewTokens=12)
            drawn = browser.run_prompt(driver, prompt, maxNewTokens=12, doSample=True, seed=3,
                                       temperature=SAMPLING["temperature"], topK=SAMPLING["top_k"],
                                       topP=SAMPLING["top_p"])
            assert got["message"] is None and got["run"]["tokens"] == greedy, form
            assert drawn["message"] is None and drawn["run"]["tokens"] == sampled, form


def test_the_page_starts_from_the_checkpoints_generation_defaults_as_the_python_runtime(tmp_path):
    """A checkpoint whose generation_config.json samples (temperature, top-k, top-p, max new
    tokens, a repetition penalty, a no_repeat_ngram_size) and sets a top_h: the page's decoding
    options start at those values, it says top_h is not applied, and a seeded run with nothing
    else changed gives the tokens Python's `generate` gives with the model's defaults and that
    seed; so does the JS runtime's `generateIds(ids, {seed})`, and greedy with OpenAI's presence
    and frequency penalties."""
    need_page()
    model = site_of_a_mamba_with_generation_config(tmp_path, "g", {
        "do_sample": True, "temperature": 0.5, "top_k": 3, "top_p": 0.9, "min_p": 0.1, "max_new_tokens": 6,
        "repetition_penalty": 1.4, "no_repeat_ngram_size": 2, "top_h": 0.5}, seed=0)
    prompt = "Friday, 5 März 2021"
    ids = model.encode(prompt)
    want = {seed: rt.generate(model, [ids], rt.model_options(model, seed=seed))[0] for seed in (7, 8)}
    assert all(len(w) == 6 for w in want.values()) and want[7] != want[8]
    plain = rt.SearchOptions(do_sample=True, temperature=0.5, top_k=3, top_p=0.9, min_p=0.1, max_new_tokens=6, seed=7)
    assert want[7] != rt.generate(model, [ids], plain)[0]  # the penalty decides a token
    penalties = {"presencePenalty": 1.5, "frequencyPenalty": 0.7, "doSample": False, "maxNewTokens": 12}
    # a prompt of the model's own favourite tokens, under a strong repetition penalty: counting the
    # prompt or not decides the answer
    echo = ids + rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=8))[0]
    strong = rt.generate(model, [echo], rt.model_options(model, do_sample=False, repetition_penalty=4.0,
                                                        max_new_tokens=8))[0]
    greedy = rt.generate(model, [ids], rt.model_options(model, presence_penalty=1.5, frequency_penalty=0.7,
                                                        do_sample=False, max_new_tokens=12))[0]
    assert greedy != rt.generate(model, [ids], rt.model_options(model, do_sample=False, max_new_tokens=12))[0]
    # greedy with the model's n-gram rule alone: it bites
    looping = {"doSample": False, "maxNewTokens": 24, "repetitionPenalty": 1}
    no_repeat = rt.generate(model, [ids], rt.model_options(model, do_sample=False, max_new_tokens=24,
                                                           repetition_penalty=1.0))[0]
    assert no_repeat != rt.generate(model, [ids], rt.model_options(model, do_sample=False, max_new_tokens=24,
                                                                   repetition_penalty=1.0, no_repeat_ngram_size=0))[0]
    with browser.serve(tmp_path / "site") as url, browser.chromium() as driver:
        assert browser.open_page(driver, url, "g") == "ready"
        shown = {i: driver.find_element("id", i).get_attribute("value")
                 for i in ("decoding", "temperature", "top-k", "top-p", "max-new-tokens", "repetition-penalty", "min-p")}
        note = driver.find_element("id", "error").text
        driver.execute_script('document.getElementById("options").open = true;')
        rules = driver.find_element("id", "rules").text
        got = browser.run_prompt(driver, prompt, doSample=True, seed=7)
        api = driver.execute_async_script(
            "const [ids, options, echo, looping, done] = arguments; const m = window.seqexportPage.model;"
            "Promise.all([m.generateIds(ids, {seed: 8}), m.generateIds(ids, options),"
            " m.generateIds(echo, {doSample: false, repetitionPenalty: 4.0, maxNewTokens: 8}),"
            " m.generateIds(ids, looping)])"
            ".then(done, (e) => done(String(e)));", ids, penalties, echo, looping)
    assert shown == {"decoding": "sample", "temperature": "0.5", "top-k": "3", "top-p": "0.9", "max-new-tokens": "6",
                     "repetition-penalty": "1.4", "min-p": "0.1"}
    assert "generation_config.json sets top_h 0.5, which seqexport does not apply" in note
    assert rules == ("The model's generation_config.json also sets no_repeat_ngram_size 2: every decode applies them, "
                     "as transformers' generate does.")
    assert got["message"] is None and got["run"]["tokens"] == want[7]
    assert api == [want[8], greedy, strong, no_repeat]


def test_an_address_naming_a_model_or_option_the_site_lacks_says_so(page):
    """?model= a model the site lacks opens the first one with a visible notice naming what the
    site has (it opened silently); ?threads= or ?backend= that are not ones ORT takes stop the
    load with a message naming the value (they were replaced by defaults without a word)."""
    from selenium.webdriver.common.by import By

    url, driver, site = page
    names = [m["name"] for m in json.loads((site[0] / "site.json").read_text())["models"]]
    driver.get(url + "?model=nope&backend=wasm")
    assert browser.wait_state(driver) == "ready"
    message = driver.find_element(By.ID, "error")
    assert message.is_displayed() and message.text == (
        f'This site has no model named "nope" (it has {", ".join(names)}); showing {names[0]}.')
    assert driver.execute_script("return document.getElementById('model').value") == names[0]
    assert browser.run_prompt(driver, "5 March 2021")["state"] == "done"  # the page works
    for query, said in (("threads=abc", 'threads must be an integer >= 1, got "abc"'),
                        ("threads=0", "threads must be an integer >= 1, got 0"),
                        ("backend=cuda", 'backend "cuda": expected one of "auto", "wasm", "webgpu"')):
        driver.get(url + f"?model={names[0]}&{query}")
        assert browser.wait_state(driver) == "load-error", query
        assert said in driver.find_element(By.ID, "error").text, query


MISUSE = """
const [lm, ed, promptText, done] = arguments;
(async () => {
  const { loadModel } = await import("./seqexport.mjs");
  const said = {};
  const attempt = async (name, f) => {
    try { await f(); said[name] = null; } catch (e) { said[name] = `${e.constructor.name}: ${e.message}`; }
  };
  // each model from its folder alone: what it knows of itself comes from the site's runtime.json
  const L = await loadModel(`./models/${lm}/`, { backend: "wasm" });
  const E = await loadModel(`./models/${ed}/`, { backend: "wasm" });
  const L2 = await loadModel(`./models/${lm}/`, { backend: "wasm" });  // the same folder again
  const known = (m) => ({ name: m.name, promptFrame: m.promptFrame, maxPromptTokens: m.maxPromptTokens,
                          maxNewTokensLimit: m.maxNewTokensLimit });
  const ids = L.encodePrompt(promptText), eds = E.encodePrompt(promptText);
  const first = (r) => Array.from(r.logits);
  const plain = await L.start(ids);
  const typed = await L.start(BigInt64Array.from(ids, BigInt));  // ids as BigInts: the same prompt
  const edState = (await E.start(eds)).state;
  const gone = (await L.start(ids)).state;
  gone.dispose();
  const steps = [
    ["start(text)", () => L.start(promptText)], ["start(number)", () => L.start(5)],
    ["start(null)", () => L.start(null)], ["start(float id)", () => L.start([...ids.slice(0, 2), 1.5])],
    ["start(string id)", () => L.start([String(ids[0])])],
    ["start(misspelt option)", () => L.start(ids, { startID: 3 })],
    ["start(lm, startId)", () => L.start(ids, { startId: 3 })],
    ["start(ed, startId -1)", () => E.start(eds, { startId: -1 })],
    ["start(ed, startId past vocab)", () => E.start(eds, { startId: E.vocabSize })],
    ["start(ed, startId string)", () => E.start(eds, { startId: "3" })],
    ["step(no state)", () => L.step(5, undefined)], ["step(object)", () => L.step(5, {})],
    ["step(another model's state)", () => L.step(5, edState)], ["step(disposed)", () => L.step(5, gone)],
    ["step(another load's state)", () => L2.step(5, plain.state)],
    ["step(string token)", () => L.step("5", plain.state)], ["step(bigint token)", () => L.step(5n, plain.state)],
    ["encodePrompt(number)", () => L.encodePrompt(123)],
    ["generate(options 5)", () => L.generateIds(ids, 5)],
    ["generate(doSample string)", () => L.generateIds(ids, { doSample: "no", maxNewTokens: 2 })],
    ["generate(temperature string)", () => L.generateIds(ids, { doSample: true, temperature: "2", maxNewTokens: 2 })],
    ["generate(topP string)", () => L.generateIds(ids, { doSample: true, topP: "0.5", maxNewTokens: 2 })],
    ["generate(seed 2**64)", () => L.generateIds(ids, { doSample: true, seed: 2 ** 64, maxNewTokens: 2 })],
    ["generate(eosId string)", () => L.generateIds(ids, { eosId: "3", maxNewTokens: 2 })],
    ["generate(logitBias array)", () => L.generateIds(ids, { logitBias: [3, 1], maxNewTokens: 2 })],
    ["generate(logitBias key)", () => L.generateIds(ids, { logitBias: { "-3": 1 }, maxNewTokens: 2 })],
    ["generate(logitBias string)", () => L.generateIds(ids, { logitBias: { 3: "1" }, maxNewTokens: 2 })],
    ["generate(logitBias past vocab)", () => L.generateIds(ids, { logitBias: { [L.vocabSize]: 1 }, maxNewTokens: 2 })],
    ["generate(past the table)", () => E.generateIds(eds, { maxNewTokens: E.maxNewTokensLimit + 1, eosId: -1 })],
    ["load(no url)", () => loadModel(undefined)],
    ["load(backend cuda)", () => loadModel(`./models/${lm}/`, { backend: "cuda" })],
    ["load(misspelt option)", () => loadModel(`./models/${lm}/`, { backnd: "wasm" })],
    ["load(threads -1)", () => loadModel(`./models/${lm}/`, { backend: "wasm", threads: -1 })],
    ["load(threads string)", () => loadModel(`./models/${lm}/`, { backend: "wasm", threads: "2" })],
    ["load(verify string)", () => loadModel(`./models/${lm}/`, { backend: "wasm", verify: "no" })],
  ];
  for (const [name, f] of steps) await attempt(name, f);
  // the models still work after all that; an option set to undefined is the default
  const after = await L.step(ids[0], plain.state);
  const undef = await L.generateIds(ids, { maxNewTokens: 3, startId: undefined, seed: undefined });
  const dflt = await L.generateIds(ids, { maxNewTokens: 3 });
  return { said, known: { lm: known(L), ed: known(E) }, plain: first(plain), typed: first(typed),
           after: Array.from(after.logits).length, undefinedOptions: [undef, dflt] };
})().then(done, (e) => done({ error: String(e) }));
"""


def test_the_js_runtime_names_misuse_and_a_model_folder_knows_its_limits(page):
    """The page's runtime API called wrongly, as a developer embedding it might: every call is a
    ModelError naming the value and what was expected (before: NaN token ids from a string
    prompt, a TypeError from a missing state, another model's state fed to ORT, a startId ignored
    by a decoder-only model or read as the last token by ORT's negative indexing, options and
    backends misspelt and ignored). A model loaded from its site folder with no options knows
    the Python runtime's prompt frame and limits (the site's runtime.json), so a decode past the
    positional table is refused by name rather than failing inside ORT."""
    url, driver, site = page
    lm, ed = [f for f in ("mamba", "transformer") if f in BUNDLED]
    assert browser.open_page(driver, url, lm) == "ready"
    got = driver.execute_async_script(MISUSE, lm, ed, "5 March 2021")
    assert "error" not in got, got
    for family in (lm, ed):
        model, record = rt.load(site[1][family], provider="cpu"), site_record(site, family)
        assert got["known"][family == ed and "ed" or "lm"] == {
            "name": family, "promptFrame": model.prompt_frame, "maxPromptTokens": record["max_prompt_tokens"],
            "maxNewTokensLimit": model.max_new_tokens_limit}
        assert json.loads((site[0] / record["path"] / "runtime.json").read_text())["max_new_tokens_limit"] \
            == model.max_new_tokens_limit
    v, limit = rt.load(site[1][lm], provider="cpu").vocab_size, rt.load(site[1][ed], provider="cpu").max_new_tokens_limit
    ved = rt.load(site[1][ed], provider="cpu").vocab_size
    said = got["said"]
    ids_first = rt.load(site[1][lm], provider="cpu").encode("5 March 2021")[0]
    want = {
        "start(text)": "promptIds: expected an array of token ids, got a string (model.encodePrompt(text) gives its ids)",
        "start(number)": "promptIds: expected an array of token ids, got 5",
        "start(null)": "promptIds: expected an array of token ids, got null",
        "start(float id)": f"token id 1.5 is not an integer in [0, {v})",
        "start(string id)": f'token id "{ids_first}" is not an integer in [0, {v})',
        "start(misspelt option)": "unknown option startID; expected some of startId",
        "start(lm, startId)": f"startId 3 does not apply to this {lm} model: it continues the prompt",
        "start(ed, startId -1)": f"startId -1 is not a token id of this model: expected an id in [0, {ved})",
        "start(ed, startId past vocab)": f"startId {ved} is not a token id of this model: expected an id in [0, {ved})",
        "start(ed, startId string)": 'startId "3" is not a token id of this model',
        "step(no state)": "state: expected what this model's start() or step() returned, got undefined",
        "step(object)": "state: expected what this model's start() or step() returned, got an object",
        "step(another model's state)": f"state: it came from another model ({ed}); {lm} steps only its own states",
        "step(disposed)": "state: it was disposed; step a state that has not been",
        "step(another load's state)": f"state: it came from another loadModel() of {lm}; {lm} steps only its own states",
        "step(string token)": f'token id "5" is not an integer in [0, {v})',
        "step(bigint token)": f"token id 5n is not an integer in [0, {v})",
        "encodePrompt(number)": "the prompt must be text (a string), got 123",
        "generate(options 5)": "generate: expected an object of options, got 5",
        "generate(doSample string)": 'doSample must be true or false, got "no"',
        "generate(temperature string)": 'temperature must be a number > 0, got "2"',
        "generate(topP string)": 'top-p must be a number in (0, 1], got "0.5"',
        "generate(seed 2**64)": "seed must be an integer >= 0 (and < 2**53), got 18446744073709552000",
        "generate(eosId string)": 'eosId must be a token id (or -1: never), got "3"',
        "generate(logitBias array)": "logitBias must be an object of token id -> number, got an array of 2",
        "generate(logitBias key)": 'logitBias: key "-3" is not a token id (an integer >= 0)',
        "generate(logitBias string)": 'logitBias[3] must be a number (or -Infinity), got "1"',
        "generate(logitBias past vocab)": f"logitBias token {v} is not a token id of this model: expected an id in [0, {v})",
        "generate(past the table)": f"max new tokens {limit + 1} exceeds what {ed} can hold: its decoder has {limit} positions",
        "load(no url)": "loadModel: expected the URL of an exported folder, got undefined",
        "load(backend cuda)": 'backend "cuda": expected one of "auto", "wasm", "webgpu"',
        "load(misspelt option)": "unknown option backnd; expected some of backend, ",
        "load(threads -1)": "threads must be an integer >= 1, got -1",
        "load(threads string)": 'threads must be an integer >= 1, got "2"',
        "load(verify string)": 'verify must be true or false, got "no"',
    }
    assert set(said) == set(want)
    for name, fragment in want.items():
        assert said[name] is not None and said[name].startswith("ModelError: "), (name, said[name])
        assert fragment in said[name], (name, said[name])
    assert got["typed"] == got["plain"] and got["after"] == v
    assert got["undefinedOptions"][0] == got["undefinedOptions"][1] and len(got["undefinedOptions"][0]) >= 1


JS_UNITS = """
const [hfJson, rwkvText, texts, seeds, eosIds, endedIds, done] = arguments;
(async () => {
  const tk = await import("./tokenizers.mjs");
  const { PCG64 } = await import("./sampling.mjs");
  const { Tokenizer } = await import("./vendor/tokenizers.min.mjs");
  const { searchOptions } = await import("./seqexport.mjs");
  const hf = new tk.HFTokenizer(Tokenizer, JSON.parse(hfJson), { eos_id: 0 });
  const listed = new tk.HFTokenizer(Tokenizer, JSON.parse(hfJson), { eos_id: 0, eos_ids: eosIds });
  const rwkv = new tk.RwkvWorldTokenizer(rwkvText);
  const stream = (tok, ids) => { const s = new tk.TextStream(tok); return ids.map((i) => s.push(i)); };
  const hex = (b) => Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  const vocab = [...rwkv.idToBytes].map(([i, b]) => `${i}:${hex(b)}`).join("\\n");
  const byte = new tk.ByteTokenizer({});
  return {
    hf: texts.map((t) => { const ids = hf.encode(t); return { ids, text: hf.decode(ids), pieces: stream(hf, ids) }; }),
    rwkv: texts.map((t) => { const ids = rwkv.encode(t); return { ids, text: rwkv.decode(ids), pieces: stream(rwkv, ids) }; }),
    rwkvVocab: vocab,
    bytePieces: texts.map((t) => stream(byte, byte.encode(t))),
    random: seeds.map((s) => { const r = new PCG64(s); return [r.random(), r.random(), r.random()]; }),
    listed: { eosIds: listed.eosIds, stops: searchOptions({}, listed).eosIds, text: listed.decode(endedIds),
              whole: listed.decode(endedIds, { stopAtEos: false }) },
  };
})().then(done, (e) => done({ error: String(e) }));
"""


TEXTS = ["Friday, 5 März 2021 — 日本語 🎉", "Straße über 1984-05-09", "tabs\tand\nnew lines ", "a" * 30 + "😀😀"]


def byte_level_bpe():
    """A small byte-level BPE (GPT-2's kind) trained by the `tokenizers` library here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator([f"{x} = {y}" for x, y in make_split("train", 500, seed=1)] + TEXTS,
                           trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<unk>"], show_progress=False,
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return hf


def test_js_tokenizers_and_random_draws_match_python(page, tmp_path):
    """In the page: tokenizers.js on a Hugging Face BPE equals the `tokenizers` library, our RWKV
    World tokenizer equals seqexport's (every token of the vocabulary, and encodings), text
    streams whole characters only, and PCG64 draws equal numpy's default_rng."""

    from seqexport.families.rwkv.tokenizer import RwkvWorldTokenizer
    from seqexport.runtime.tokenizer import HFTokenizer

    url, driver, _ = page
    hf = byte_level_bpe()
    vocab_path = Path(families.get("rwkv").runtime.__file__).parent / "vocab" / "rwkv_vocab_v20230424.txt"
    rwkv = RwkvWorldTokenizer(vocab_path)
    seeds = [0, 1, 2**40 + 7]
    ended = hf.encode(TEXTS[1]).ids
    k = next(i for i in range(2, len(ended)) if ended[i] not in ended[:i])
    eos_ids = [0, ended[k]]  # a text that meets the second listed eos at its k-th token
    driver.get(url)
    got = driver.execute_async_script(JS_UNITS, hf.to_str(), vocab_path.read_text(encoding="utf-8"), TEXTS, seeds,
                                      eos_ids, ended)
    assert "error" not in got, got
    for t, g in zip(TEXTS, got["hf"]):
        ids = hf.encode(t).ids
        assert g["ids"] == ids and g["text"] == hf.decode(ids) == t and "".join(g["pieces"]) == t
    for t, g in zip(TEXTS, got["rwkv"]):
        assert g["ids"] == rwkv.encode(t) and g["text"] == t and "".join(g["pieces"]) == t
    want_vocab = "\n".join(f"{i}:{b.hex()}" for i, b in rwkv.id_to_bytes.items())
    assert hashlib.sha256(got["rwkvVocab"].encode()).hexdigest() == hashlib.sha256(want_vocab.encode()).hexdigest()
    for t, pieces in zip(TEXTS, got["bytePieces"]):  # a multi-byte character comes out whole, once
        assert "".join(pieces) == t and "\ufffd" not in "".join(pieces)
        assert all(p == "" or p in t for p in pieces)
    assert got["random"] == [np.random.default_rng(s).random(3).tolist() for s in seeds]
    # a record listing several eos ids: each ends a decoded text and a generation, as in Python
    hf.save(str(tmp_path / "tokenizer.json"))
    ours = HFTokenizer(tmp_path / "tokenizer.json", eos_id=0, eos_ids=eos_ids)
    assert got["listed"]["eosIds"] == got["listed"]["stops"] == eos_ids
    assert got["listed"]["text"] == ours.decode(ended) == hf.decode(ended[:k])
    assert got["listed"]["whole"] == ours.decode(ended, stop_at_eos=False)


JS_PENALTIES = """
const [cases, draws, done] = arguments;
(async () => {
  const { PCG64, Seen, pickToken } = await import("./sampling.mjs");
  const scores = cases.map(([options, context, generated, logits, lead, eos]) => {
    const seen = new Seen(options, [...lead, ...context], { eos });
    for (const t of generated) seen.add(t);
    // beam search's float64 log-probabilities (logits / 3 - 1.25: values no float32 holds)
    const wide = seen.copy().apply(Float64Array.from(logits, (x) => x / 3 - 1.25));
    // (-Infinity as a string: WebDriver's JSON has no infinity)
    const plain = (a) => Array.from(a, (x) => (x === -Infinity ? "-inf" : x));
    return { wanted: Seen.wanted(options), scores: plain(seen.apply(Float32Array.from(logits))), wide: plain(wide) };
  });
  const picked = draws.map(([options, seed, logits]) => {
    const rng = new PCG64(seed);
    return Array.from({ length: 40 }, () => pickToken(Float32Array.from(logits), options, rng));
  });
  return { scores, picked };
})().then(done, (e) => done({ error: String(e) }));
"""


def test_the_pages_penalties_and_min_p_give_pythons_scores_and_draws(page):
    """The page's logit bias, repetition, presence and frequency penalties and transformers' token
    rules (sampling.mjs `Seen`: n-grams, bad words, sequence bias, suppressed tokens, min length,
    forced bos and eos, an encoder-decoder's decoder start leading the ids) against the Python runtime's (`seqexport.runtime.penalties.Seen`, itself checked
    against transformers' generate and OpenAI's rule): the same float32 scores, bit for bit, over random logits of
    both signs, histories with repeats and ids past the vocabulary (and float64 scores, as beam
    search penalises its log-probabilities, bit for bit too); and its seeded draws with
    min-p (with temperature, top-k, top-p), typical, epsilon and eta sampling the tokens
    Python's sampler draws (itself checked against transformers' warpers)."""
    from seqexport.runtime.generate import SearchOptions, pick_tokens
    from seqexport.runtime.penalties import Seen

    url, driver, _ = page
    rng = np.random.default_rng(0)
    cases = []
    for rep, presence, frequency, bias in [(1.3, 0, 0, {}), (0.7, 0.5, 0.4, {}), (1, -1.2, 2, {}), (1.5, 2, -2, {}),
                                           (1, 0, 0, {}), (1, 0, 0, {3: 2.7, 39: -100, 41: 5}),
                                           (1.3, 0.5, 0.4, {7: -0.3, 0: 13.1})]:
        v = 40
        context = rng.integers(0, v + 3, 12).tolist()  # repeats, and ids the row cannot pick
        generated = rng.integers(0, v + 3, 15).tolist()
        logits = (rng.standard_normal(v) * 4).astype(np.float32)
        cases.append(({"repetitionPenalty": rep, "presencePenalty": presence, "frequencyPenalty": frequency,
                       "logitBias": {str(t): b for t, b in bias.items()}}, context, generated, logits.tolist(), [], []))
    # transformers' token rules (each case's sequences taken from its own history, so that they match)
    for lead, rules in [([], {"noRepeatNgramSize": 2, "badWordsIds": "tail", "suppressTokens": [5, 41],
                              "minLength": 40, "repetitionPenalty": 1.2}),
                        ([9], {"sequenceBias": "tail", "beginSuppressTokens": [1, 2], "noRepeatNgramSize": 1}),
                        ([], {"forcedEosTokenId": [4, 6], "maxNewTokens": 16, "logitBias": {"3": 1.5}}),
                        ([7], {"forcedBosTokenId": 11, "noRepeatNgramSize": 3, "minNewTokens": 2})]:
        context = rng.integers(0, 12, 0 if lead else 6).tolist()
        generated = rng.integers(0, 12, 0 if "forcedBosTokenId" in rules else 15).tolist()
        history = lead + context + generated
        if rules.get("badWordsIds") == "tail":
            rules["badWordsIds"] = [history[-1:] + [8], history[-2:] + [10], [history[0]], [2]]
        if rules.get("sequenceBias") == "tail":
            rules["sequenceBias"] = [[history[-1:] + [8], 2.25], [history[-2:] + [10], -1.5], [[3], 0.7], [[1], -1e9]]
        options = {"repetitionPenalty": 1, "presencePenalty": 0, "frequencyPenalty": 0, "logitBias": {},
                   "maxNewTokens": 32} | rules
        logits = (rng.standard_normal(40) * 4).astype(np.float32)
        cases.append((options, context, generated, logits.tolist(), lead, [2, 30]))
    # the token after a forced bos: begin_suppress_tokens apply to it (transformers' begin index)
    cases.append(({"repetitionPenalty": 1, "presencePenalty": 0, "frequencyPenalty": 0, "logitBias": {},
                   "maxNewTokens": 32, "forcedBosTokenId": 11, "beginSuppressTokens": [3, 4]}, [], [11],
                  (rng.standard_normal(40) * 4).astype(np.float32).tolist(), [7], [2]))
    draws = []
    for seed, (t, k, p, m) in enumerate([(1.0, 0, 1.0, 0.2), (1.5, 30, 0.9, 0.25), (0.8, 0, 0.95, 0.5)]):
        logits = (rng.standard_normal(200) * 2).astype(np.float32)
        draws.append(({"doSample": True, "temperature": t, "topK": k, "topP": p, "minP": m}, seed, logits.tolist()))
    # transformers' typical, epsilon and eta sampling after them
    for seed, cut in enumerate([{"typicalP": 0.5}, {"epsilonCutoff": 0.01}, {"etaCutoff": 0.02},
                                {"typicalP": 0.8, "epsilonCutoff": 0.004, "etaCutoff": 0.002, "minP": 0.05}], start=10):
        logits = (rng.standard_normal(200) * 2).astype(np.float32)
        draws.append(({"doSample": True, "temperature": 1.0, "topK": 0, "topP": 1.0, "minP": 0} | cut, seed,
                      logits.tolist()))
    driver.get(url)
    got = driver.execute_async_script(JS_PENALTIES, cases, draws)
    assert "error" not in got, got
    for (o, seed, logits), js in zip(draws, got["picked"]):
        options = SearchOptions(do_sample=True, temperature=o["temperature"], top_k=o["topK"], top_p=o["topP"],
                                min_p=o["minP"], typical_p=o.get("typicalP", 1.0),
                                epsilon_cutoff=o.get("epsilonCutoff", 0.0), eta_cutoff=o.get("etaCutoff", 0.0))
        python_rng = np.random.default_rng(seed)
        want = [int(pick_tokens(np.array([logits], np.float32), options, python_rng)[0]) for _ in range(40)]
        assert js == want, o
        plain = SearchOptions(do_sample=True, temperature=o["temperature"], top_k=o["topK"], top_p=o["topP"])
        plain_rng = np.random.default_rng(seed)
        assert want != [int(pick_tokens(np.array([logits], np.float32), plain, plain_rng)[0]) for _ in range(40)]
    names = {"noRepeatNgramSize": "no_repeat_ngram_size", "badWordsIds": "bad_words_ids",
             "suppressTokens": "suppress_tokens", "minLength": "min_length", "sequenceBias": "sequence_bias",
             "beginSuppressTokens": "begin_suppress_tokens", "forcedEosTokenId": "forced_eos_token_id",
             "forcedBosTokenId": "forced_bos_token_id", "minNewTokens": "min_new_tokens", "maxNewTokens": "max_new_tokens"}
    for (options, context, generated, logits, lead, eos), js in zip(cases, got["scores"]):
        search = SearchOptions(repetition_penalty=options["repetitionPenalty"],
                               presence_penalty=options["presencePenalty"],
                               frequency_penalty=options["frequencyPenalty"],
                               logit_bias={int(t): b for t, b in options["logitBias"].items()},
                               **{py: options[js_name] for js_name, py in names.items() if js_name in options})
        seen = Seen(search, lead + context, eos=eos)
        for t in generated:
            seen.add(t)
        want = seen.apply(np.array(logits, np.float32))
        assert js["wanted"] == (options not in ({"repetitionPenalty": 1, "presencePenalty": 0, "frequencyPenalty": 0,
                                                 "logitBias": {}},))
        assert np.array_equal(np.array(js["scores"], np.float32), want), options  # ("-inf" reads as -inf)
        assert js["wanted"] == (not np.array_equal(want, np.array(logits, np.float32)))  # each case does something
        # and in float64, on beam search's log-probabilities (a copied history: a beam that splits)
        logp = np.array(logits, np.float32).astype(np.float64) / 3 - 1.25
        assert np.array_equal(np.array(js["wide"], np.float64), seen.copy().apply(logp)), options


JS_STREAM = """
const [hfJson, ids, done] = arguments;
(async () => {
  const tk = await import("./tokenizers.mjs");
  const { Tokenizer } = await import("./vendor/tokenizers.min.mjs");
  const hf = new tk.HFTokenizer(Tokenizer, JSON.parse(hfJson), { eos_id: 0 });
  let decoded = 0;  // ids the stream asks to decode
  const counting = { decode: (x, o) => { decoded += x.length; return hf.decode(x, o); } };
  const s = new tk.TextStream(counting);
  // an answer that is empty, or starts at eos: "" (tokenizers.js itself throws on no ids)
  const empty = [hf.decode([]), hf.decode([0, ...ids.slice(0, 5)]), new tk.TextStream(hf).push(0)];
  return { pieces: ids.map((i) => s.push(i)), decoded, empty };
})().then(done, (e) => done({ error: String(e) }));
"""


def test_the_pages_text_stream_gives_pythons_pieces_in_linear_decodes(page, tmp_path):
    """A Hugging Face tokenizer's text stream in the page: the same pieces as the Python
    runtime's `TextStream` (itself checked against whole decodes) on a long generation, bytes
    that never make a character included, and decodes linear in its length (before, every
    token decoded the whole sequence again: ~n^2 / 2 ids); an empty answer decodes to "" (it
    threw: tokenizers.js refuses an empty list)."""
    from seqexport.runtime.tokenizer import HFTokenizer, TextStream

    url, driver, _ = page
    hf = byte_level_bpe()
    hf.save(str(tmp_path / "tokenizer.json"))
    ours = HFTokenizer(tmp_path / "tokenizer.json", eos_id=0)
    lone = hf.token_to_id("Ã")  # byte 0xC3 on its own: the lead of a character that never comes
    assert lone is not None
    ids = [i for t in TEXTS * 40 for i in hf.encode(t).ids] + [lone] * 30 + hf.encode(TEXTS[0]).ids
    stream = TextStream(ours)
    want = [stream.push(i) for i in ids]
    driver.get(url)
    got = driver.execute_async_script(JS_STREAM, hf.to_str(), ids)
    assert "error" not in got, got
    assert got["pieces"] == want
    assert "".join(want) == ours.decode(ids, stop_at_eos=False) and "\ufffd" * 30 in "".join(want)
    assert got["decoded"] < 20 * len(ids), (got["decoded"], len(ids))
    assert got["empty"] == [ours.decode([]), ours.decode([0, *ids[:5]]), TextStream(ours).push(0)] == ["", "", ""]


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('role ' + m['role'] + ' is not one of system, user, assistant') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

JS_CHAT = """
const [templates, conversationsJson, bad, hfJson, done] = arguments;
const conversations = JSON.parse(conversationsJson);  // (as JSON: WebDriver would sort each object's keys)
(async () => {
  const tk = await import("./tokenizers.mjs");
  const { Template } = await import("./vendor/jinja.mjs");
  const { Tokenizer } = await import("./vendor/tokenizers.min.mjs");
  const hf = new tk.HFTokenizer(Tokenizer, JSON.parse(hfJson), { eos_id: 0 });
  const tokens = { bos_token: "<|endoftext|>", eos_token: "<|endoftext|>" };
  const said = (f) => { try { f(); return null; } catch (e) { return e.message; } };
  const out = {};
  for (const [name, source] of Object.entries(templates)) {
    const chat = new tk.ChatTemplate(Template, source, tokens);
    out[name] = conversations.map((c) => [true, false].map((g) => {
      const text = chat.render(c, { addGenerationPrompt: g });
      return { text, ids: hf.encode(text, { special: false }) };
    }));
  }
  const chatml = new tk.ChatTemplate(Template, templates.chatml, tokens);
  return { out, refusals: bad.map((m) => said(() => chatml.render(m))) };
})().then(done, (e) => done({ error: String(e) }));
"""


def test_the_pages_chat_template_renders_as_the_python_runtime_and_transformers(page, tmp_path):
    """@huggingface/jinja in the page renders the chat templates of tests/test_serve_chat.py (each
    checked there against transformers' apply_chat_template) to the same text and ids as the
    Python runtime, and refuses the same conversations with the same messages."""
    from tokenizers import processors

    from seqexport.runtime.chat import ChatTemplate
    from seqexport.runtime.tokenizer import HFTokenizer
    from tests.test_serve_chat import BOS, CONVERSATION, TEMPLATES

    url, driver, _ = page
    tok = byte_level_bpe()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    tok.save(str(tmp_path / "tokenizer.json"))
    ours = HFTokenizer(tmp_path / "tokenizer.json")
    conversations = [CONVERSATION, CONVERSATION[1:2],
                     [{"role": "user", "content": [{"type": "text", "text": "5 May"}, {"type": "text", "text": "21"}]}]]
    bad = [[], [{"content": "hi"}], [{"role": "user", "content": 3}],
           [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
           [{"role": "tool", "content": "x"}]]
    driver.get(url)
    got = driver.execute_async_script(JS_CHAT, TEMPLATES, json.dumps(conversations), bad, tok.to_str())
    assert "error" not in got, got
    special = {"bos_token": BOS, "eos_token": BOS}
    for name, source in TEMPLATES.items():
        chat = ChatTemplate(source, special, where=name)
        for c, pair in zip(conversations, got["out"][name]):
            for g, js in zip((True, False), pair):
                text = chat.render(c, add_generation_prompt=g)
                assert js == {"text": text, "ids": ours.encode(text, special=False)}, (name, c, g)
    chatml = ChatTemplate(TEMPLATES["chatml"], special, where="chatml")
    for m, js in zip(bad, got["refusals"]):
        with pytest.raises(InputError) as caught:
            chatml.render(m)
        assert js == str(caught.value)


def test_site_build_refuses_bad_input_and_writes_nothing_half(site, tmp_path):
    _, exports = site
    some = next(iter(exports.values()))
    run = lambda *args: CliRunner().invoke(cli, ["web", *map(str, args)])  # noqa: E731

    result = run(tmp_path, "--out", tmp_path / "s1")  # not an export
    assert result.exit_code == 2 and "manifest.json" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "s1").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    result = run(some, "--out", tmp_path / "full")
    assert result.exit_code == 2 and "--overwrite" in result.output
    result = run(some, "--out", tmp_path / "full", "--overwrite")  # not a site: never replaced
    assert result.exit_code == 2 and (tmp_path / "full" / "keep.txt").read_text() == "mine"
    result = run(some, "--out", some)
    assert result.exit_code == 2 and "replace it" in result.output

    altered = tmp_path / "altered"
    browser.copy_site(some, altered)
    graph = altered / json.loads((altered / "manifest.json").read_text())["graphs"][next(iter(
        json.loads((altered / "manifest.json").read_text())["graphs"]))]["file"]
    data = graph.read_bytes()
    graph.unlink()
    graph.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    result = run(altered, "--out", tmp_path / "s2")
    assert result.exit_code == 2 and "altered" in result.output and not (tmp_path / "s2").exists()

    # an example the page would refuse when clicked (empty, or past the prompt limit) is refused here
    model = rt.load(some, provider="cpu")
    long = "5 March 2021 " * 4
    n = len(model.encode(long))
    for example, message in ((" ", "--example #2 is empty"),
                             (long, f"--example #2 {long!r} is {n} tokens for {some.name}; its page takes at most {n - 1}")):
        result = run(some, "--out", tmp_path / "s3", "--max-prompt-tokens", n - 1, "--example", "5 March 2021",
                     "--example", example)
        assert result.exit_code == 2 and message in result.output, result.output
        assert not (tmp_path / "s3").exists()
    result = run(some, "--out", tmp_path / "s3", "--max-prompt-tokens", n, "--example", long, "--no-webgpu")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "s3" / "site.json").read_text())["models"][0]["examples"] == [long]

    (tmp_path / "empty").mkdir()  # an empty folder is written into; a site is replaced with --overwrite
    result = run(some, "--out", tmp_path / "empty", "--no-webgpu")
    assert result.exit_code == 0, result.output
    assert "python -m http.server -d" in result.output
    assert not (tmp_path / "empty" / "ort" / "ort.webgpu.min.mjs").exists()
    result = run(some, "--out", tmp_path / "empty", "--overwrite")
    assert result.exit_code == 0 and (tmp_path / "empty" / "ort" / "ort.webgpu.min.mjs").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary folder left


def test_a_prompt_the_site_lets_through_is_one_the_python_runtime_takes(site):
    """site.json's prompt bound: a prompt of exactly `max_prompt_tokens` ids runs in the Python
    runtime (a positional table bounds it below the page's default), one more does not where the
    model has such a table."""
    _, exports = site
    for family, folder in exports.items():
        record = site_record(site, family)
        model = rt.load(folder, provider="cpu")
        n = record["max_prompt_tokens"]
        assert 1 <= n <= MAX_PROMPT_TOKENS
        assert len(rt.generate(model, [[5] * n], rt.SearchOptions(max_new_tokens=1))[0]) <= 1
        if record["max_new_tokens_limit"]:
            with pytest.raises(InputError):
                rt.generate(model, [[5] * (n + 1)], rt.SearchOptions(max_new_tokens=1))


def _falcon_h1(transformers, vocab: int):
    return transformers.FalconH1ForCausalLM(transformers.FalconH1Config(
        hidden_size=64, num_hidden_layers=2, vocab_size=vocab, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, mamba_d_ssm=96, mamba_n_heads=6, mamba_d_head=16,
        mamba_n_groups=2, mamba_d_state=16, mamba_chunk_size=16, embedding_multiplier=3.0, lm_head_multiplier=0.4,
        key_multiplier=0.6, ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.6], mlp_multipliers=[1.4, 0.6],
        eos_token_id=None, pad_token_id=0))


def _lfm2(transformers, vocab: int):
    return transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
        hidden_size=64, num_hidden_layers=3, vocab_size=vocab, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, layer_types=["conv", "full_attention", "conv"], conv_bias=True,
        block_auto_adjust_ff_dim=False, tie_word_embeddings=False, eos_token_id=None, pad_token_id=0))


def _jamba(transformers, vocab: int):
    return transformers.JambaForCausalLM(transformers.JambaConfig(
        hidden_size=64, num_hidden_layers=3, vocab_size=vocab, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, attn_layer_period=3, attn_layer_offset=1, num_experts=1, mamba_d_state=8,
        mamba_dt_rank=6, eos_token_id=None, pad_token_id=0))


def _qwen3_5(transformers, vocab: int):
    return transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(
        hidden_size=64, num_hidden_layers=3, vocab_size=vocab, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, layer_types=["linear_attention", "full_attention", "linear_attention"],
        eos_token_id=None, pad_token_id=0))


def _olmo_hybrid(transformers, vocab: int):
    return transformers.OlmoHybridForCausalLM(transformers.OlmoHybridConfig(
        hidden_size=64, num_hidden_layers=3, vocab_size=vocab, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, layer_types=["linear_attention", "full_attention", "linear_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": None}, eos_token_id=None, pad_token_id=0))


def _lfm3(transformers, vocab: int):
    return transformers.Lfm3ForCausalLM(transformers.Lfm3Config(
        hidden_size=64, num_hidden_layers=4, vocab_size=vocab, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=4,
        layer_types=["conv", "sliding_attention", "conv", "full_attention"], eos_token_id=None, pad_token_id=0,
        bos_token_id=None))


def _zamba2(transformers, vocab: int):
    return transformers.Zamba2ForCausalLM(transformers.Zamba2Config(  # (_randomize ties the block's two calls)
        hidden_size=64, num_hidden_layers=3, vocab_size=vocab, intermediate_size=96, num_attention_heads=4,
        layers_block_type=["hybrid", "mamba", "hybrid"], n_mamba_heads=8, mamba_d_state=16, chunk_size=16,
        adapter_rank=4, use_shared_attention_adapter=True, eos_token_id=None, pad_token_id=0, bos_token_id=None))


def _kimi_linear(transformers, vocab: int):
    return transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(
        hidden_size=64, num_hidden_layers=3, vocab_size=vocab, intermediate_size=96, moe_intermediate_size=32,
        num_attention_heads=4, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
        num_local_experts=4, num_experts_per_tok=2, linear_num_heads=4, linear_head_dim=16,
        layer_types=["linear_attention", "full_attention", "linear_attention"], eos_token_id=None, pad_token_id=0,
        bos_token_id=None))


def _ling3(transformers, vocab: int):
    return transformers.BailingHybridForCausalLM(transformers.BailingHybridConfig(
        hidden_size=64, num_hidden_layers=3, vocab_size=vocab, intermediate_size=96, moe_intermediate_size=32,
        num_attention_heads=4, head_dim=16, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
        num_local_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, layer_group_size=2,
        first_k_dense_replace=1, eos_token_id=None, pad_token_id=0, bos_token_id=None))


@pytest.mark.parametrize("name", ["falcon_h1", "lfm2", "jamba", "qwen3_5", "olmo_hybrid", "lfm3", "zamba2",
                                  "kimi_linear", "ling3"])
def test_a_transformers_hybrid_decodes_in_the_page_as_transformers(tmp_path, name):
    """Falcon-H1 (attention beside a Mamba-2 mixer in every layer, so each layer's state has both
    kinds; μP multipliers), LFM2 (short convolutions beside attention with per-head q/k norms),
    Jamba (Mamba-1 mixers, their scan one ONNX Scan, beside attention) and Qwen3.5 (Gated
    DeltaNets, their delta rule chunked under one ONNX Scan, beside gated attention) and
    OLMo-hybrid (reflecting DeltaNets beside post-norm attention without positions) and LFM3
    (a 4-position sliding window beside full attention) and Zamba2 (a shared attention block
    called by two layers, each with its own adapters and cache) and Kimi-Linear (KDA beside
    latent attention, whose cache holds latents; experts) and Ling 3 (the same with RoPE on the
    latent attention's shared key parts): the page's greedy tokens are transformers' own
    `generate`'s."""
    import torch
    import transformers

    from tests.test_hybrid_model import _randomize

    need_page()
    tok = byte_level_bpe()
    torch.manual_seed(0)
    cases = {"falcon_h1": _falcon_h1, "lfm2": _lfm2, "jamba": _jamba, "qwen3_5": _qwen3_5,
             "olmo_hybrid": _olmo_hybrid, "lfm3": _lfm3, "zamba2": _zamba2, "kimi_linear": _kimi_linear,
             "ling3": _ling3}
    hf = _randomize(cases[name](transformers, tok.get_vocab_size()), 0)
    hf.save_pretrained(tmp_path / "ckpt")
    tok.save(str(tmp_path / "ckpt" / "tokenizer.json"))
    runner, prompt = CliRunner(), "Friday, 5 March 2021"
    result = runner.invoke(cli, ["export", "hybrid", "--checkpoint", str(tmp_path / "ckpt"), "--out",
                                 str(tmp_path / name)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["web", str(tmp_path / name), "--out", str(tmp_path / "site")])
    assert result.exit_code == 0, result.output
    ids = rt.load(tmp_path / name, provider="cpu").encode(prompt)
    with torch.no_grad():
        want = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
    assert len(set(want)) > 3
    with browser.serve(tmp_path / "site") as url, browser.chromium() as driver:
        assert browser.open_page(driver, url, name) == "ready"
        got = browser.run_prompt(driver, prompt, maxNewTokens=12)
        assert got["message"] is None and got["run"]["tokens"] == want
