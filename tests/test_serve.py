"""`seqexport serve --no-ray` as a real server on 127.0.0.1 (a subprocess started and stopped
here) with real clients: the `openai` package and plain HTTP for server-sent events. The
reference is generate() on each prompt alone, in this process."""

import json
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import openai
import pytest
import requests

import seqexport.runtime as rt
from seqexport.runtime.tokenizer import encode_prompt
from seqexport.serve.process import ServerProcess
from seqexport.training.dates import make_split
from tests import raw_http

MAX_PROMPT = 64


@pytest.fixture(scope="module")
def dates(bundled_exports):
    folder = bundled_exports("mamba")[1]
    return folder, rt.load(folder, provider="cpu", threads=1)


@contextmanager
def plain_server(folder, tmp_path_factory, *args):
    """`seqexport serve --no-ray` on `folder` (one thread, `args` more), its log kept: alive at
    the end, and nothing it started outlives it."""
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with ServerProcess(folder, "--no-ray", "--threads", "1", *args, log=log) as s:
        yield s
        assert s.proc.poll() is None, log.read_text()[-2000:]
    assert not s.session_pids()


@pytest.fixture(scope="module")
def server(dates, tmp_path_factory):
    with plain_server(dates[0], tmp_path_factory, "--max-rows", "8", "--max-prompt-tokens", str(MAX_PROMPT)) as s:
        yield s


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def reference(model, ids, max_tokens, ignore_eos=False, seed=None, temperature=0.0):
    options = rt.SearchOptions(max_new_tokens=max_tokens, eos_id=-1 if ignore_eos else None,
                               do_sample=temperature > 0, seed=seed, temperature=temperature or 1.0)
    return rt.generate(model, [ids], options)[0]


def cases(model, n=32):
    """Mixed requests: text and id prompts of different lengths, different max_tokens, some
    running past eos, some sampled with a seed."""
    record = model.manifest["tokenizer"]
    texts = [x for x, _ in make_split("test", n, seed=2)]
    out = []
    for i, text in enumerate(texts):
        ids = encode_prompt(model.tokenizer, model.prompt_frame, text, record)
        out.append({"text": text, "ids": ids, "prompt": text if i % 2 else ids, "max_tokens": 2 + (5 * i) % 23,
                    "ignore_eos": i % 3 == 0, "seed": 1000 + i if i % 4 == 1 else None,
                    "temperature": 0.8 if i % 4 == 1 else 0.0})
    return out


def test_openai_client_32_concurrent_requests_get_their_generate_tokens(server, dates):
    _, model = dates
    todo = cases(model)
    c = client(server)

    def call(case):
        return c.completions.create(model=model.folder.name, prompt=case["prompt"], max_tokens=case["max_tokens"],
                                    temperature=case["temperature"], seed=case["seed"],
                                    extra_body={"ignore_eos": case["ignore_eos"]})

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(call, todo))
    for case, answer in zip(todo, answers):
        expect = reference(model, case["ids"], case["max_tokens"], case["ignore_eos"], case["seed"], case["temperature"])
        choice = answer.choices[0]
        assert choice.model_extra["token_ids"] == expect, case
        assert choice.text == model.tokenizer.decode(expect, stop_at_eos=False)
        assert choice.finish_reason == ("length" if len(expect) == case["max_tokens"] else "stop")
        assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (len(case["ids"]), len(expect))
    greedy_dates = [a.choices[0].text for c_, a in zip(todo, answers)
                    if not c_["ignore_eos"] and c_["temperature"] == 0 and c_["max_tokens"] >= 11]
    assert greedy_dates and all(len(t) == 10 and t[4] == t[7] == "-" for t in greedy_dates)
    assert [m.id for m in c.models.list().data] == [model.folder.name]
    metrics = requests.get(server.url + "/metrics", timeout=10).text
    count = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line and line[0] != "#"}
    assert count["seqexport_time_to_first_token_seconds_count"] >= 32
    assert count["seqexport_generated_tokens_total"] >= sum(len(a.choices[0].model_extra["token_ids"]) for a in answers)
    assert "seqexport_queue_length" in count and "seqexport_active_rows" in count


def sse_events(response) -> list:
    events = []
    for line in response.iter_lines(decode_unicode=True):
        if line:
            assert line.startswith("data: "), line
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_streaming_gives_the_same_text_over_plain_http_and_the_openai_client(server, dates):
    _, model = dates
    todo = cases(model, 8)

    def stream(case):
        body = {k: case[k] for k in ("prompt", "max_tokens", "temperature", "seed", "ignore_eos")}
        with requests.post(server.url + "/v1/completions", json={**body, "stream": True,
                           "stream_options": {"include_usage": True}}, stream=True, timeout=60) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            return sse_events(r)

    with ThreadPoolExecutor(8) as pool:
        streams = list(pool.map(stream, todo))
    for case, events in zip(todo, streams):
        expect = reference(model, case["ids"], case["max_tokens"], case["ignore_eos"], case["seed"], case["temperature"])
        assert events[-1] == "[DONE]"
        usage = events[-2]["usage"]
        chunks = [e["choices"][0] for e in events[:-2]]
        assert [t for ch in chunks for t in ch["token_ids"]] == expect
        assert "".join(ch["text"] for ch in chunks) == model.tokenizer.decode(expect, stop_at_eos=False)
        assert chunks[-1]["finish_reason"] in ("stop", "length") and all(ch["finish_reason"] is None for ch in chunks[:-1])
        assert usage["completion_tokens"] == len(expect) and usage["prompt_tokens"] == len(case["ids"])
    text = "".join(ch.choices[0].text for ch in client(server).completions.create(
        model=model.folder.name, prompt="Friday, March 5th 2021", max_tokens=16, temperature=0, stream=True))
    assert text == "2021-03-05"


def test_stop_strings_end_the_text_before_them(server, dates):
    _, model = dates
    c = client(server)
    answer = c.completions.create(model=model.folder.name, prompt="Friday, March 5th 2021", max_tokens=16, temperature=0, stop=["-0"])
    assert answer.choices[0].text == "2021" and answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].model_extra["token_ids"] == model.tokenizer.encode("2021-0")  # up to the stop
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=model.folder.name, prompt="Friday, March 5th 2021", max_tokens=16, temperature=0, stop=["3-", "xyz"], stream=True))
    assert streamed == "2021-0"


@pytest.mark.parametrize("stop", ["2", "2021", "2021-03-05"])
def test_a_stop_string_that_is_the_first_thing_generated_gives_empty_text(server, dates, stop):
    """The answer would begin "2021-03-05": stopped at once, nothing of the stop string sent,
    streamed or not; the tokens are those up to the stop, as with any stop string."""
    _, model = dates
    body = {"prompt": "Friday, March 5th 2021", "max_tokens": 16, "temperature": 0, "stop": [stop, "xyz"]}
    r = requests.post(server.url + "/v1/completions", json=body, timeout=30)
    choice = r.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("", "stop"), choice
    assert choice["token_ids"] == model.tokenizer.encode(stop)
    with requests.post(server.url + "/v1/completions", json={**body, "stream": True}, stream=True, timeout=30) as r:
        events = sse_events(r)
    chunks = [e["choices"][0] for e in events[:-1]]
    assert events[-1] == "[DONE]" and chunks[-1]["finish_reason"] == "stop"
    assert [ch["text"] for ch in chunks] == [""] * len(chunks)


BAD = [
    (b"{not json", 400, None, "not valid JSON"),
    (b"[1, 2]", 400, None, "expected a JSON object"),
    ({"max_tokens": 4}, 400, "prompt", "missing"),
    ({"prompt": "5 May", "max_tokens": "ten"}, 400, "max_tokens", 'got "ten"'),
    ({"prompt": "5 May", "max_tokens": 0}, 400, "max_tokens", ">= 1"),
    ({"prompt": "5 May", "max_tokens": 2.5}, 400, "max_tokens", "integer"),
    ({"prompt": "5 May", "temperature": "hot"}, 400, "temperature", "number"),
    ({"prompt": "5 May", "temperature": -0.5}, 400, "temperature", ">= 0"),
    ({"prompt": "5 May", "top_p": 0}, 400, "top_p", "(0, 1]"),
    ({"prompt": "5 May", "top_p": 1.5}, 400, "top_p", "(0, 1]"),
    ({"prompt": "5 May", "top_k": True}, 400, "top_k", "integer"),
    ({"prompt": "5 May", "seed": -1}, 400, "seed", ">= 0"),
    ({"prompt": "5 May", "stream": "yes"}, 400, "stream", "true or false"),
    ({"prompt": "5 May", "stop": 7}, 400, "stop", "string"),
    ({"prompt": "5 May", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
    ({"prompt": "5 May", "stop": ["a", "x" * 4097]}, 400, "stop", "element 1: 4097 characters; a stop string has at most 4096"),
    ({"prompt": "5 May", "n": 3}, 400, "n", "not supported"),
    ({"prompt": "5 May", "logprobs": 2}, 400, "logprobs", "not supported"),
    ({"prompt": "5 May", "colour": "red"}, 400, "colour", "unknown field"),
    ({"prompt": {"text": "5 May"}}, 400, "prompt", "string or a list of token ids"),
    ({"prompt": ""}, 400, "prompt", "empty"),
    ({"prompt": [5, -1]}, 400, "prompt", "element 1"),
    ({"prompt": ["5 May", "6 May"]}, 400, "prompt", "several prompts"),
    ({"prompt": [3] * (MAX_PROMPT + 1)}, 400, "prompt", f"prompt: {MAX_PROMPT + 1} tokens exceeds the limit of {MAX_PROMPT}"),
    ({"prompt": [5, 100000]}, 400, "prompt", "100000"),  # the model has no such token
    ({"prompt": "5 May", "model": "gpt-4"}, 404, "model", "not served here"),
    ({"prompt": "5 May", "stream": False, "stream_options": {"include_usage": True}}, 400, "stream_options", "stream"),
]


@pytest.mark.parametrize("body,status,param,words", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_requests_get_4xx_json_naming_the_field(server, body, status, param, words):
    bodies = [body if isinstance(body, bytes) else json.dumps(body).encode()]
    if isinstance(body, dict) and "stream" not in body:
        bodies.append(json.dumps({**body, "stream": True}).encode())  # refused before any stream starts
    for data in bodies:
        r = requests.post(server.url + "/v1/completions", data=data, headers={"Content-Type": "application/json"},
                          timeout=30)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["param"] == param and words in error["message"], error
        assert f"{param}: {param}:" not in error["message"], error  # the field named once


def test_the_openai_client_sees_a_clear_error(server, dates):
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client(server).completions.create(model=dates[1].folder.name, prompt="5 May", max_tokens=-3)


def test_a_route_or_method_not_served_is_an_openai_style_error_naming_what_is(server, dates):
    """The OpenAI client's chat call (what most code tries first) on a model with no chat template
    (the bundled ones: a byte tokenizer), and routes and methods not served: 400 / 404 / 405 with
    the JSON error every other answer has, naming what is (it was FastAPI's bare {"detail": "Not
    Found"}), 405 with its Allow header."""
    with pytest.raises(openai.BadRequestError) as caught:
        client(server).chat.completions.create(model=dates[1].folder.name, messages=[{"role": "user", "content": "5 May"}])
    assert "this model has no chat template" in str(caught.value) and "POST a prompt to /v1/completions" in str(caught.value)
    assert caught.value.body["param"] == "messages"
    routes = "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics"
    for method, path, status, allow in (("GET", "/v1/completions", 405, "POST"), ("POST", "/health", 405, "GET"),
                                        ("GET", "/v1/nothing", 404, None), ("DELETE", "/v1/models", 405, "GET")):
        r = requests.request(method, server.url + path, timeout=30)
        error = r.json()["error"]
        assert r.status_code == status and error["code"] == status, r.text
        assert error["message"].startswith(f"{method} {path}: ") and error["message"].endswith(routes)
        assert r.headers.get("allow") == allow
    metrics = requests.get(server.url + "/metrics", timeout=30).text  # counted as refused
    assert re.search(r'^seqexport_rejected_requests_total\{status="405"\} [1-9]', metrics, re.M), metrics


def wait_idle(server, seconds=10.0) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        h = requests.get(server.url + "/health", timeout=5).json()
        if h["active_rows"] == 0 and h["queue_length"] == 0 or time.monotonic() > deadline:
            return h


def test_client_disconnect_frees_its_row(server):
    long = {"prompt": "5 May", "max_tokens": 10**6, "temperature": 0, "ignore_eos": True}
    with requests.post(server.url + "/v1/completions", json={**long, "stream": True}, stream=True, timeout=30) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line).startswith(b"data: ")
        assert requests.get(server.url + "/health", timeout=5).json()["active_rows"] == 1
    assert wait_idle(server)["active_rows"] == 0  # the stream's reader went away
    with socket.create_connection(("127.0.0.1", server.port)) as s:  # a non-streaming caller hangs up
        body = json.dumps(long).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.5)
        assert requests.get(server.url + "/health", timeout=5).json()["active_rows"] == 1
    assert wait_idle(server)["active_rows"] == 0


def test_oversized_requests_are_refused_as_they_arrive(server):
    raw_http.oversized_requests_are_refused_as_they_arrive(server.port, server.proc.pid, MAX_PROMPT)
    # requests pipelined on one connection are answered, in order
    prompts = [p for p, _ in make_split("test", 40, seed=3)]
    answers = raw_http.pipelined(server.port, prompts)
    assert [s for s, _ in answers] == [200] * len(prompts)
    one = {p: requests.post(server.url + "/v1/completions", json={"prompt": p, "max_tokens": 4, "temperature": 0},
                            timeout=30).json()["choices"][0]["text"] for p in prompts[:5]}
    assert [b["choices"][0]["text"] for _, b in answers[:5]] == [one[p] for p in prompts[:5]]


def test_full_queue_is_503_with_retry_after_and_a_slow_request_times_out(dates, tmp_path):
    with ServerProcess(dates[0], "--no-ray", "--threads", "1", "--max-rows", "1", "--max-queue", "1",
                       "--timeout", "1.5", log=tmp_path / "log") as s:
        long = {"prompt": "5 May", "max_tokens": 10**6, "temperature": 0, "ignore_eos": True}
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(requests.post, s.url + "/v1/completions", json=long, timeout=30)
            deadline = time.monotonic() + 10
            while requests.get(s.url + "/health", timeout=5).json()["active_rows"] == 0:
                assert time.monotonic() < deadline
            second = pool.submit(requests.post, s.url + "/v1/completions", json=long, timeout=30)
            while requests.get(s.url + "/health", timeout=5).json()["queue_length"] == 0:
                assert time.monotonic() < deadline
            third = requests.post(s.url + "/v1/completions", json=long, timeout=30)
            assert third.status_code == 503 and third.headers["Retry-After"] == "1"
            assert "busy" in third.json()["error"]["message"]
            for r in (first.result(), second.result()):
                assert r.status_code == 504 and "timed out after 1.5 s" in r.json()["error"]["message"]


def test_transformer_rows_at_different_positions_share_the_server(bundled_exports, tmp_path):
    """The bundled transformer: sources of different lengths, rows joining mid-decode; each
    answer is generate()'s; a source longer than its positional table is a 400."""
    folder = bundled_exports("transformer")[1]
    model = rt.load(folder, provider="cpu", threads=1)
    todo = [{**case, "seed": None, "temperature": 0.0, "max_tokens": min(case["max_tokens"], 40)}
            for case in cases(model, 32)]
    with ServerProcess(folder, "--no-ray", "--threads", "1", "--max-rows", "8", log=tmp_path / "log") as s:
        c = client(s)
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(lambda case: c.completions.create(
                model=folder.name, prompt=case["prompt"], max_tokens=case["max_tokens"], temperature=0,
                extra_body={"ignore_eos": case["ignore_eos"]}), todo))
        for case, answer in zip(todo, answers):
            expect = reference(model, case["ids"], case["max_tokens"], case["ignore_eos"])
            assert answer.choices[0].model_extra["token_ids"] == expect, case
        limit = model.config["max_len"]
        r = requests.post(s.url + "/v1/completions", json={"prompt": "5" * (limit + 5), "max_tokens": 4}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
        assert str(limit) in r.json()["error"]["message"]
        r = requests.post(s.url + "/v1/completions", json={"prompt": "5 May", "max_tokens": limit + 1}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


def test_hybrid_rows_joining_and_leaving_get_their_generate_tokens(bundled_exports, tmp_path):
    """The bundled hybrid (an appended KV cache in its attention layer, replaced conv/SSM state in
    its Mamba-2 layers): 32 concurrent mixed requests, greedy and seeded, rows joining and leaving
    a batch of 8 at different positions; each answer is generate()'s for its prompt alone."""
    folder = bundled_exports("hybrid")[1]
    model = rt.load(folder, provider="cpu", threads=1)
    todo = cases(model, 32)
    with ServerProcess(folder, "--no-ray", "--threads", "1", "--max-rows", "8", log=tmp_path / "log") as s:
        c = client(s)
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(lambda case: c.completions.create(
                model=folder.name, prompt=case["prompt"], max_tokens=case["max_tokens"],
                temperature=case["temperature"], seed=case["seed"], extra_body={"ignore_eos": case["ignore_eos"]}),
                todo))
    for case, answer in zip(todo, answers):
        expect = reference(model, case["ids"], case["max_tokens"], case["ignore_eos"], case["seed"], case["temperature"])
        assert answer.choices[0].model_extra["token_ids"] == expect, case


@pytest.mark.parametrize("how", [["--no-ray"], []], ids=["no-ray", "ray"])
def test_a_port_in_use_or_a_host_that_does_not_resolve_is_one_line_exit_2_before_serving(dates, how):
    """Before: `--no-ray` printed "serving ... on" and then uvicorn's own log line, exit 3."""
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for host, why in (("127.0.0.1", "Address already in use"), ("no-such-host.invalid", "not known")):
            run = subprocess.run([sys.executable, "-m", "seqexport.cli", "serve", str(dates[0]), *how,
                                  "--host", host, "--port", str(port)], capture_output=True, text=True, timeout=120)
            assert run.returncode == 2, run.stderr
            assert run.stderr.startswith(f"error: --host {host} --port {port}: ") and why.lower() in run.stderr.lower(), run.stderr
            assert run.stderr.count("\n") == 1 and not run.stdout, run.stderr  # nothing said about serving
