"""The server as a Ray Serve deployment: each replica loads the model and runs its own engine.

    app = application(ServeConfig(folder), replicas=2)     # a bound Ray Serve application
    serve.run(app, name="seqexport", route_prefix="/")

`build(args)` is the same application for a Serve config file (`import_path:
seqexport.serve.ray_app:build`), which `seqexport serve --config-out` writes for
`serve deploy` on a multi-node cluster.
"""

from ray import serve

from seqexport.errors import UsageError
from seqexport.serve.app import ServeConfig, ServingHost, build_app

APP_NAME = "seqexport"
DEPLOYMENT = "SeqexportServer"


@serve.ingress()
class SeqexportServer:
    """One replica: the model, an engine on a background thread, the FastAPI app over them."""

    def __init__(self, config: dict, registry: str | None = None):
        """`registry`: a folder of `seqexport.serve.proxy.Registry` (the embedded default's): the
        replica also answers HTTP itself on 127.0.0.1, and announces its port there for the front."""
        _internal_grpc_on_loopback()
        self.host = ServingHost(ServeConfig(**config))
        self.http = _answer_http(build_app(self.host), registry) if registry else None

    def __serve_build_asgi_app__(self):
        return build_app(self.host)


def _answer_http(app, registry: str):
    """Serve `app` with uvicorn on a Unix socket in `registry` (only the front, on this machine,
    connects: each event's send and read cost less than over TCP on 127.0.0.1, and nothing
    listens on a port) on a thread of its own, then announce it there; the started uvicorn.Server."""
    import asyncio
    import socket
    import threading

    import uvicorn

    from seqexport.serve.front import Registry
    from seqexport.serve.uvicorn_limits import limited_protocol

    path = Registry(registry).socket_path()
    if len(path.encode()) < 100:  # (a Unix socket's path has room for 107 bytes, or 103)
        sock, address = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), path
        sock.bind(path)
    else:  # a long temporary folder: a port of the kernel's choosing
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        address = sock.getsockname()[1]
    sock.listen(1024)
    # only the front connects, and keeps its connections: no keep-alive timeout to race it, and
    # no client limits (the front holds its clients to them); no WebSocket, as in run_plain
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", http=limited_protocol(None),
                                           ws="none", timeout_keep_alive=3600, access_log=False))

    def run():
        try:
            import uvloop

            loop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        loop.run_until_complete(server.serve(sockets=[sock]))

    threading.Thread(target=run, name="seqexport-http", daemon=True).start()
    Registry(registry).announce(address)
    return server


def _internal_grpc_on_loopback() -> None:
    """In a replica on a node whose address is 127.0.0.1 (`seqexport serve`'s embedded default):
    bind Ray Serve's inter-deployment gRPC server there too. Ray Serve binds it to [::]:0
    whatever the node's address (`ray.serve._private.replica`, once this `__init__` has run);
    the name is private, so where it has moved this does nothing, and
    tests/test_serve_ray.py's socket check says so."""
    import ray
    from ray.serve._private import replica

    bind = getattr(replica, "add_port_to_grpc_server", None)
    if bind is None or getattr(bind, "loopback", False) or ray.util.get_node_ip_address() != "127.0.0.1":
        return

    def on_loopback(server, address: str):
        return bind(server, address.replace("[::]", "127.0.0.1", 1))

    on_loopback.loopback = True
    replica.add_port_to_grpc_server = on_loopback


def deployment_options(config: ServeConfig, replicas: int = 1, autoscale: tuple[int, int] | None = None,
                       replica_cpus: float = 1.0) -> dict:
    """Options of the deployment; every replica takes as many requests at once as its engine
    holds rows and queue (Ray Serve's default of 5 would cap the batch); past another
    `max_queue` waiting at the proxy, Ray Serve answers 503 itself."""
    options = {"name": DEPLOYMENT, "ray_actor_options": {"num_cpus": replica_cpus},
               "max_ongoing_requests": config.max_rows + config.max_queue,
               "max_queued_requests": config.max_queue,
               "health_check_period_s": 2, "health_check_timeout_s": 10,
               "logging_config": {"log_level": "WARNING", "enable_access_log": False}}
    if autoscale is not None:
        low, high = autoscale
        if not 0 <= low <= high or high < 1:
            raise UsageError(f"--autoscale {low}:{high}: expected 0 <= MIN <= MAX and MAX >= 1")
        options["autoscaling_config"] = {"min_replicas": low, "max_replicas": high,
                                         "target_ongoing_requests": config.max_rows}
    else:
        options["num_replicas"] = replicas
    return options


def application(config: ServeConfig, registry: str | None = None, **kwargs):
    """`registry`: each replica also answers HTTP itself and announces its port there (the front)."""
    options = deployment_options(config, **kwargs)
    return serve.deployment(SeqexportServer, **options).bind(config.to_dict(), registry)


def build(args: dict):
    """Application builder for a Serve config file: `args` holds the ServeConfig fields."""
    return serve.deployment(SeqexportServer, name=DEPLOYMENT).bind(ServeConfig(**args).to_dict())


def config_file(config: ServeConfig, host: str, port: int, **kwargs) -> dict:
    """A Ray Serve config (`serve deploy FILE` / `serve run FILE`) for this server."""
    options = deployment_options(config, **kwargs)
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": host, "port": port},
        "applications": [{
            "name": APP_NAME, "route_prefix": "/", "import_path": "seqexport.serve.ray_app:build",
            "args": config.to_dict(),
            "deployments": [options],
        }],
    }
