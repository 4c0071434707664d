"""How `seqexport serve` runs (`seqexport/cli/serve.py` checks the folder and options): under
Ray Serve (a local Ray started on demand, or `--address` of a cluster) or as one plain uvicorn
process (`--no-ray`), until SIGINT/SIGTERM."""

import contextlib
import shutil
import signal
import tempfile
import time
from pathlib import Path

from seqexport.errors import UsageError
from seqexport.serve.app import ServeConfig
from seqexport.serve.clients import ClientLimits
from seqexport.serve.protocol import body_limit


def run_plain(config: ServeConfig, host: str, port: int, log, manifest: dict | None = None,
              limits: ClientLimits | None = None) -> None:
    import uvicorn

    from seqexport.serve.app import ServingHost, build_app
    from seqexport.serve.draining import DrainingServer
    from seqexport.serve.uvicorn_limits import limited_protocol

    with _listening(host, port) as sock:  # before the model loads: a port in use fails at once, in one line
        serving = ServingHost(config, manifest)  # the manifest `serve` checked: its files are hashed once
        try:
            log(f"serving {serving.name} ({serving.model.family}, {serving.model.provider}) "
                f"on http://{host}:{port} (no Ray)")
            limits = limits or ClientLimits()
            # no WebSocket (nothing is served over one): an upgrade request is answered as plain
            # HTTP, as the front answers it, not with uvicorn's WebSocket handshake errors
            # an idle keep-alive connection closes after --client-timeout, as in the front (the
            # client clock closes it; uvicorn's own 5 s closed it first, and a client reusing its
            # connection after 5 s could race the close): uvicorn's is only a backstop past ours
            config = uvicorn.Config(build_app(serving), log_level="warning", http=limited_protocol(limits), ws="none",
                                    timeout_keep_alive=int(limits.timeout_s) + 5)
            server = DrainingServer(config, serving.engine.close, limits.shutdown_grace_s)
            # SIGTERM exits 143 and Ctrl-C 130 (`cli.main`), as in the embedded default: uvicorn
            # raises the signal again once stopped, and below it is raised for certain (the CLI's
            # handler may defer a re-raised Ctrl-C, and the process returned 0 first)
            server.run(sockets=[sock])
        finally:
            serving.close()
    if server.stopped_by is not None:  # stopped by a signal: exit as it says (128 + it)
        raise KeyboardInterrupt if server.stopped_by == signal.SIGINT else SystemExit(128 + server.stopped_by)


def _listening(host: str, port: int):
    """A socket listening on host:port, or UsageError naming them (a port in use, a host that
    does not resolve) instead of uvicorn's log line and exit 3 after "serving … on"."""
    import socket

    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise _bind_error(host, port, e) from None


def _bind_error(host: str, port: int, e: OSError) -> UsageError:
    return UsageError(f"--host {host} --port {port}: {e.strerror or e}")


# The embedded default's Ray, set in its environment before Ray is imported (its processes
# inherit it): one machine, so every Ray process listens on 127.0.0.1 only; and Serve's HTTP
# proxy answers a client whose replica died with a retry, never a 500 (seqexport.serve.proxy).
EMBEDDED_ENV = {
    # Ray's setting for a one-machine Ray (its default on macOS and Windows): the node's
    # address is 127.0.0.1, so the GCS, raylet, workers and dashboard agent bind to it
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "seqexport.serve.proxy:middlewares",
}


def run_ray(config: ServeConfig, host: str, port: int, address: str | None, scaling: dict, log,
            limits: ClientLimits | None = None) -> None:
    """Under Ray Serve until SIGINT/SIGTERM. The embedded default (no `address`), unless it
    autoscales: no Ray proxy; each replica answers HTTP itself on 127.0.0.1 and `Front` relays
    requests to them from this process (`seqexport.serve.proxy`). Joining a cluster, or
    autoscaling (Ray Serve counts the requests it routes): Ray Serve's own HTTP proxy."""
    import logging
    import os

    if not address:  # before `import ray`: it reads them then
        for key, value in EMBEDDED_ENV.items():
            os.environ.setdefault(key, value)
    import ray
    from ray import serve

    from seqexport.serve.ray_app import APP_NAME, application

    front = None
    if address:
        with _keeping_sigterm():
            ray.init(address=address, logging_level=logging.WARNING)
    else:  # the embedded default: a new local Ray instance for this process only
        if scaling.get("autoscale") is None:
            front = _front(host, port, body_limit(config.max_prompt_tokens), limits or ClientLimits(),
                           config.allow_origins)  # listening before Ray starts: a port in use fails at once
        with _keeping_sigterm():
            ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
        if ray.util.get_node_ip_address() != "127.0.0.1":
            log(f"warning: Ray listens on {ray.util.get_node_ip_address()}, not only on 127.0.0.1 "
                "(it was imported before `serve`, or RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is set)")
    try:
        if front is not None:
            serve.start(proxy_location="Disabled")
            app = application(config, registry=str(front.registry.folder), **scaling)
        else:
            serve.start(http_options={"host": host, "port": port})
            app = application(config, **scaling)
        # behind the front, no route through Ray's (disabled) proxy: Ray logged "Application
        # 'seqexport' is ready at http://127.0.0.1:8000/", a port nothing listens on
        serve.run(app, name=APP_NAME, route_prefix="/" if front is None else None)
        where = f"Ray cluster {address}" if address else "a local Ray"
        log(f"serving {Path(config.folder).name} on http://{host}:{port} ({where})")
        while True:
            time.sleep(3600)  # until SIGINT/SIGTERM
    finally:
        if front is not None:  # first: Ray's shutdown may not return before the process is ended
            front.close()  # (its requests in progress get the shutdown grace)
            shutil.rmtree(front.registry.folder, ignore_errors=True)
        if address:
            serve.delete(APP_NAME)  # leave the cluster as we found it
        else:
            serve.shutdown()
        ray.shutdown()


@contextlib.contextmanager
def _keeping_sigterm():
    """Around `ray.init`: SIGTERM's handler as it was before (the CLI's: unwind, exit 143).
    Ray's driver installs its own: Python's sys.exit(15), then absl's failure handler, which on
    SIGTERM printed a stack dump and aborted the process (exit 134), so `serve` never ran its
    cleanup: the front's connections were dropped mid-answer and Ray was never shut down."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


def _front(host: str, port: int, limit: int, limits: ClientLimits, allow_origins: list[str] | None):
    from seqexport.serve.front import Front

    folder = tempfile.mkdtemp(prefix="seqexport-replicas-")
    try:
        return Front(folder, host, port, body_limit=limit, limits=limits, allow_origins=allow_origins).start()
    except OSError as e:
        shutil.rmtree(folder, ignore_errors=True)
        raise _bind_error(host, port, e) from None
