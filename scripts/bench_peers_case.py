"""Turns one pgbench or redis-benchmark run into a `rheo-bench --json`
result (the shape `rheo-bench --from` reads), for scripts/bench-peers.

    python3 bench_peers_case.py pgbench DIR WORKLOAD CLIENTS EVENTS_PER_TXN FSYNC_RATE PORT
    python3 bench_peers_case.py redis-benchmark DIR WORKLOAD CLIENTS 1 FSYNC_RATE PORT
"""
import csv
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timezone


def percentile(sorted_values, q):
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def case(backend, tool, workload, clients, per, events, secs, p50, p99, mx, fsync, durable, url, latency_of):
    return {
        "backend": backend, "url": url, "stream": "", "peer": True, "tool": tool, "workload": workload,
        "processes": 1,
        "producers": clients if workload.startswith("append") else 0,
        "consumers": clients if workload == "consume" else 0,
        "batch": per, "payload_bytes": 200, "partitions": 1, "events": events, "ops": events // max(per, 1),
        "secs": secs, "events_per_sec": events / max(secs, 1e-9), "latency_of": latency_of,
        "latency": {"p50_us": int(p50), "p99_us": int(p99), "max_us": int(mx)},
        "fsync_per_sec": fsync if durable else None, "durable": durable, "load": load(), "round": 0,
    }


def pgbench(d, workload, clients, per, fsync, port):
    out = open(os.path.join(d, "out.txt")).read()
    tps = float(re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out).group(1))
    lat = []
    for name in os.listdir(d):
        if name.startswith("pgb"):
            with open(os.path.join(d, name)) as f:
                lat.extend(int(line.split()[2]) for line in f if line.strip())
    lat.sort()
    events = len(lat) * per
    secs = len(lat) / tps
    what = {"append": "one INSERT of a payload the client sends",
            "append-batch": "one INSERT of 100 payloads the client sends",
            "consume": "claim 100 (UPDATE ... FOR UPDATE SKIP LOCKED ... RETURNING id, payload) + DELETE"}[workload]
    return case("postgres SKIP LOCKED queue", "pgbench", workload, clients, per, events, secs,
                percentile(lat, 0.5), percentile(lat, 0.99), lat[-1] if lat else 0, fsync, True,
                f"postgres://127.0.0.1:{port}/", what)


def redis_benchmark(d, workload, clients, per, fsync, port):
    rows = list(csv.DictReader(open(os.path.join(d, "out.csv"))))
    row = rows[-1]
    cfg = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), "config", "get", "append*"],
                         capture_output=True, text=True, check=True).stdout.split()
    cfg = dict(zip(cfg[::2], cfg[1::2]))
    aof = f"aof {cfg.get('appendfsync')}" if cfg.get("appendonly") == "yes" else "no aof"
    rps = float(row["rps"])
    events = int(sys.argv[8]) if len(sys.argv) > 8 else 0
    ms = lambda k: float(row[k]) * 1000
    secs = events / rps if events else 1.0
    return case(f"redis-benchmark XADD ({aof})", "redis-benchmark", workload, clients, per,
                events or int(rps), secs, ms("p50_latency_ms"), ms("p99_latency_ms"), ms("max_latency_ms"), fsync,
                aof == "aof always", f"redis://127.0.0.1:{port}/", "one XADD")


def main():
    tool, d, workload, clients, per, fsync, port = sys.argv[1:8]
    fn = pgbench if tool == "pgbench" else redis_benchmark
    c = fn(d, workload, int(clients), int(per), float(fsync), port)
    print(json.dumps({"cases": [c], "fsync": [], "skipped": []}))


if __name__ == "__main__":
    main()
