"""`seqexport serve` as a Ray Serve deployment (a local Ray started by the server, stopped
with it): two replicas answer with generate()'s tokens; one replica's process is killed
under load, Ray Serve restarts it, and no accepted request is lost."""

import os
import signal
import threading
import time
from collections import Counter

import openai
import pytest
import requests
import yaml
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport.cli import cli
from seqexport.runtime.tokenizer import encode_prompt
from seqexport.serve.process import ServerProcess
from seqexport.training.dates import make_split

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray's own pydantic fields

CLIENTS = 8
PER_CLIENT = 12


@pytest.fixture(scope="module")
def dates(bundled_exports):
    folder = bundled_exports("mamba")[1]
    return folder, rt.load(folder, provider="cpu", threads=1)


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


def test_two_replicas_survive_one_killed_under_load(dates, tmp_path):
    folder, model = dates
    record = model.manifest["tokenizer"]
    texts = [x for x, _ in make_split("test", CLIENTS * PER_CLIENT, seed=3)]
    expect = {t: model.tokenizer.decode(rt.generate(model, [encode_prompt(model.tokenizer, model.prompt_frame, t, record)],
                                                    rt.SearchOptions(max_new_tokens=60, eos_id=-1))[0],
                                        stop_at_eos=False) for t in texts}
    log = tmp_path / "server.log"
    server = ServerProcess(folder, "--replicas", "2", "--replica-cpus", "0.5", "--threads", "1", "--max-rows", "8",
                           ready_timeout=180, log=log)
    with server:
        first = replica_pids(server, 2)
        assert len(first) == 2, log.read_text()[-3000:]
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        answer = c.completions.create(model=folder.name, prompt=texts[0], max_tokens=60, temperature=0,
                                      extra_body={"ignore_eos": True})
        assert answer.choices[0].text == expect[texts[0]]

        outcome: list[tuple[str, str, object]] = []  # (kind, prompt, detail)
        lock = threading.Lock()

        def client(k):
            for text in texts[k * PER_CLIENT : (k + 1) * PER_CLIENT]:
                try:
                    r = requests.post(server.url + "/v1/completions", timeout=60, json={
                        "prompt": text, "max_tokens": 60, "temperature": 0, "ignore_eos": True})
                except requests.RequestException as e:  # no answer at all: lost
                    result = ("lost", text, repr(e))
                else:
                    if r.status_code == 200:
                        result = ("completed", text, r.json()["choices"][0]["text"])
                    else:  # an error status the client can act on (retry)
                        result = ("errored", text, (r.status_code, r.text[:200]))
                with lock:
                    outcome.append(result)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
        for t in threads:
            t.start()
        while len(outcome) < CLIENTS:  # under load: every client has had an answer
            time.sleep(0.01)
        victim = sorted(first)[0]
        os.kill(victim, signal.SIGKILL)
        killed_after = len(outcome)
        for t in threads:
            t.join(120)
        counts = Counter(kind for kind, _, _ in outcome)
        print(f"\nfault test: sent {len(texts)}, completed {counts['completed']}, errored {counts['errored']}, "
              f"lost {counts['lost']}; replica {victim} killed after {killed_after} answers; errors: "
              f"{sorted({d for k, _, d in outcome if k == 'errored'})}")
        assert len(outcome) == len(texts) and counts["lost"] == 0
        assert all(detail == expect[text] for kind, text, detail in outcome if kind == "completed")
        assert all(500 <= d[0] < 600 for k, _, d in outcome if k == "errored")  # a server error: retry it
        for kind, text, _ in outcome:  # the retries complete, on whichever replica is up
            if kind == "errored":
                r = requests.post(server.url + "/v1/completions", timeout=60, json={
                    "prompt": text, "max_tokens": 60, "temperature": 0, "ignore_eos": True})
                assert r.status_code == 200 and r.json()["choices"][0]["text"] == expect[text]
        restarted = replica_pids(server, 2)
        assert len(restarted) == 2 and victim not in restarted, (first, restarted)  # Ray Serve replaced it
    assert not server.session_pids()  # Ray's processes went with the server


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
    assert config["applications"][0]["deployments"][0]["autoscaling_config"]["max_replicas"] == 3
    assert build(app.args) is not None  # the builder Ray's `serve deploy` imports takes these args
    bad = CliRunner().invoke(cli, ["serve", str(folder), "--config-out", str(path), "--autoscale", "3:1"])
    assert bad.exit_code == 2 and "--autoscale 3:1" in bad.output
