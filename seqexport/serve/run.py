"""What `seqexport serve` does: check the folder, then serve it under Ray Serve (a local Ray
started on demand, or `--address` of a cluster) or as one plain uvicorn process (`--no-ray`),
until SIGINT/SIGTERM; or write a Ray Serve config file (`--config-out`) and stop."""

import json
import time
from pathlib import Path

from seqexport.errors import UsageError
from seqexport.manifest import read_manifest
from seqexport.serve.app import ServeConfig


def parse_autoscale(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        low, high = (int(x) for x in text.split(":"))
    except ValueError:
        raise UsageError(f"--autoscale {text!r}: expected MIN:MAX replicas, e.g. 1:4") from None
    return low, high


def serve_command(folder: str, *, host: str, port: int, use_ray: bool, address: str | None, replicas: int,
                  autoscale: str | None, replica_cpus: float, config_out: str | None, log, **engine) -> None:
    folder = str(Path(folder).resolve())  # replicas may start in another working directory
    read_manifest(folder)  # a missing or altered export fails here, in one line
    config = ServeConfig(folder, **engine)
    scaling = {"replicas": replicas, "autoscale": parse_autoscale(autoscale), "replica_cpus": replica_cpus}
    if config_out:
        write_config(config_out, config, host, port, scaling)
        log(f"wrote {config_out}: deploy it with `serve deploy {config_out}` on a Ray cluster")
        return
    if use_ray:
        run_ray(config, host, port, address, scaling, log)
    else:
        if address or replicas != 1 or autoscale:
            raise UsageError("--address, --replicas and --autoscale need Ray; drop --no-ray")
        run_plain(config, host, port, log)


def write_config(path: str, config: ServeConfig, host: str, port: int, scaling: dict) -> None:
    from seqexport.serve.ray_app import config_file

    data = config_file(config, host, port, **scaling)
    try:
        import yaml

        text = yaml.safe_dump(data, sort_keys=False)
    except ImportError:  # JSON is YAML too
        text = json.dumps(data, indent=2)
    Path(path).write_text(text)


def run_plain(config: ServeConfig, host: str, port: int, log) -> None:
    import uvicorn

    from seqexport.serve.app import ServingHost, build_app

    serving = ServingHost(config)
    try:
        log(f"serving {serving.name} ({serving.model.family}, {serving.model.provider}) "
            f"on http://{host}:{port} (no Ray)")
        uvicorn.run(build_app(serving), host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
    finally:
        serving.close()


# The embedded default's Ray, set in its environment before Ray is imported (its processes
# inherit it): one machine, so every Ray process listens on 127.0.0.1 only; and Serve's HTTP
# proxy answers a client whose replica died with a retry, never a 500 (seqexport.serve.proxy).
EMBEDDED_ENV = {
    # Ray's setting for a one-machine Ray (its default on macOS and Windows): the node's
    # address is 127.0.0.1, so the GCS, raylet, workers and dashboard agent bind to it
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "seqexport.serve.proxy:middlewares",
}


def run_ray(config: ServeConfig, host: str, port: int, address: str | None, scaling: dict, log) -> None:
    import logging
    import os

    if not address:  # before `import ray`: it reads them then
        for key, value in EMBEDDED_ENV.items():
            os.environ.setdefault(key, value)
    import ray
    from ray import serve

    from seqexport.serve.ray_app import APP_NAME, application

    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:  # the embedded default: a new local Ray instance for this process only
        ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
        if ray.util.get_node_ip_address() != "127.0.0.1":
            log(f"warning: Ray listens on {ray.util.get_node_ip_address()}, not only on 127.0.0.1 "
                "(it was imported before `serve`, or RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is set)")
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(application(config, **scaling), name=APP_NAME, route_prefix="/")
        where = f"Ray cluster {address}" if address else "a local Ray"
        log(f"serving {Path(config.folder).name} on http://{host}:{port} ({where})")
        while True:
            time.sleep(3600)  # until SIGINT/SIGTERM
    finally:
        if address:
            serve.delete(APP_NAME)  # leave the cluster as we found it
        else:
            serve.shutdown()
        ray.shutdown()
