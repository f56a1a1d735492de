#!/usr/bin/env python3
"""probe.py PORT: paced HTTP clients that count what a restart costs them.

wrk (the load beside it) cannot tell a refused connection from a broken one: with
plain sockets it never counts a connect error, a refused connect shows as a write
error, and it tries again at once, so its errors measure how long the port was
closed times its retry rate. This client keeps to a pace instead, on 127.0.0.1:PORT:

- one thread opens a fresh connection every 10 ms for one request
  (`Connection: close`);
- four threads each keep a connection alive and send a request 10 ms after each
  answer; an answer with `Connection: close` ends it cleanly (then a new one, tried
  again every 10 ms while refused).

Counted: answered (200), refused (the fresh connections refused: one is tried every
10 ms, so 100 a second while the port is closed), failed (a request that was sent
and got no whole 200 answer: reset, closed, 10 s without one), and the longest
stretch during which fresh connections were refused. Runs until SIGINT or
SIGTERM, then prints `answered N refused N failed N longest_refusal_ms N`; each
failure is told on stderr as it happens.
"""

import signal
import socket
import sys
import threading
import time

PACE = 0.010
TIMEOUT = 10.0

stop = threading.Event()
lock = threading.Lock()
counts = {"answered": 0, "refused": 0, "failed": 0}
refusal = {"since": None, "longest": 0.0}


def count(what):
    with lock:
        counts[what] += 1


def connect(port):
    """A connected socket, or None when the connect was refused."""
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    except ConnectionRefusedError:
        return None


def exchange(sock, buf, close):
    """Sends one GET and reads its answer: (ok, keep, rest of buf). A failure is told
    on stderr, with its reason."""
    kind = "fresh" if close else "kept"
    req = b"GET / HTTP/1.1\r\nHost: probe\r\n" + (b"Connection: close\r\n" if close else b"") + b"\r\n"
    try:
        sock.sendall(req)
        while b"\r\n\r\n" not in buf:
            data = sock.recv(65536)
            if not data:
                return failed(kind, "closed before an answer")
            buf += data
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").lower().split("\r\n")
        length = 0
        keep = True
        for line in lines[1:]:
            k, _, v = line.partition(":")
            if k.strip() == "content-length":
                length = int(v)
            elif k.strip() == "connection" and "close" in v:
                keep = False
        while len(buf) < length:
            data = sock.recv(65536)
            if not data:
                return failed(kind, "closed in the middle of an answer")
            buf += data
        if lines[0].split(" ")[1] != "200":
            return failed(kind, lines[0])
        return True, keep, buf[length:]
    except (OSError, ValueError, IndexError) as e:
        return failed(kind, repr(e))


def failed(kind, why):
    if not stop.is_set():
        print(f"{time.strftime('%H:%M:%S')} failed ({kind} connection): {why}",
              file=sys.stderr, flush=True)
    return False, False, b""


def fresh(port):
    while not stop.is_set():
        t = time.monotonic()
        sock = connect(port)
        with lock:
            if sock is None:
                counts["refused"] += 1
                refusal["since"] = refusal["since"] or t
            elif refusal["since"] is not None:
                refusal["longest"] = max(refusal["longest"], t - refusal["since"])
                refusal["since"] = None
        if sock is not None:
            ok, _, _ = exchange(sock, b"", close=True)
            sock.close()
            if not stop.is_set():
                count("answered" if ok else "failed")
        time.sleep(max(0.0, t + PACE - time.monotonic()))


def kept(port):
    sock, buf = None, b""
    while not stop.is_set():
        if sock is None:
            sock, buf = connect(port), b""
            if sock is None:
                time.sleep(PACE)
                continue
        ok, keep, buf = exchange(sock, buf, close=False)
        if stop.is_set():
            break
        count("answered" if ok else "failed")
        if not (ok and keep):
            sock.close()
            sock = None
        time.sleep(PACE)


def main():
    port = int(sys.argv[1])
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    threads = [threading.Thread(target=fresh, args=(port,), daemon=True)]
    threads += [threading.Thread(target=kept, args=(port,), daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    while not stop.is_set():
        stop.wait(1.0)
    for t in threads:
        t.join(1.0)  # a request in flight at the stop is not counted
    with lock:
        print(f"answered {counts['answered']} refused {counts['refused']} failed {counts['failed']} "
              f"longest_refusal_ms {refusal['longest'] * 1000:.0f}", flush=True)


if __name__ == "__main__":
    main()
