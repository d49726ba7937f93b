#!/usr/bin/env python3
"""What a refused WebSocket handshake costs the server, next to GET /healthz.

Starts AMBLE (a release binary) on 127.0.0.1:0 with one worker, then, three
rounds in turn: N requests of each kind from CONC concurrent connections,
each read to its end (the server closes). Prints the server's CPU time per
request (from /proc, so Linux only) and its resident memory after each kind.

Usage: scripts/refusal-cost.py target/release/amble [N [CONC]]
Standard library only.
"""
import asyncio
import collections
import os
import re
import subprocess
import sys
import time

AMBLE = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
CONC = int(sys.argv[3]) if len(sys.argv) > 3 else 32
KEY = "dGhlIHNhbXBsZSBub25jZQ=="


def requests(port):
    up = ("GET /ws HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: Upgrade\r\n"
          "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
          "Sec-WebSocket-Key: %s\r\n" % (port, KEY))
    return {
        "healthz": b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        "origin": (up + "Origin: https://evil.example\r\n\r\n").encode(),
        "head": (up.replace("GET", "HEAD", 1) + "\r\n").encode(),
    }


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])
    return 0


async def measure(port, pid, name, request):
    seen = collections.Counter()

    async def worker(n):
        for _ in range(n):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            data = await asyncio.wait_for(reader.read(), 10)  # to EOF
            seen[data[9:12].decode()] += 1
            writer.close()

    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    await asyncio.gather(*(worker(N // CONC) for _ in range(CONC)))
    cpu1, t1 = cpu_seconds(pid), time.monotonic()
    n = sum(seen.values())
    print(f"{name:8} n={n} status={dict(seen)} wall={t1 - t0:.2f}s "
          f"server_cpu={cpu1 - cpu0:.2f}s per_request={(cpu1 - cpu0) / n * 1e6:.1f}us "
          f"rss={rss_kib(pid)}KiB", flush=True)


def main():
    server = subprocess.Popen(
        [AMBLE, "--listen", "127.0.0.1:0", "--workers", "1"],
        env={**os.environ, "RUST_LOG": "info"},
        stderr=subprocess.PIPE, text=True)
    try:
        for line in server.stderr:
            found = re.search(r"addr=127\.0\.0\.1:(\d+)", line)
            if found:
                port = int(found.group(1))
                break
        else:
            sys.exit("amble exited without reporting its address")
        kinds = requests(port)
        for _ in range(3):
            for name, request in kinds.items():
                asyncio.run(measure(port, server.pid, name, request))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
