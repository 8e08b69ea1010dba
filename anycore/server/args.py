"""Server flags for `anycore serve` and the ServerConfig they build; each default is ServerConfig's."""

from __future__ import annotations

import argparse

from anycore.config import TOOL_CALL_PARSERS, ServerConfig, default_of


def add_server_args(parser: argparse.ArgumentParser) -> None:
    def d(name: str):
        return default_of(ServerConfig, name)

    g = parser.add_argument_group("server")
    g.add_argument("--host", default=d("host"), help="interface to bind (0.0.0.0 for all; default: %(default)s)")
    g.add_argument("--port", type=int, default=d("port"), help="default: %(default)s")
    g.add_argument("--api-key", default=d("api_key"), help="require 'Authorization: Bearer <key>' on API routes")
    g.add_argument("--served-model-name", dest="served_model_names", nargs="+", default=list(d("served_model_names")),
                   help="model name(s) clients may send (default: the model file/folder name)")
    g.add_argument("--max-queued-requests", type=int, default=d("max_queued_requests"),
                   help="admitted sub-requests without a first token beyond which new requests get 429 "
                        "(default: %(default)s)")
    g.add_argument("--shutdown-timeout", type=float, default=d("shutdown_timeout"),
                   help="seconds in-flight requests may run on after SIGINT/SIGTERM before being cancelled "
                        "(default: %(default)s)")
    g.add_argument("--max-request-body-mb", type=float, default=d("max_request_body_mb"),
                   help="larger request bodies get 413 (0: no limit; default: %(default)s)")
    g.add_argument("--request-timeout", type=float, default=d("request_timeout"),
                   help="seconds a request may take end to end before it is aborted (408, or an error event "
                        "in a started stream; 0: no limit; default: %(default)s)")
    g.add_argument("--bench-results", default=d("bench_results"), metavar="FILE",
                   help="an `anycore bench compare --json` file (its PNG charts beside it) for the web page's "
                        "Benchmarks tab and GET /v1/bench")
    g.add_argument("--no-self-check", dest="self_check", action="store_false", default=d("self_check"),
                   help="skip the start-up decode self-check (a few decode steps timed against the probed "
                        "memory bandwidth and logged)")
    g.add_argument("--tool-call-parser", choices=list(TOOL_CALL_PARSERS), default=d("tool_call_parser"),
                   help="how tool calls are read from the output: hermes (<tool_call>{json}</tool_call>), "
                        "llama3_json ({\"name\": .., \"parameters\": ..}), or auto: chosen by the chat template "
                        "(default: %(default)s)")
    g.add_argument("--uvicorn-log-level", default=d("uvicorn_log_level"),
                   choices=["critical", "error", "warning", "info", "debug", "trace"])


def server_config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(host=args.host, port=args.port, api_key=args.api_key,
                        served_model_names=tuple(args.served_model_names or ()),
                        max_queued_requests=args.max_queued_requests, shutdown_timeout=args.shutdown_timeout,
                        max_request_body_mb=args.max_request_body_mb, request_timeout=args.request_timeout,
                        self_check=args.self_check, uvicorn_log_level=args.uvicorn_log_level,
                        bench_results=args.bench_results, tool_call_parser=args.tool_call_parser)
