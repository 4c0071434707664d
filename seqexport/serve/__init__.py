"""Serving: an OpenAI-style HTTP server over the runtime's continuous-batching engine
(`seqexport.runtime.engine`), run as a Ray Serve deployment or one plain uvicorn process.

    protocol  the completions request checked field by field; response and SSE bodies
    text      output text with stop strings held back until they cannot match
    metrics   Prometheus metrics of one server
    app       ServeConfig, ServingHost (model + engine), build_app (FastAPI)
    ray_app   the Ray Serve deployment and its config file
    front     the embedded default's HTTP front: relays to replicas that answer HTTP themselves
    proxy     ReplicaLoss, the middleware that keeps Ray Serve's own proxy from answering 500
    run       how `seqexport serve` runs (`seqexport bench-serve` is in seqexport/bench/serve.py)

Needs the `serve` extra (ray[serve], which brings FastAPI, uvicorn, prometheus-client).
"""
