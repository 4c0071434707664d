"""`seqexport serve --allow-origin`: a web page on another origin may call the API (CORS), in a
real headless Chromium (its fetch, its preflight, its stream reader) and over raw HTTP. Before,
no answer carried CORS headers: a browser let only a page served by the same origin read them,
and a page elsewhere saw "Failed to fetch" whatever the server said."""

import json

import pytest
import requests

import seqexport.runtime as rt
from seqexport.serve.process import ServerProcess
from seqexport.web import browser
from tests.test_web import unavailable

PROMPT = "5 May 2021"


@pytest.fixture(scope="module")
def folder(bundled_exports):
    return bundled_exports("mamba")[1]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Two static pages on two origins (127.0.0.1, two ports): (allowed URL, other URL)."""
    site = tmp_path_factory.mktemp("pages")
    (site / "index.html").write_text("<!doctype html><title>a page elsewhere</title>")
    with browser.serve(site) as allowed, browser.serve(site) as other:
        yield allowed, other


@pytest.fixture(scope="module")
def server(folder, pages):
    allowed = pages[0].rstrip("/")
    with ServerProcess(folder, "--no-ray", "--threads", "1", "--allow-origin", allowed,
                       "--allow-origin", "https://app.example") as s:
        yield s


def completion(stream: bool, **extra) -> dict:
    return {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stream": stream, **extra}


def test_an_allowed_origin_gets_its_preflight_and_every_answer_readable(server, pages):
    origin = pages[0].rstrip("/")
    pre = requests.options(server.url + "/v1/completions", timeout=10, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == origin
    assert "POST" in pre.headers["access-control-allow-methods"]
    for body, status in ((completion(False), 200), (completion(True), 200), ({"prompt": PROMPT, "top_p": 2}, 400)):
        r = requests.post(server.url + "/v1/completions", json=body, headers={"Origin": origin}, timeout=30)
        assert r.status_code == status and r.headers["access-control-allow-origin"] == origin, r.text[:200]
    r = requests.get(server.url + "/v1/models", headers={"Origin": "https://app.example"}, timeout=10)
    assert r.headers["access-control-allow-origin"] == "https://app.example"


def test_another_origin_gets_no_cors_headers(server, folder):
    r = requests.post(server.url + "/v1/completions", json=completion(False), timeout=30,
                      headers={"Origin": "http://elsewhere.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    pre = requests.options(server.url + "/v1/completions", timeout=10, headers={
        "Origin": "http://elsewhere.example", "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 400 and "access-control-allow-origin" not in pre.headers


def test_without_allow_origin_no_answer_carries_cors_headers(folder):
    with ServerProcess(folder, "--no-ray", "--threads", "1") as s:
        r = requests.post(s.url + "/v1/completions", json=completion(False), timeout=30,
                          headers={"Origin": "http://127.0.0.1:1"})
        assert r.status_code == 200 and not any(k.startswith("access-control") for k in r.headers)


FETCH = """
const [url, body, done] = arguments;
fetch(url, {method: "POST", headers: {"content-type": "application/json"}, body: JSON.stringify(body)})
  .then(async (r) => {
    const reader = r.body.getReader(), decoder = new TextDecoder();
    let text = "";
    for (;;) { const {value, done: end} = await reader.read(); if (end) break; text += decoder.decode(value); }
    done({status: r.status, body: text, retryAfter: r.headers.get("retry-after")});
  })
  .catch((e) => done({error: String(e)}));
"""


def test_a_page_on_an_allowed_origin_streams_a_completion_in_chromium_and_one_elsewhere_cannot(server, pages,
                                                                                           folder):
    why = browser.browser_missing()
    if why:
        unavailable(why)
    model = rt.load(folder, provider="cpu", threads=1)
    want = rt.generate(model, [model.encode(PROMPT)], rt.SearchOptions(max_new_tokens=12))[0]
    allowed, other = pages
    with browser.chromium() as driver:
        driver.get(allowed)
        got = driver.execute_async_script(FETCH, server.url + "/v1/completions", completion(True))
        assert got.get("status") == 200, got
        events = [json.loads(line[6:]) for line in got["body"].split("\n") if line.startswith("data: {")]
        assert [t for e in events for t in e["choices"][0]["token_ids"]] == want
        assert got["body"].rstrip().endswith("data: [DONE]")
        bad = driver.execute_async_script(FETCH, server.url + "/v1/completions", {"prompt": PROMPT, "top_p": 2})
        assert bad.get("status") == 400 and "top_p" in json.loads(bad["body"])["error"]["message"], bad
        driver.get(other)  # not allowed: the browser keeps the answer from the page
        refused = driver.execute_async_script(FETCH, server.url + "/v1/completions", completion(False))
        assert "Failed to fetch" in refused.get("error", ""), refused


@pytest.mark.parametrize("origin", ["http://localhost:3000/", "localhost:3000", "http://a.example/app", "*.example"])
def test_an_origin_that_no_browser_sends_is_refused_by_name(folder, tmp_path, origin):
    """A browser's Origin is scheme://host[:port], nothing after: "http://localhost:3000/" would
    never match it, and every call from that page would fail with no word why."""
    from click.testing import CliRunner

    from seqexport.cli import cli

    config = tmp_path / "serve.yaml"  # (were it taken, --config-out writes its file and exits)
    result = CliRunner().invoke(cli, ["serve", str(folder), "--allow-origin", origin, "--config-out", str(config)])
    assert result.exit_code == 2, result.output
    assert f"--allow-origin {origin!r}: expected an origin, scheme://host[:port] with no path" in result.output
    assert not config.exists()


def test_the_embedded_defaults_front_answers_its_own_refusals_readably_to_an_allowed_page(server, pages, tmp_path):
    """The front (the embedded default's, here over the --no-ray replica) relays the replicas'
    answers with their CORS headers, and gives the ones it writes itself (a 413 by Content-Length,
    never relayed) the same header for an allowed Origin: a page saw those as a failed fetch."""
    from seqexport.serve.front import Front
    from seqexport.serve.process import free_port

    origin = pages[0].rstrip("/")
    registry = tmp_path / "replicas"
    registry.mkdir()
    (registry / str(server.proc.pid)).write_text(str(server.port))
    front = Front(registry, "127.0.0.1", free_port(), allow_origins=[origin, "https://app.example"]).start()
    try:
        url = f"http://127.0.0.1:{front.port}"
        r = requests.post(url + "/v1/completions", json=completion(False), headers={"Origin": origin}, timeout=30)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
        big = b"x" * (2 << 20)  # past the front's 1 MiB: refused by its Content-Length, by the front
        r = requests.post(url + "/v1/completions", data=big, timeout=30,
                          headers={"Origin": origin, "content-type": "application/json"})
        assert r.status_code == 413 and r.headers.get("access-control-allow-origin") == origin, r.headers
        r = requests.post(url + "/v1/completions", data=big, timeout=30,
                          headers={"Origin": "http://elsewhere.example", "content-type": "application/json"})
        assert r.status_code == 413 and "access-control-allow-origin" not in r.headers
    finally:
        front.close()
