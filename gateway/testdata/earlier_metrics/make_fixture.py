"""Writes earlier.txt: the /metrics text the earlier Infera server (AMD-AGI/Infera,
infera/server/metrics.py) exposed after a fixed scenario, rendered by the Python
prometheus_client it used. The metric definitions below restate that module's facts
(names, types, label names, bucket bounds); the help texts are placeholders, which the
Rust test does not compare. gateway/src/metrics_pin_tests.rs drives the same scenario
through the gateway's metrics and compares every series.

    python3 make_fixture.py   # rewrites earlier.txt (prometheus-client pinned in
                              # proto/testdata/requirements.txt)
"""

import os

os.environ["PROMETHEUS_DISABLE_CREATED_SERIES"] = "True"

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest  # noqa: E402

BLOCKS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, float("inf"))
REQUEST = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf"))
PD_LEG = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf"))

# Worker ids as the earlier launchers registered them (host:port).
MIXED, PREFILL, DECODE = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"

r = CollectorRegistry()
H = "fixture"
picks = Counter("infera_router_picks_total", H, ("role", "worker_id"), registry=r)
cache_hits = Histogram("infera_router_pick_cache_hits", H, ("role",), buckets=BLOCKS, registry=r)
request_blocks = Histogram("infera_router_pick_request_blocks", H, ("role",), buckets=BLOCKS, registry=r)
duration = Histogram("infera_request_duration_seconds", H, ("router", "outcome"), buckets=REQUEST, registry=r)
inflight = Gauge("infera_request_inflight", H, ("router",), registry=r)
pd_leg = Histogram("infera_pd_dispatch_duration_seconds", H, ("leg", "worker_id"), buckets=PD_LEG, registry=r)
migrations = Counter("infera_migrations_total", H, ("reason",), registry=r)
migrations_failed = Counter("infera_migrations_failed_total", H, ("reason",), registry=r)
bootstrap = Counter("infera_pd_bootstrap_failures_total", H, ("reason",), registry=r)
active = Gauge("infera_active_workers", H, ("disagg_mode",), registry=r)
breaker_state = Gauge("infera_router_worker_breaker_state", H, ("worker_id",), registry=r)
breaker_trips = Counter("infera_router_worker_breaker_trips_total", H, ("worker_id",), registry=r)
active_blocks = Gauge("infera_policy_active_blocks", H, ("worker_id",), registry=r)
view_size = Gauge("infera_policy_cache_view_size", H, ("worker_id",), registry=r)
cache_control = Counter("infera_cache_control_seen_total", H, ("retention",), registry=r)
locality = Counter("infera_cache_locality_skipped_total", H, ("reason",), registry=r)

# The scenario (metrics_pin_tests.rs repeats it step for step).
picks.labels("mixed", MIXED).inc()
picks.labels("mixed", MIXED).inc()
picks.labels("prefill", PREFILL).inc()
picks.labels("decode", DECODE).inc()
cache_hits.labels("mixed").observe(3)
cache_hits.labels("prefill").observe(0)
request_blocks.labels("mixed").observe(5)
request_blocks.labels("prefill").observe(2)
duration.labels("mixed", "ok").observe(0.02)
duration.labels("disagg", "ok").observe(0.3)
inflight.labels("mixed").inc()
inflight.labels("mixed").inc()
pd_leg.labels("prefill", PREFILL).observe(0.2)
pd_leg.labels("decode", DECODE).observe(0.04)
migrations.labels("stream_broken").inc()
migrations_failed.labels("no_candidate").inc()
bootstrap.labels("prefill_unreachable").inc()
for mode in ("mixed", "prefill", "decode"):
    active.labels(mode).set(1)
breaker_state.labels(MIXED).set(2)  # open
breaker_trips.labels(MIXED).inc()
active_blocks.labels(MIXED).set(3)
view_size.labels(MIXED).set(4)
cache_control.labels("long").inc()
locality.labels("multimodal").inc()
locality.labels("multimodal").inc()

with open("earlier.txt", "wb") as f:
    f.write(generate_latest(r))
