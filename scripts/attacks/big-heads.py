#!/usr/bin/env python3
"""200 sockets each send up to 384 KiB of unfinished header; resident memory of amble before
and after. usage: scripts/attacks/big-heads.py target/release/amble"""
import os, re, socket, subprocess, sys, time
binary = sys.argv[1]
proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0"], stderr=subprocess.PIPE, text=True,
                        env={**os.environ, "RUST_LOG": "info"})
for line in proc.stderr:
    m = re.search(r"addr=(\S+)", line)
    if m:
        host, port = m.group(1).rsplit(":", 1); break
def rss():
    for l in open(f"/proc/{proc.pid}/status"):
        if l.startswith("VmRSS:"): return int(l.split()[1]) * 1024
time.sleep(0.5); before = rss()
head = b"GET / HTTP/1.1\r\nHost: localhost\r\nX-big: " + b"a" * (384 * 1024)
socks, refused = [], 0
for _ in range(200):
    s = socket.create_connection((host, int(port))); s.setblocking(False)
    try: s.send(head)
    except OSError: pass
    socks.append(s)
time.sleep(2)
after = rss()
for s in socks:
    s.setblocking(True); s.settimeout(2)
    try:
        if s.recv(64).startswith(b"HTTP/1.1 431"): refused += 1
    except OSError: pass
print(f"200 x 384 KiB heads: rss before={before/1048576:.1f} MiB after={after/1048576:.1f} MiB "
      f"delta={(after-before)/1048576:.1f} MiB; answered 431: {refused}")
proc.terminate(); proc.wait()
