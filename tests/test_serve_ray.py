"""`seqexport serve` as a Ray Serve deployment (a local Ray started by the server, stopped
with it): it listens on loopback only; two replicas answer with generate()'s tokens; one
replica's process is killed under load, Ray Serve restarts it, and no client sees a 500."""

import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import openai
import pytest
import requests
import yaml
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport.cli import cli
from seqexport.runtime.tokenizer import encode_prompt
from seqexport.serve.process import ServerProcess, free_port, reap_session, session_pids
from seqexport.training.dates import make_split
from tests import raw_http

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray's own pydantic fields

CLIENTS = 16
PER_CLIENT = 10  # 160 requests, half of them streamed


LONG_PROMPTS = 32768  # --max-prompt-tokens: a body limit of 2 MiB
CLIENT_TIMEOUT = 10  # --client-timeout: long enough for a 300 MB body refused by its length to be read and dropped


@pytest.fixture(scope="module")
def dates(bundled_exports):
    folder = bundled_exports("mamba")[1]
    return folder, rt.load(folder, provider="cpu", threads=1)


@pytest.fixture(scope="module")
def two_replicas(dates, tmp_path_factory):
    """`seqexport serve` with its embedded Ray, two replicas; (server, their pids, its log)."""
    log = tmp_path_factory.mktemp("ray") / "server.log"
    with ServerProcess(dates[0], "--replicas", "2", "--replica-cpus", "0.5", "--threads", "1", "--max-rows", "8",
                       "--max-prompt-tokens", str(LONG_PROMPTS), "--client-timeout", str(CLIENT_TIMEOUT),
                       ready_timeout=180, log=log) as server:
        first = replica_pids(server, 2)
        assert len(first) == 2, log.read_text()[-3000:]
        yield server, first, log
    assert not server.session_pids()  # Ray's processes went with the server


def test_the_embedded_default_refuses_oversized_requests_at_its_front(two_replicas):
    """The front `serve` runs takes its body limit from --max-prompt-tokens (64 bytes a token:
    2 MiB here, not the 1 MiB floor), and holds no oversized request (tests/raw_http.py)."""
    server, _, _ = two_replicas
    raw_http.oversized_requests_are_refused_as_they_arrive(server.port, server.proc.pid, LONG_PROMPTS)


def test_the_embedded_default_holds_its_clients_to_client_timeout(two_replicas):
    """The front `serve` runs takes --client-timeout (its clock: tests/test_serve_clients.py):
    half a request head gets 408 once it is up, not at the default 30 s, nor never."""
    server, _, _ = two_replicas
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
        start = time.monotonic()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
        status, error, _ = raw_http.read_response(s)
        took = time.monotonic() - start
    assert status == 408 and f"within {CLIENT_TIMEOUT} s" in error["error"]["message"]
    assert CLIENT_TIMEOUT <= took < CLIENT_TIMEOUT + 5


def replica_pids(server, want: int, seconds: float = 90.0) -> set[int]:
    """Distinct replica pids seen on /health (requests spread over replicas)."""
    seen: set[int] = set()
    deadline = time.monotonic() + seconds
    while len(seen) < want and time.monotonic() < deadline:
        try:
            seen.add(requests.get(server.url + "/health", timeout=5).json()["pid"])
        except (requests.RequestException, ValueError, KeyError):
            pass
        time.sleep(0.05)
    return seen


def listening_sockets(pids: set[int]) -> list[tuple[str, str, int, int]]:
    """(protocol, address, port, pid) of every listening TCP socket and bound UDP socket that
    one of `pids` holds: /proc/net/{tcp,tcp6,udp,udp6} matched to /proc/PID/fd by inode."""
    owner = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    owner[target[8:-1]] = pid
        except OSError:  # the process ended meanwhile
            pass
    found = []
    for proto, family, listening in (("tcp", socket.AF_INET, "0A"), ("tcp6", socket.AF_INET6, "0A"),
                                     ("udp", socket.AF_INET, "07"), ("udp6", socket.AF_INET6, "07")):
        for line in Path(f"/proc/net/{proto}").read_text().splitlines()[1:]:
            fields = line.split()
            (address, port), state, inode = fields[1].split(":"), fields[3], fields[9]
            if state == listening and inode in owner:
                raw = b"".join(bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, len(address), 8))
                found.append((proto, socket.inet_ntop(family, raw), int(port, 16), owner[inode]))
    return found


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def test_the_embedded_default_names_only_its_own_address(two_replicas):
    """Ray's proxy is off behind the front: Ray's "is ready at http://127.0.0.1:8000/" (its
    proxy's default port, where nothing listens) is not printed; seqexport's line names the
    front's port."""
    server, _, log = two_replicas
    line = f"on http://127.0.0.1:{server.port} (a local Ray)"
    deadline = time.monotonic() + 60  # (the front answers once a replica registers; the line comes
    while line not in log.read_text() and time.monotonic() < deadline:  # when serve.run has seen them all)
        time.sleep(0.2)
    text = log.read_text()
    assert line in text, text[-3000:]
    assert "is ready at" not in text, text[-3000:]


def test_embedded_ray_listens_on_loopback_only(two_replicas):
    """The default local Ray (GCS, raylet, workers, dashboard agent, Serve's proxy and
    replicas): every socket the server's processes listen on is on 127.0.0.1 or ::1, the
    HTTP address asked for among them."""
    server, _, _ = two_replicas
    pids = set(server.session_pids())
    sockets = listening_sockets(pids)
    names = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid in pids if Path(f"/proc/{pid}").exists()}
    shown = sorted(f"{proto} {address}:{port} {names.get(pid, pid)}" for proto, address, port, pid in sockets)
    print(f"\n{len(pids)} processes, {len(sockets)} listening sockets:\n  " + "\n  ".join(shown))
    assert ("tcp", "127.0.0.1", server.port) in {s[:3] for s in sockets}
    assert len(sockets) > 3  # Ray's own servers are there, and seen
    assert all(loopback(address) for _, address, _, _ in sockets), shown


def test_embedded_default_keeps_ray_off_the_request_path(two_replicas):
    """No Ray Serve proxy in the embedded default: the `serve` process itself listens on the port
    (`seqexport.serve.front.Front`) and relays to the replicas, which answer HTTP on 127.0.0.1."""
    server, first, _ = two_replicas
    names = {}
    for pid in server.session_pids():
        try:
            names[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            pass
    assert not [n for n in names.values() if n.startswith("ray::ProxyActo")], names
    owners = {pid for _, address, port, pid in listening_sockets(set(names)) if port == server.port}
    assert owners == {server.proc.pid}
    seen = {requests.get(server.url + "/health", timeout=10).json()["pid"] for _ in range(6)}
    assert seen == first  # idle replicas taken in turn


@pytest.mark.slow  # a second embedded Ray: about 20 s
def test_autoscale_keeps_ray_serves_proxy(dates, tmp_path):
    """--autoscale: Ray Serve scales on the requests its proxy routes, so the embedded default keeps
    its proxy (and the ReplicaLoss middleware in it) there."""
    folder, model = dates
    text = make_split("test", 1, seed=5)[0][0]
    ids = encode_prompt(model.tokenizer, model.prompt_frame, text, model.manifest["tokenizer"])
    expect = model.tokenizer.decode(rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=12))[0])
    with ServerProcess(folder, "--autoscale", "1:2", "--replica-cpus", "0.5", "--threads", "1",
                       ready_timeout=180, log=tmp_path / "server.log") as server:
        names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in server.session_pids()
                 if Path(f"/proc/{pid}/comm").exists()}
        assert "ray::ProxyActor" in names
        answer = requests.post(server.url + "/v1/completions", timeout=60,
                               json={"prompt": text, "max_tokens": 12, "temperature": 0}).json()
        assert answer["choices"][0]["text"] == expect


def ask(url: str, text: str, stream: bool, midway: Counter | None = None, lock=None) -> tuple[str, object]:
    """One completion as a client sees it: ("completed", its text); ("503", body) (a refusal to
    retry, with Retry-After); ("error event", message) for a stream ended by an error event and
    [DONE]; ("500", body) or ("status N", body) for any other status; ("broken", why) for a
    stream cut off before its end; ("lost", why) for no answer at all or a stream that ended
    quietly without its last event (a client would take a cut text for the whole).
    `midway`: streams past their first event and not ended, by the pid of the replica serving them."""
    body = {"prompt": text, "max_tokens": 60, "temperature": 0, "ignore_eos": True, "stream": stream}
    started = False
    try:
        with requests.post(url + "/v1/completions", timeout=90, json=body, stream=stream) as r:
            started = True
            if r.status_code == 503 and r.headers.get("retry-after"):
                return "503", r.text[:200]
            if r.status_code != 200:
                return ("500" if r.status_code == 500 else f"status {r.status_code}"), r.text[:200]
            if not stream:
                return "completed", r.json()["choices"][0]["text"]
            pieces, finish, error, pid = [], None, None, int(r.headers["x-replica-pid"])
            try:
                for line in r.iter_lines():
                    if not line.startswith(b"data: "):
                        continue
                    if line == b"data: [DONE]":
                        if error is not None:
                            return "error event", error
                        return ("completed", "".join(pieces)) if finish else ("lost", "[DONE] without finish_reason")
                    event = json.loads(line[6:])
                    if "error" in event:
                        error = event["error"].get("message", "")[:200]
                        continue
                    pieces.append(event["choices"][0]["text"])
                    finish = event["choices"][0]["finish_reason"] or finish
                    if midway is not None and len(pieces) == 1:
                        with lock:
                            midway[pid] += 1
                return "lost", f"the stream ended quietly after {len(pieces)} events, without [DONE]"
            finally:
                if midway is not None and pieces:
                    with lock:
                        midway[pid] -= 1
    except requests.RequestException as e:  # refused or reset: no answer, or a stream cut off
        return ("broken", type(e).__name__) if started else ("lost", repr(e))


def test_the_chat_route_and_the_penalties_reach_the_replicas(two_replicas, dates):
    """Through the front and a replica: a chat request to a model without a chat template is the
    replica's 400 naming `messages` (not a 404 or a relay error), and a penalised request gets
    generate()'s tokens for it."""
    server, _, _ = two_replicas
    folder, model = dates
    r = requests.post(server.url + "/v1/chat/completions", timeout=30,
                      json={"messages": [{"role": "user", "content": "5 March 2021"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    assert "no chat template" in r.json()["error"]["message"]
    ids = model.encode("5 March 2021")
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    answer = c.completions.create(model=folder.name, prompt=ids, max_tokens=12, temperature=0, frequency_penalty=1.5,
                                  extra_body={"repetition_penalty": 1.3, "ignore_eos": True})
    want = rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=12, eos_id=-1, frequency_penalty=1.5,
                                                      repetition_penalty=1.3))[0]
    assert answer.choices[0].token_ids == want
    assert want != rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=12, eos_id=-1))[0]


def test_a_replica_killed_under_load_sends_no_client_a_500(two_replicas, dates):
    """16 clients, 160 requests (half streamed), one of two replicas SIGKILLed a second into the
    load while one of its streams is half-way: no HTTP 500 and no connection cut reaches a
    client. Requests that had sent nothing are sent again to the surviving replica (the embedded
    default's front, `seqexport.serve.front.Front`), so they complete; a stream cut mid-way ends with
    an error event and [DONE]; at worst a 503 with Retry-After. Every retry then completes."""
    server, first, log = two_replicas
    folder, model = dates
    record = model.manifest["tokenizer"]
    texts = [x for x, _ in make_split("test", CLIENTS * PER_CLIENT, seed=3)]
    expect = {t: model.tokenizer.decode(rt.generate(model, [encode_prompt(model.tokenizer, model.prompt_frame, t, record)],
                                                    rt.SearchOptions(max_new_tokens=60, eos_id=-1))[0],
                                        stop_at_eos=False) for t in texts}
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    answer = c.completions.create(model=folder.name, prompt=texts[0], max_tokens=60, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert answer.choices[0].text == expect[texts[0]]

    outcome: list[tuple[str, str, bool, object]] = []  # (kind, prompt, streamed, detail)
    lock = threading.Lock()
    midway: Counter = Counter()  # replica pid -> streams it is in the middle of

    def client(k):
        for text in texts[k * PER_CLIENT : (k + 1) * PER_CLIENT]:
            kind, detail = ask(server.url, text, k % 2 == 1, midway, lock)  # half the clients stream
            with lock:
                outcome.append((kind, text, k % 2 == 1, detail))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    began = time.monotonic()
    for t in threads:
        t.start()
    victim = sorted(first)[0]
    deadline = began + 60
    while time.monotonic() < deadline:
        # under load (a second of it, or a quarter of the requests answered: a fast machine
        # answered all 160 in under a second, and the kill then found no stream to cut), and a
        # stream half-way on the victim
        with lock:
            loaded = time.monotonic() >= began + 1 or len(outcome) >= len(texts) // 4
            if loaded and midway[victim] >= 1:
                break
        time.sleep(0.002)
    cut = midway[victim]
    os.kill(victim, signal.SIGKILL)
    killed_after = len(outcome)
    for t in threads:
        t.join(180)
    counts = Counter(kind for kind, *_ in outcome)
    streams = Counter(kind for kind, _, streamed, _ in outcome if streamed)
    print(f"\nkill test: sent {len(texts)}: {dict(counts)}; streamed {sum(streams.values())}: {dict(streams)}; "
          f"replica {victim} SIGKILLed after {killed_after} answers, {cut} of its streams half-way; "
          f"not completed: {sorted({f'{k}: {d}' for k, _, _, d in outcome if k != 'completed'})}")
    assert len(outcome) == len(texts) and cut >= 1
    assert set(counts) <= {"completed", "503", "error event"}, counts  # no 500, no cut, none lost
    assert all(streamed for kind, _, streamed, _ in outcome if kind == "error event")
    assert all(detail == expect[text] for kind, text, _, detail in outcome if kind == "completed")
    for kind, text, streamed, _ in outcome:  # the retries complete, on whichever replica is up
        if kind != "completed":
            assert ask(server.url, text, streamed) == ("completed", expect[text])
    restarted = replica_pids(server, 2)
    assert len(restarted) == 2 and victim not in restarted, (first, restarted)  # Ray Serve replaced it


def test_config_out_is_a_ray_serve_config_with_this_server(dates, tmp_path):
    from ray.serve.schema import ServeDeploySchema

    from seqexport.serve.ray_app import build

    folder, _ = dates
    path = tmp_path / "serve.yaml"
    result = CliRunner().invoke(cli, ["serve", str(folder), "--config-out", str(path), "--autoscale", "1:3",
                                      "--max-rows", "12", "--host", "0.0.0.0"])
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(path.read_text())
    schema = ServeDeploySchema.model_validate(config) if hasattr(ServeDeploySchema, "model_validate") \
        else ServeDeploySchema.parse_obj(config)
    (app,) = schema.applications
    assert app.import_path == "seqexport.serve.ray_app:build" and app.args["folder"] == str(folder.resolve())
    assert app.args["max_rows"] == 12 and config["http_options"]["host"] == "0.0.0.0"
    deployment = config["applications"][0]["deployments"][0]
    assert deployment["autoscaling_config"]["max_replicas"] == 3
    # a replica takes a full batch at once (Ray Serve's default of 5 ongoing requests would cap it)
    assert deployment["max_ongoing_requests"] >= 12
    assert build(app.args) is not None  # the builder Ray's `serve deploy` imports takes these args
    bad = CliRunner().invoke(cli, ["serve", str(folder), "--config-out", str(path), "--autoscale", "3:1"])
    assert bad.exit_code == 2 and "--autoscale 3:1" in bad.output


def test_engine_options_reach_the_replica_config_and_its_engine(dates, tmp_path):
    """Each engine option of `serve` travels into the replicas' config and from there into the
    engine each replica builds (an option taken and then dropped on the way would only show as
    a server that ignores it)."""
    from seqexport.serve.app import ServeConfig, ServingHost

    folder, _ = dates
    path = tmp_path / "serve.yaml"
    result = CliRunner().invoke(cli, ["serve", str(folder), "--config-out", str(path), "--max-rows", "5",
                                      "--max-queue", "7", "--max-prompt-tokens", "100", "--max-state-mb", "1.5",
                                      "--prefill-chunk", "8", "--start-batch", "2", "--threads", "1"])
    assert result.exit_code == 0, result.output
    args = yaml.safe_load(path.read_text())["applications"][0]["args"]
    want = dict(max_rows=5, max_queue=7, max_prompt_tokens=100, max_state_bytes=int(1.5 * 2**20), prefill_chunk=8,
                start_batch=2)
    assert {k: args[k] for k in want} == want
    host = ServingHost(ServeConfig(**{k: v for k, v in args.items() if k in ServeConfig.__dataclass_fields__}))
    try:
        assert {k: getattr(host.engine, k) for k in want} == want
    finally:
        host.close()


@pytest.mark.slow  # a Ray cluster, then a server on it: about a minute
def test_serve_joins_a_running_ray_cluster(dates, tmp_path, monkeypatch):
    """`seqexport serve --address` against a real Ray cluster (a head started here with `ray
    start --block`, in its own session): the replica runs in the cluster's workers, answers with
    generate()'s tokens, and stopping the server leaves the cluster up; then the cluster goes."""
    folder, model = dates
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a private cluster on 127.0.0.1, no token to share
    temp = tempfile.mkdtemp(prefix="sxray", dir="/tmp")  # Ray's socket paths must stay short
    port = free_port()
    ray_bin = Path(sys.executable).parent / "ray"
    head_log = tmp_path / "head.log"
    with open(head_log, "wb") as out:
        head = subprocess.Popen(
            [str(ray_bin), "start", "--head", "--block", f"--port={port}", "--num-cpus=2", f"--temp-dir={temp}",
             "--include-dashboard=false", "--disable-usage-stats", f"--ray-client-server-port={free_port()}",
             f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and head.poll() is None:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        assert head.poll() is None, head_log.read_text()[-3000:]
        text = make_split("test", 1, seed=9)[0][0]
        ids = encode_prompt(model.tokenizer, model.prompt_frame, text, model.manifest["tokenizer"])
        expect = model.tokenizer.decode(rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=12))[0])
        log = tmp_path / "server.log"
        with ServerProcess(folder, "--address", f"127.0.0.1:{port}", "--threads", "1", "--replica-cpus", "0.5",
                           ready_timeout=180, log=log) as server:
            c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
            answer = c.completions.create(model=folder.name, prompt=text, max_tokens=12, temperature=0)
            assert answer.choices[0].text == expect, log.read_text()[-3000:]
            replica = requests.get(server.url + "/health", timeout=10).json()["pid"]
            assert replica in session_pids(head.pid) and replica not in server.session_pids()  # the cluster's worker
        assert head.poll() is None  # the server left; the cluster stays
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(30)
        except subprocess.TimeoutExpired:
            head.kill()
        reap_session(head.pid)
        shutil.rmtree(temp, ignore_errors=True)
    assert not session_pids(head.pid)
