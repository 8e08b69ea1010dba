"""Server metrics in the Prometheus text exposition format (no client library needed).

Counters and histograms are updated only on the event-loop thread; engine gauges come from the
``Engine.stats()`` snapshot the engine thread publishes, so rendering needs no lock.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anycore.outputs import EngineStats

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # last one: +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += times
        self.sum += value * times
        self.count += times

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, c in zip(self.buckets, self.counts):
            cumulative += c
            lines.append(f'{name}_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum {self.sum:.6f}")
        lines.append(f"{name}_count {self.count}")
        return lines


class ServerMetrics:
    def __init__(self) -> None:
        self.requests_received = 0
        self.requests_rejected: Counter[str] = Counter()  # by HTTP status
        self.requests_finished: Counter[str] = Counter()  # by finish reason
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram(_TTFT_BUCKETS)
        self.itl = Histogram(_ITL_BUCKETS)
        self.e2e = Histogram(_E2E_BUCKETS)

    def on_arrival(self, n: int) -> None:
        self.requests_received += n

    def on_rejected(self, status: int) -> None:
        self.requests_rejected[str(status)] += 1

    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_inter_token(self, seconds: float, num_tokens: int) -> None:
        # a step that yields several tokens (speculative decoding) spreads its gap over them
        self.itl.observe(seconds / max(num_tokens, 1), max(num_tokens, 1))

    def on_tokens(self, n: int) -> None:
        self.generation_tokens += n

    def on_finished(self, reason: str | None, prompt_tokens: int, cached_tokens: int, seconds: float | None) -> None:
        self.requests_finished[reason or "unknown"] += 1
        self.prompt_tokens += prompt_tokens
        self.cached_prompt_tokens += cached_tokens
        if seconds is not None:
            self.e2e.observe(seconds)

    def render(self, stats: EngineStats, num_snapshots: int, num_queued: int, model_name: str, ready: bool) -> str:
        out: list[str] = []

        def metric(name: str, kind: str, help_text: str, value: float | int, labels: str = "") -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            out.append(f"{name}{labels} {value}")

        def labelled(name: str, kind: str, help_text: str, label: str, values: Counter[str]) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            for key in sorted(values):
                out.append(f'{name}{{{label}="{key}"}} {values[key]}')

        metric("anycore_ready", "gauge", "1 once the model is loaded and serving", int(ready),
               f'{{model="{model_name}"}}')
        metric("anycore_requests_received_total", "counter", "Sub-requests admitted (n samples count n times)",
               self.requests_received)
        labelled("anycore_requests_finished_total", "counter", "Sub-requests finished, by finish reason",
                 "finish_reason", self.requests_finished)
        labelled("anycore_requests_rejected_total", "counter", "HTTP requests rejected, by status code",
                 "status", self.requests_rejected)
        metric("anycore_prompt_tokens_total", "counter", "Prompt tokens of finished requests", self.prompt_tokens)
        metric("anycore_cached_prompt_tokens_total", "counter", "Prompt tokens served from the prefix cache",
               self.cached_prompt_tokens)
        metric("anycore_generation_tokens_total", "counter", "Generated tokens", self.generation_tokens)
        out += self.ttft.render("anycore_time_to_first_token_seconds", "Arrival to first generated token")
        out += self.itl.render("anycore_inter_token_latency_seconds", "Gap between successive tokens of a request")
        out += self.e2e.render("anycore_e2e_request_latency_seconds", "Arrival to finish")
        metric("anycore_num_requests_queued", "gauge", "Admitted sub-requests that have produced no token yet",
               num_queued)
        metric("anycore_num_requests_waiting", "gauge", "Requests in the scheduler's waiting queue", stats.num_waiting)
        metric("anycore_num_requests_running", "gauge", "Requests in the running batch", stats.num_running)
        metric("anycore_kv_slots_total", "gauge", "KV pool size in token slots", stats.kv_slots_total)
        metric("anycore_kv_slots_used", "gauge", "KV slots not free (requests + prefix cache)", stats.kv_slots_used)
        metric("anycore_kv_slots_held", "gauge", "KV slots pinned by live requests", stats.kv_slots_held)
        metric("anycore_kv_slots_cached", "gauge", "KV slots held only by the prefix cache (evictable)",
               stats.kv_slots_cached)
        usage = stats.kv_slots_held / stats.kv_slots_total if stats.kv_slots_total else 0.0
        metric("anycore_kv_cache_usage_ratio", "gauge", "Fraction of KV slots pinned by live requests", f"{usage:.6f}")
        metric("anycore_prefix_cache_queried_tokens_total", "counter", "Prompt tokens looked up in the prefix cache",
               stats.prefix_queried_tokens)
        metric("anycore_prefix_cache_hit_tokens_total", "counter", "Prompt tokens found in the prefix cache",
               stats.prefix_hit_tokens)
        rate = stats.prefix_hit_tokens / stats.prefix_queried_tokens if stats.prefix_queried_tokens else 0.0
        metric("anycore_prefix_cache_hit_rate", "gauge", "Hit tokens / queried tokens since start", f"{rate:.6f}")
        metric("anycore_preemptions_total", "counter", "Running requests preempted for KV slots (recomputed later)",
               stats.num_preemptions)
        metric("anycore_spec_decode_verify_steps_total", "counter", "Speculative verify steps (one per request)",
               stats.spec_verify_steps)
        metric("anycore_spec_decode_draft_tokens_total", "counter", "Draft tokens proposed for verification",
               stats.spec_draft_tokens)
        metric("anycore_spec_decode_accepted_tokens_total", "counter", "Draft tokens the target accepted",
               stats.spec_accepted_tokens)
        metric("anycore_spec_decode_acceptance_rate", "gauge", "Accepted / proposed draft tokens since start",
               f"{stats.spec_acceptance_rate:.6f}")
        metric("anycore_spec_decode_acceptance_length", "gauge",
               "Mean tokens per verify step (accepted drafts + 1) since start", f"{stats.spec_acceptance_length:.6f}")
        metric("anycore_engine_steps_total", "counter", "Engine stats snapshots (steps and idle wake-ups)",
               num_snapshots)
        return "\n".join(out) + "\n"
