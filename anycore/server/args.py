"""Server flags for `anycore serve` (cli.py calls ``add_server_args`` on its serve sub-parser)."""

from __future__ import annotations

import argparse


def add_server_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 for all)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--api-key", default=None, help="require 'Authorization: Bearer <key>' on API routes")
    g.add_argument("--served-model-name", nargs="+", default=None,
                   help="model name(s) clients may send (default: the model file/folder name)")
    g.add_argument("--max-queued-requests", type=int, default=256,
                   help="admitted sub-requests without a first token beyond which new requests get 429")
    g.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="seconds in-flight requests may run on after SIGINT/SIGTERM before being cancelled")
    g.add_argument("--max-request-body-mb", type=float, default=4.0,
                   help="larger request bodies get 413 (0: no limit)")
    g.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds a request may take end to end before it is aborted (408, or an error event "
                        "in a started stream; 0: no limit)")
    g.add_argument("--uvicorn-log-level", default="warning",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
