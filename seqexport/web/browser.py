"""The site in a real browser: Debian's Chromium, headless, driven by Selenium through Debian's
chromedriver (nothing downloads a browser), the site served by `http.server` on 127.0.0.1.
Used by tests/test_web.py and `python -m seqexport.web.bench`.

    with serve(site) as url, chromium() as driver:
        open_page(driver, url, "mamba-dates")
        run = run_prompt(driver, "5 March 2021")   # {"tokens": [...], "text": ..., "ms": [...]}

Chromium resolves no host but 127.0.0.1 (`--host-resolver-rules`): a page that reached for a
CDN would fail to load, not fetch quietly.
"""

import contextlib
import functools
import http.server
import os
import shutil
import tempfile
import threading
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1100,900",
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
# what makes a page cross-origin isolated: WASM threads, and a clock finer than 0.1 ms
ISOLATED = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp"}
# WebGPU on SwiftShader's software Vulkan (Debian's chromium ships it): slow, but the WebGPU path runs
WEBGPU_FLAGS = ("--enable-unsafe-webgpu", "--use-webgpu-adapter=swiftshader", "--enable-features=Vulkan")


def browser_missing() -> str | None:
    """Why the browser cannot be driven here (None when it can)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} not found (apt-get install -y chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium; the dev extra has it)"
    return None


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve(folder, headers: dict | None = None):
    """An HTTP server for `folder` on 127.0.0.1 (a free port) in a thread; yields its URL.
    `headers`: sent with every response (e.g. COOP/COEP for WASM threads)."""

    class Handler(_Quiet):
        def end_headers(self):
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            super().end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def chromium(webgpu: bool = False):
    """Headless Chromium (a fresh profile) under Selenium; yields the driver."""
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must never download a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="seqexport-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + (WEBGPU_FLAGS if webgpu else ()) + (f"--user-data-dir={profile}",):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_script_timeout(600)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_state(driver, states=("ready", "load-error"), timeout: float = 120.0) -> str:
    """Wait until the page's <body data-state> is one of `states`; returns it."""
    return driver.execute_async_script(
        """const [states, timeout, done] = arguments; const t0 = Date.now();
        (function poll() {
          const s = document.body && document.body.dataset.state;
          if (states.includes(s) || Date.now() - t0 > timeout) done(s); else setTimeout(poll, 20);
        })();""", list(states), timeout * 1000)


def open_page(driver, url: str, model: str | None = None, backend: str = "auto", threads: int | None = None) -> str:
    """Open the site's page on `model` with `backend` (and WASM `threads`, on a cross-origin
    isolated server); returns the state it settles in."""
    query = f"?backend={backend}" + (f"&model={model}" if model else "") + (f"&threads={threads}" if threads else "")
    driver.get(url + query)
    return wait_state(driver)


RUN = """
const [prompt, options, done] = arguments;
const $ = (id) => document.getElementById(id);
const set = (id, v) => { $(id).value = String(v); $(id).dispatchEvent(new Event("input")); };
set("prompt", prompt);
if ("maxNewTokens" in options) set("max-new-tokens", options.maxNewTokens);
set("decoding", options.doSample ? "sample" : (options.numBeams ?? 1) > 1 ? "beam" : "greedy");
for (const [k, id] of [["temperature", "temperature"], ["topK", "top-k"], ["topP", "top-p"], ["seed", "seed"],
                       ["minP", "min-p"], ["repetitionPenalty", "repetition-penalty"], ["numBeams", "beams"],
                       ["lengthPenalty", "length-penalty"]])
  if (k in options) set(id, options[k]);
$("stop-at-eos").checked = options.stopAtEos ?? true;
$("chat").checked = options.chat ?? true;
$("generate").click();
if (options.stopAfterMs != null) setTimeout(() => $("stop").click(), options.stopAfterMs);
(function poll() {
  const s = document.body.dataset.state;
  if (s === "done" || s === "error") done({state: s, run: window.seqexportPage.lastRun,
                                          message: $("error").hidden ? null : $("error").textContent,
                                          stats: $("stats").textContent, output: $("output").textContent});
  else setTimeout(poll, 5);
})();
"""


def run_prompt(driver, prompt: str, **options) -> dict:
    """Type `prompt` into the page, press Generate, wait for the end; returns
    {state, run: {tokens, text, ms, backend, ...}, message, stats, output}. Options as the
    page's fields: maxNewTokens, doSample, temperature, topK, topP, minP, seed, repetitionPenalty, numBeams (> 1:
    beam search), lengthPenalty, stopAtEos, chat (a model
    with a chat template: the prompt as a user's message, the default), stopAfterMs (Stop pressed
    that long after Generate)."""
    return driver.execute_async_script(RUN, prompt, options)


def resource_origins(driver) -> set[str]:
    """The origins of every resource the page has loaded so far."""
    urls = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    return {u.split("/", 3)[2] if "://" in u else u for u in urls + [driver.current_url]}


def copy_site(site: Path, to: Path) -> Path:
    """A copy of a site (hard links where the file system allows: sites are large)."""
    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    shutil.copytree(site, to, copy_function=link)
    return to
