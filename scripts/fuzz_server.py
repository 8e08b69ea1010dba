"""Hostile-request fuzz of a live `anycore serve`: every answer must be a 4xx with an OpenAI-shaped
error body, the server must not crash, and a concurrent well-behaved greedy client must keep
getting the same text it got before the fuzz.

    python scripts/fuzz_server.py --requests 1200            # starts its own loopback server
    python scripts/fuzz_server.py --url http://127.0.0.1:8000 --api-key KEY

Classes of requests (each case is meant to be rejected, none to generate): bad JSON, wrong types,
huge strings, huge n / max_tokens, deep nesting, invalid UTF-8 and lone surrogates, token ids out
of range, 10 MB bodies, wrong methods/routes/content types, out-of-range sampling values.
Exit status 1 on any 5xx, non-4xx, non-OpenAI-shaped error body, crash or probe mismatch.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serverkit import LiveServer, Prober, default_server_args, is_openai_error, probe_once, serve  # noqa: E402

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
ROUTES = [CHAT, COMP, "/generate", "/tokenize", "/detokenize"]


@dataclass
class Case:
    kind: str
    path: str
    body: bytes
    method: str = "POST"
    content_type: str = "application/json"


def _j(obj: object) -> bytes:
    return json.dumps(obj).encode()


def _msgs(text: str = "hi") -> list[dict]:
    return [{"role": "user", "content": text}]


def _huge(rng: random.Random) -> str:
    # past any context length but under the body limit; tokenizing it is the expensive part
    return rng.choice(["a ", "lorem ipsum ", "\u00e9\u4e2d ", "x"]) * rng.randint(200_000, 600_000)


def make_cases(count: int, seed: int, vocab_size: int = 49152) -> list[Case]:
    """``count`` hostile requests spread over the classes above (deterministic for a seed)."""
    rng = random.Random(seed)
    V = vocab_size
    out_of_range = [-1, V, V + 7, 2**31, 2**63, -(2**63), 10**30]
    bad_numbers = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]

    def bad_json() -> Case:
        raw = rng.choice([b"{", b"{\"prompt\": ", b"[1,2", b"not json", b"", b"{\"prompt\": 'single'}",
                          b"{\"a\":1,}", b"\x00\x00", b"{\"prompt\": \"x\"} trailing", b"null", b"42", b"\"str\""])
        return Case("bad_json", rng.choice(ROUTES), raw)

    def wrong_types() -> Case:
        field_, value = rng.choice([
            ("n", "two"), ("max_tokens", "ten"), ("max_tokens", [1]), ("temperature", "hot"), ("top_p", {}),
            ("stream", "maybe"), ("stop", 5), ("stop", [1, 2]), ("seed", 1.5), ("logprobs", "many"),
            ("stop_token_ids", "3"), ("stream_options", 1), ("top_k", "all"), ("messages", "hello"),
            ("messages", [{"role": "wizard", "content": "x"}]), ("messages", [{"content": "x"}]),
            ("messages", [{"role": "user", "content": 7}]), ("messages", []), ("prompt", None),
            ("prompt", {"text": "x"}), ("prompt", [[1, "a"]]), ("prompt", []), ("prompt", [[]]),
            ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        ])
        if field_ == "messages":
            return Case("wrong_types", CHAT, _j({"messages": value}))
        if field_ == "prompt":
            return Case("wrong_types", COMP, _j({"prompt": value}))
        path = rng.choice([CHAT, COMP])
        base = {"messages": _msgs()} if path == CHAT else {"prompt": "hi"}
        return Case("wrong_types", path, _j({**base, field_: value}))

    def huge_string() -> Case:
        text = _huge(rng)
        which = rng.randrange(4)
        if which == 0:
            return Case("huge_string", CHAT, _j({"messages": _msgs(text)}))
        if which == 1:
            return Case("huge_string", COMP, _j({"prompt": text}))
        if which == 2:
            return Case("huge_string", "/generate", _j({"text": text}))
        return Case("huge_string", COMP, _j({"prompt": "hi", "model": text[:200_000]}))

    def huge_numbers() -> Case:
        path = rng.choice([CHAT, COMP, "/generate"])
        value = rng.choice([10**6, 10**9, 2**63, 10**30, -1, 0])
        # (a huge top_k is not hostile: at or past the vocabulary it keeps every token, so it is accepted)
        if path == "/generate":
            key = rng.choice(["max_new_tokens", "max_tokens", "top_k", "logprobs", "min_tokens"])
            if key == "top_k":
                value = rng.choice([-2, -(2**40), -(2**63)])
            elif key == "logprobs":
                value = rng.choice([21, 10**9, 2**63, -(2**40)])
            elif key == "min_tokens":
                value = rng.choice([10**9, 2**63, -5])
            return Case("huge_numbers", path, _j({"text": "hi", "sampling_params": {key: value}}))
        base = {"messages": _msgs()} if path == CHAT else {"prompt": "hi"}
        key = rng.choice(["n", "max_tokens", "best_of", "top_logprobs" if path == CHAT else "logprobs", "min_tokens",
                          "max_completion_tokens" if path == CHAT else "max_tokens"])
        if key == "n":
            value = rng.choice([65, 10**6, 2**63, 0, -3])
        if key == "min_tokens":
            value = rng.choice([10**9, 2**63, -1])
        if key in ("logprobs", "top_logprobs"):
            value = rng.choice([21, 10**6, 2**63, -1])
        if key == "best_of":  # a completions field (chat ignores it, as OpenAI's chat API has none)
            path, base = COMP, {"prompt": "hi", "n": 1}
            value = rng.choice([2, 10**6])
        return Case("huge_numbers", path, _j({**base, key: value}))

    def deep_nesting() -> Case:
        depth = rng.choice([100, 1000, 50_000, 200_000])
        inner = "[" * depth + "1" + "]" * depth
        key = rng.choice(["prompt", "messages", "stop", "sampling_params", "tokens"])
        path = {"prompt": COMP, "messages": CHAT, "stop": COMP, "sampling_params": "/generate",
                "tokens": "/detokenize"}[key]
        extra = "" if key in ("prompt", "messages", "tokens") else ', "prompt": "hi", "text": "hi"'
        if rng.random() < 0.3:
            inner = '{"a":' * depth + "1" + "}" * depth
        if key == "sampling_params":  # its fields are all optional and unknown ones ignored: nest in a typed one
            return Case("deep_nesting", path, f'{{"text": "hi", "sampling_params": {{"temperature": {inner}}}}}'.encode())
        return Case("deep_nesting", path, f'{{"{key}": {inner}{extra}}}'.encode())

    def invalid_utf8() -> Case:
        raw = rng.choice([b'{"prompt": "\xff\xfe\xfd"}', b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}',
                          b'{"prompt": "\xed\xa0\x80"}', b'\xef\xbb\xbf{"prompt": "bom"}\xff',
                          b'{"prompt": "\\ud800"}', b'{"prompt": "ok\\udfff"}',
                          b'{"messages": [{"role": "user", "content": "\\ud83d"}]}',
                          b'{"text": "\\udc00\\ud800"}'])
        # (a stop string holding a lone surrogate is harmless - it can never match - and is accepted)
        path = COMP if b"prompt" in raw else CHAT if b"messages" in raw else "/generate"
        if rng.random() < 0.25:
            path = "/tokenize"
        return Case("invalid_utf8", path, raw)

    def token_ids() -> Case:
        bad = rng.choice(out_of_range)
        which = rng.randrange(6)
        if which == 0:
            return Case("token_ids", COMP, _j({"prompt": [1, 2, bad]}))
        if which == 1:
            return Case("token_ids", COMP, _j({"prompt": [[1], [bad, 3]]}))
        if which == 2:
            return Case("token_ids", "/generate", _j({"input_ids": [bad]}))
        if which == 3:
            return Case("token_ids", "/detokenize", _j({"tokens": [5, bad]}))
        if which == 4:
            return Case("token_ids", COMP, _j({"prompt": "hi", "stop_token_ids": [bad]}))
        return Case("token_ids", "/generate", _j({"text": "hi", "sampling_params": {"stop_token_ids": [bad]}}))

    def big_body() -> Case:
        size = rng.choice([5, 10, 12]) * 1024 * 1024
        path = rng.choice(ROUTES)
        return Case("big_body", path, b'{"prompt": "' + b"a" * size + b'"}')

    def bad_values() -> Case:
        path = rng.choice([CHAT, COMP, "/generate"])
        key = rng.choice(["temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                          "min_p", "top_k"])
        value = rng.choice(bad_numbers + ["-5", "1e9", "-1e9"])
        if path == "/generate":
            if key == "top_k" or value in ("1e9",) and key in ("temperature",):
                value = "-1e9"
            raw = f'{{"text": "hi", "sampling_params": {{"{key}": {value}}}}}'
        else:
            base = '"messages": [{"role": "user", "content": "hi"}]' if path == CHAT else '"prompt": "hi"'
            if key == "top_k":
                value = rng.choice(["-5", "1e400", "NaN"])
            raw = f'{{{base}, "{key}": {value}}}'
        return Case("bad_values", path, raw.encode())

    def wrong_route() -> Case:
        which = rng.randrange(5)
        if which == 0:
            return Case("wrong_route", rng.choice(ROUTES), b"", method=rng.choice(["GET", "PUT", "DELETE", "PATCH"]))
        if which == 1:
            return Case("wrong_route", rng.choice(["/v1/nope", "/v2/completions", "/../etc/passwd", "/v1/models/x"]),
                        _j({"prompt": "hi"}))
        if which == 2:
            return Case("wrong_route", COMP, b"prompt=hi&max_tokens=2", content_type="application/x-www-form-urlencoded")
        if which == 3:
            return Case("wrong_route", CHAT, _j({"messages": _msgs(), "model": "no-such-model"}))
        return Case("wrong_route", rng.choice(ROUTES), _j({"prompt": "hi"}), content_type="text/plain")

    def conflicting() -> Case:
        return rng.choice([
            Case("conflicting", "/generate", _j({"text": "hi", "input_ids": [1, 2]})),
            Case("conflicting", "/generate", _j({})),
            Case("conflicting", "/tokenize", _j({"prompt": "hi", "messages": _msgs()})),
            Case("conflicting", COMP, _j({"prompt": "hi", "max_tokens": 0})),  # 0 tokens only with echo
            Case("conflicting", CHAT, _j({"messages": _msgs(), "tool_choice": "required"})),  # no tools
            Case("conflicting", COMP, _j({"prompt": "hi", "suffix": "x"})),
            Case("conflicting", CHAT, _j({"messages": _msgs(), "top_logprobs": 3})),
            Case("conflicting", COMP, _j({"prompt": "", "max_tokens": 2})),
            Case("conflicting", COMP, _j({"prompt": [""], "max_tokens": 2})),
            Case("conflicting", COMP, _j({"prompt": "hi", "stop": ["x"] * 10_000, "max_tokens": 2, "n": 0})),
        ])

    makers = [bad_json, wrong_types, huge_string, huge_numbers, deep_nesting, invalid_utf8, token_ids, big_body,
              bad_values, wrong_route, conflicting]
    weights = [12, 14, 2, 12, 6, 10, 12, 1, 12, 8, 10]
    return [rng.choices(makers, weights)[0]() for _ in range(count)]


@dataclass
class FuzzReport:
    statuses: Counter = field(default_factory=Counter)
    by_kind: dict[str, Counter] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    transport_errors: list[str] = field(default_factory=list)

    def merge(self, other: FuzzReport) -> None:
        self.statuses.update(other.statuses)
        for kind, c in other.by_kind.items():
            self.by_kind.setdefault(kind, Counter()).update(c)
        self.failures += other.failures
        self.transport_errors += other.transport_errors

    @property
    def total(self) -> int:
        return sum(self.statuses.values())


def send_case(client: httpx.Client, srv: LiveServer, case: Case) -> tuple[int | None, str | None]:
    """Status and, if the answer is not an acceptable 4xx, why not."""
    headers = {**srv.headers, "content-type": case.content_type}
    try:
        r = client.request(case.method, srv.url + case.path, content=case.body, headers=headers, timeout=300)
    except httpx.HTTPError as e:
        return None, f"{case.kind} {case.path}: transport error {type(e).__name__}: {e}"
    if not 400 <= r.status_code < 500:
        return r.status_code, f"{case.kind} {case.path}: status {r.status_code}: {r.text[:300]!r} for {case.body[:200]!r}"
    try:
        body = r.json()
    except ValueError:
        body = None
    if not is_openai_error(body):
        return r.status_code, f"{case.kind} {case.path}: {r.status_code} body not OpenAI-shaped: {r.text[:300]!r}"
    return r.status_code, None


def run_fuzz(srv: LiveServer, cases: list[Case], workers: int = 8) -> FuzzReport:
    report = FuzzReport()

    with httpx.Client(limits=httpx.Limits(max_connections=workers)) as client, ThreadPoolExecutor(workers) as pool:
        for case, (status, problem) in zip(cases, pool.map(lambda c: send_case(client, srv, c), cases)):
            key = str(status) if status is not None else "transport_error"
            report.statuses[key] += 1
            report.by_kind.setdefault(case.kind, Counter())[key] += 1
            if problem is not None:
                (report.transport_errors if status is None else report.failures).append(problem)
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running server (default: start one on a free loopback port)")
    ap.add_argument("--api-key")
    ap.add_argument("--requests", type=int, default=1200)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-probes", type=int, default=20,
                    help="keep fuzzing (200 more per round) until the well-behaved client got this many answers")
    ap.add_argument("--max-seconds", type=float, default=900.0)
    args = ap.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if args.url:
        return _fuzz(LiveServer(args.url, headers=headers), args)
    log = Path(tempfile.mkdtemp(prefix="anycore-fuzz-")) / "server.log"
    with serve(default_server_args(), log) as srv:
        rc = _fuzz(srv, args)
        print(f"server log: {log}")
        return rc


def _fuzz(srv: LiveServer, args: argparse.Namespace) -> int:
    reference = probe_once(srv)
    cases = make_cases(args.requests, args.seed)
    t0 = time.monotonic()
    with Prober(srv, reference) as prober:
        report = run_fuzz(srv, cases, args.workers)
        # the well-behaved client must have been served often enough to mean something: more rounds until then
        rounds = 0
        while prober.done < args.min_probes and time.monotonic() - t0 < args.max_seconds:
            rounds += 1
            report.merge(run_fuzz(srv, make_cases(200, args.seed + rounds), args.workers))
    after = probe_once(srv)
    print(f"{report.total} hostile requests in {time.monotonic() - t0:.0f}s; statuses: {dict(sorted(report.statuses.items()))}")
    for kind, c in sorted(report.by_kind.items()):
        print(f"  {kind:13s} {dict(sorted(c.items()))}")
    print(f"well-behaved client: {prober.done} requests, {len(prober.mismatches)} mismatches, "
          f"{len(prober.errors)} errors; output after the fuzz unchanged: {after == reference}")
    for p in (report.transport_errors[:10] + report.failures[:20] + prober.errors[:10]):
        print("FAIL", p)
    ok = (not report.failures and not report.transport_errors and not prober.mismatches and not prober.errors
          and after == reference and srv.alive())
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
