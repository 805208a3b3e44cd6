"""A soak through a running engine-ctl gateway: N clients at once (half of them streaming), each asking in a loop
with the official `openai` package and max_retries=0 (a failure is a failure, never hidden by a retry), for a
while at each level; prints requests, failures and latency p50/p99 per level, and the first failures in full.

Run:  .venv/bin/python -m bench.gateway_soak --base http://GATEWAY:8800/v1 --key KEY --model DEPLOYMENT
          [--clients 4,16,64] [--seconds 600] [--json]

The target (issue 24): 0 failed requests at every level, also while apply rolls the deployment. Exit status 1
when any request failed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

import openai


@dataclass
class Level:
    clients: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        ordered = sorted(self.latencies)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else None
        return {
            "clients": self.clients,
            "seconds": self.seconds,
            "requests": len(self.latencies) + len(self.failures),
            "failures": len(self.failures),
            "p50_ms": round(statistics.median(ordered) * 1000, 1) if ordered else None,
            "p99_ms": round(p99 * 1000, 1) if p99 is not None else None,
            "first_failures": self.failures[:5],
        }


def ask(client: openai.OpenAI, model: str, stream: bool) -> None:
    messages = [{"role": "user", "content": "hi"}]
    if stream:
        chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=4, stream=True))  # type: ignore[arg-type]
        if not chunks:
            raise RuntimeError("a stream with no chunk")
    else:
        client.chat.completions.create(model=model, messages=messages, max_tokens=4)  # type: ignore[arg-type]


def run_level(base: str, key: str, model: str, clients: int, seconds: float) -> Level:
    level = Level(clients, seconds)
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def loop(stream: bool) -> None:
        client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)  # one pooled client each
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                ask(client, model, stream)
                with lock:
                    level.latencies.append(time.monotonic() - started)
            except Exception as exc:  # every failure of the client counts, whatever it is
                with lock:
                    level.failures.append(f"{'stream' if stream else 'plain'}: {type(exc).__name__}: {exc}"[:300])

    threads = [threading.Thread(target=loop, args=(i % 2 == 1,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return level


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the gateway's OpenAI base URL, http://HOST:8800/v1")
    parser.add_argument("--key", required=True, help="an API key the gateway accepts for the deployment")
    parser.add_argument("--model", required=True, help="the deployment's name")
    parser.add_argument("--clients", default="4,16,64", help="the levels: clients at once, comma-separated")
    parser.add_argument("--seconds", type=float, default=600, help="how long each level runs (default 10 min)")
    parser.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = parser.parse_args(argv)
    levels = []
    for n in (int(x) for x in args.clients.split(",") if x.strip()):
        level = run_level(args.base, args.key, args.model, n, args.seconds)
        levels.append(level.summary())
        if not args.json:
            s = levels[-1]
            print(f"{n:>3} clients  {s['seconds']:>6.0f} s  requests {s['requests']:>7}  failures {s['failures']:>4}"
                  f"  p50 {s['p50_ms']} ms  p99 {s['p99_ms']} ms", flush=True)  # fmt: skip
            for line in s["first_failures"]:  # type: ignore[attr-defined]
                print(f"      {line}", flush=True)
    if args.json:
        print(json.dumps({"levels": levels}, indent=2))
    return 1 if any(s["failures"] for s in levels) else 0


if __name__ == "__main__":
    sys.exit(main())
