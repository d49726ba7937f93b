#!/usr/bin/env python3
"""Measure amble under a slowloris: resident memory per held socket, /healthz latency.

usage: scripts/attacks/slowloris.py target/release/amble SOCKETS HEAD_BYTES [amble flags...]
(figures in docs/security.md; the server is started fresh on a free loopback port)
"""
import os, re, socket, statistics, subprocess, sys, time

binary, n, head_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
extra = sys.argv[4:]
proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0", *extra],
                        stderr=subprocess.PIPE, text=True, env={**os.environ, "RUST_LOG": "info"})
addr = None
for line in proc.stderr:
    m = re.search(r"addr=(\S+)", line)
    if m:
        addr = m.group(1)
        break
host, port = addr.rsplit(":", 1)
port = int(port)

def rss():
    with open(f"/proc/{proc.pid}/status") as f:
        for l in f:
            if l.startswith("VmRSS:"):
                return int(l.split()[1]) * 1024

def fetch(path):
    """GET path on a fresh connection: (seconds taken, whole response)."""
    t = time.perf_counter()
    s = socket.create_connection((host, port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    return time.perf_counter() - t, data

def get(path):
    took, data = fetch(path)
    return took, data.split(b"\r\n", 1)[0].decode()

def metric(name):
    for l in fetch("/metrics")[1].decode().splitlines():
        if l.startswith(name + " "):
            return float(l.split()[1])

for _ in range(20):
    get("/healthz")
time.sleep(0.5)
before = rss()
head = b"GET / HTTP/1.1\r\nHost: localhost\r\nX-pad: " + b"a" * max(0, head_bytes - 41)
socks = []
for i in range(n):
    s = socket.create_connection((host, port))
    s.sendall(head)
    socks.append(s)
time.sleep(2)
# one more byte a second, twice
for _ in range(2):
    for s in socks:
        try:
            s.send(b"a")
        except OSError:
            pass
    time.sleep(1)
after = rss()
open_http = metric("amble_http_connections")
lat = sorted(get("/healthz")[0] * 1000 for _ in range(50))
status = get("/healthz")[1]
print(f"sockets={n} head_bytes={head_bytes} flags={' '.join(extra) or '(defaults)'}")
print(f"rss before={before/1048576:.1f} MiB after={after/1048576:.1f} MiB "
      f"delta={(after-before)/1048576:.1f} MiB; pool holds {open_http:.0f}; "
      f"per held socket={(after-before)/max(open_http-1,1):.0f} B")
print(f"/healthz under slowloris: {status}; median {statistics.median(lat):.2f} ms, "
      f"p95 {lat[int(len(lat)*0.95)]:.2f} ms, max {lat[-1]:.2f} ms")
print(f"evictions={metric('amble_http_evictions_total')}")
for s in socks:
    s.close()
proc.terminate()
proc.wait()
