#!/usr/bin/env python3
"""selftest.py: checks serve.py against a fake supd, on loopback, in bounded time.

    python3 examples/lossless/selftest.py      # exit 0: all checks passed
    python3 examples/lossless/selftest.py --under-wrk 50
                    # 50 restarts through the fake store under wrk and bench/lossless/probe.py:
                    # exit 0 when no client saw an error, a refusal or a failed request

The fake supd does what supd does for a service with `listen` and `fd_store`: it binds
the listening socket and holds it, gives each run an AF_UNIX datagram NOTIFY_SOCKET,
passes the listener (and the stored connections) as fds 3.. with LISTEN_FDS,
LISTEN_FDNAMES and LISTEN_PID (set by a small wrapper that execs serve.py, so that it is
the server's own pid), keeps the fds a run sends with FDSTORE=1 and drops them on
FDSTOREREMOVE=1. Its clients hold keep-alive connections across the restarts and check
that each gets its answer on the same connection.

Waits are on events (an answer, a datagram, a line of the server's log, an exit), each
with a deadline, never a guessed sleep. Every process it starts is killed (by its pid)
when it ends; its files are in a temp dir that it removes.
"""

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SERVE = os.path.join(HERE, "serve.py")
STEP = 10.0  # the deadline of any one wait

# Moves the fds named in argv[1] to 3, 4, ..., sets LISTEN_PID to its own pid (which
# the exec keeps) and execs the rest of argv: what supd's child does before its exec.
WRAPPER = r"""
import fcntl, os, sys
fds = [int(x) for x in sys.argv[1].split(",") if x]
high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in fds]
for fd in fds:
    os.close(fd)
for i, fd in enumerate(high):
    os.dup2(fd, 3 + i)  # inheritable
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(sys.argv[2], sys.argv[2:])
"""


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


class Run:
    """One run of serve.py, its output read from a pipe (and kept in a file)."""

    def __init__(self, proc, log_path):
        self.proc = proc
        self.log_path = log_path
        self.buf = ""
        os.set_blocking(proc.stdout.fileno(), False)

    def _read(self, timeout):
        """Reads what the run wrote, waiting up to `timeout` for some; False at its end."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return True
        data = self.proc.stdout.read()
        if not data:
            return False
        text = data.decode(errors="replace")
        self.buf += text
        with open(self.log_path, "a") as f:
            f.write(text)
        return True

    def log(self):
        """All it wrote so far (what is waiting in the pipe read now)."""
        while select.select([self.proc.stdout], [], [], 0)[0] and self._read(0):
            pass
        return self.buf

    def wait_log(self, text):
        """Waits until the run has written `text`, woken by its output, within STEP."""
        end = time.monotonic() + STEP
        while text not in self.log():
            left = end - time.monotonic()
            if left <= 0 or not self._read(left) and text not in self.buf:
                raise Fail(f"serve.py never logged {text!r}; its log:\n{self.buf}")

    def wait_exit(self, deadline=STEP):
        try:
            return self.proc.wait(deadline)
        except subprocess.TimeoutExpired:
            raise Fail(f"serve.py did not exit within {deadline} s; its log:\n{self.log()}")


class FakeSupd:
    def __init__(self, tmp):
        self.tmp = tmp
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self.notify_path = os.path.join(tmp, "notify.sock")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.stored = []  # (name, fd) the runs sent with FDSTORE=1
        self.runs = []
        self.count = 0

    def spawn(self, args, fds=None, env=None, direct=False):
        """Starts serve.py with `args`. `fds` (a list of (name, fd)) go to 3.. with
        LISTEN_*; None: plain mode. `direct` runs the file itself (its #! line)."""
        self.count += 1
        log_path = os.path.join(self.tmp, f"run{self.count}.log")
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "NOTIFY_SOCKET": self.notify_path}
        full_env.update(env or {})
        prog = [SERVE] if direct else [sys.executable, SERVE]
        pass_fds = ()
        if fds is not None:
            full_env["LISTEN_FDS"] = str(len(fds))
            full_env["LISTEN_FDNAMES"] = ":".join(name for name, _ in fds)
            pass_fds = tuple(fd for _, fd in fds)
            argv = [sys.executable, "-c", WRAPPER, ",".join(map(str, pass_fds)),
                    sys.executable, SERVE] + args
        else:
            argv = prog + args
        proc = subprocess.Popen(argv, env=full_env, pass_fds=pass_fds,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        run = Run(proc, log_path)
        self.runs.append(run)
        return run

    def message(self, run, deadline=STEP):
        """The next datagram on the notify socket: (its text, its fds)."""
        end = time.monotonic() + deadline
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise Fail(f"no notify datagram within {deadline} s; serve.py's log:\n{run.log()}")
            self.notify.settimeout(min(left, 0.2))
            try:
                data, fds, _, _ = socket.recv_fds(self.notify, 4096, 253)
                return data.decode(), fds
            except socket.timeout:
                if run.proc.poll() is not None and run.proc.returncode != 0:
                    raise Fail(f"serve.py exited {run.proc.returncode}; its log:\n{run.log()}")

    def expect(self, run, text):
        msg, fds = self.message(run)
        check(msg.startswith(text) and not fds,
              f"expected {text!r} on NOTIFY_SOCKET, got {msg!r} with {len(fds)} fd(s)")
        return msg

    def collect_store(self, run):
        """What a stopping run sends until it exits: the stored fds are kept, as supd
        keeps them; anything but FDSTORE=1 is a failure. Returns the exit code."""
        end = time.monotonic() + STEP
        while True:
            self.notify.settimeout(0.05)
            try:
                data, fds, _, _ = socket.recv_fds(self.notify, 4096, 253)
            except socket.timeout:
                if run.proc.poll() is not None:
                    # Its last datagrams went before its exit: none is left behind now.
                    self.notify.setblocking(False)
                    try:
                        data, fds, _, _ = socket.recv_fds(self.notify, 4096, 253)
                    except BlockingIOError:
                        return run.proc.returncode
                elif time.monotonic() > end:
                    raise Fail(f"serve.py did not exit within {STEP} s; its log:\n{run.log()}")
                else:
                    continue
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            check(fields.get("FDSTORE") == "1" and fds,
                  f"a stopping run sent {data!r} with {len(fds)} fd(s): expected FDSTORE=1 with fds")
            self.stored += [(fields.get("FDNAME", "stored"), fd) for fd in fds]

    def take_store(self):
        """The stored fds for the next run's LISTEN_FDS (supd keeps them until it hears
        FDSTOREREMOVE=1)."""
        return list(self.stored)

    def remove_store(self, name):
        for n, fd in self.stored:
            if n == name:
                os.close(fd)
        self.stored = [(n, fd) for n, fd in self.stored if n != name]

    def end(self):
        for run in self.runs:
            if run.proc.poll() is None:
                run.proc.kill()
            run.proc.wait()
        for _, fd in self.stored:
            os.close(fd)
        self.listener.close()
        self.notify.close()


class Client:
    """A keep-alive HTTP/1.1 client on one connection."""

    def __init__(self, addr, family=socket.AF_INET):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.settimeout(STEP)
        self.sock.connect(addr)
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data)

    def request(self, method="GET", path="/", headers=(), body=b""):
        head = [f"{method} {path} HTTP/1.1", "Host: selftest"] + list(headers)
        if body:
            head.append(f"Content-Length: {len(body)}")
        self.send(("\r\n".join(head) + "\r\n\r\n").encode() + body)

    def response(self, to_head=False):
        """(status, headers, body) of the next response (`to_head`: to a HEAD, no body)."""
        try:
            while b"\r\n\r\n" not in self.buf:
                self._more()
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            n = 0 if to_head else int(headers.get("content-length", "0"))
            while len(self.buf) < n:
                self._more()
            body, self.buf = self.buf[:n], self.buf[n:]
            return status, headers, body.decode()
        except socket.timeout:
            raise Fail(f"no answer within {STEP} s")

    def _more(self):
        data = self.sock.recv(65536)
        if not data:
            raise Fail("the connection was closed before a whole answer")
        self.buf += data

    def get(self, version, headers=()):
        """A GET whose answer must be 200 with `version`; returns the headers."""
        self.request(headers=headers)
        return self.expect(version)

    def expect(self, version):
        status, headers, body = self.response()
        check(status == 200 and body == f"{version}\n",
              f"expected 200 {version!r}, got {status} {body!r}")
        return headers

    def expect_eof(self, deadline=STEP):
        self.sock.settimeout(deadline)
        try:
            data = self.sock.recv(1)
        except socket.timeout:
            raise Fail(f"the connection stayed open {deadline} s")
        except ConnectionResetError:
            raise Fail("the connection was reset, not closed")
        finally:
            self.sock.settimeout(STEP)
        check(data == b"" and not self.buf, f"expected the connection's end, got {data!r}")

    def close(self):
        self.sock.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def store_across_restarts(sup):
    """Listen fds and the fd store: connections keep their answers across two restarts
    with --store and end cleanly after a third without it."""
    addr = ("127.0.0.1", sup.port)
    run1 = sup.spawn(["--version", "1.0.0", "--store"], [("web", sup.listener.fileno())])
    sup.expect(run1, "READY=1")
    a = Client(addr)
    a.get("1.0.0")
    b = Client(addr)
    b.send(b"POST /b HTTP/1.1\r\nHost: selftest\r\nContent-Length: 10\r\n\r\nhello")
    d = Client(addr)  # connected, says nothing
    c = Client(addr)
    # Once c's request is answered, b's bytes and d's connection (both earlier) are
    # in the server: a single-threaded loop saw them ready in the same turn at the latest.
    c.get("1.0.0")

    run1.proc.send_signal(signal.SIGTERM)
    run1.wait_log("stopping")
    # The rest of b's request, and the start of its next one in the same segment.
    b.send(b"worldGET /next HTTP/1.1\r\nHo")
    b.expect("1.0.0")  # its request was begun before the stop: the old run finishes it
    code = sup.collect_store(run1)
    check(code == 0, f"run 1 exited {code} after SIGTERM, not 0; its log:\n{run1.log()}")
    names = [n for n, _ in sup.stored]
    check(names == ["conn"] * 4, f"expected 4 connections stored as 'conn', got {names}")
    print(f"  run 1: 4 idle connections stored, a request begun before the stop answered")

    a.request(path="/after")  # sent while no run is there: its bytes wait in the kernel
    b.send(b"st: selftest\r\n\r\n")  # the old run read none of its next request
    e = Client(addr)  # connects while no run is there: waits in the held backlog
    e.request()
    run2 = sup.spawn(["--version", "2.0.0", "--store"],
                     [("web", sup.listener.fileno())] + sup.take_store())
    msg = sup.expect(run2, "FDSTOREREMOVE=1")
    check("FDNAME=conn" in msg, f"FDSTOREREMOVE without FDNAME=conn: {msg!r}")
    sup.remove_store("conn")
    sup.expect(run2, "READY=1")
    a.expect("2.0.0")  # the same connection, answered by the next run
    e.expect("2.0.0")
    b.expect("2.0.0")
    for client in (b, c, d):
        client.get("2.0.0")
    a.request("POST", body=b"x" * 200_000)
    a.expect("2.0.0")
    a.send(b"POST /e HTTP/1.1\r\nHost: s\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    status, _, _ = a.response()
    check(status == 100, f"Expect: 100-continue got {status}, not 100 first")
    a.send(b"abcde")
    a.expect("2.0.0")
    a.send(b"GET /1 HTTP/1.1\r\nHost: s\r\n\r\nHEAD /2 HTTP/1.1\r\nHost: s\r\n\r\n")
    a.expect("2.0.0")
    status, headers, body = a.response(to_head=True)
    check(status == 200 and body == "" and headers.get("content-length") == "6",
          f"HEAD: got {status} {headers} {body!r}")
    headers = b.get("2.0.0", ["Connection: close"])
    check(headers.get("connection") == "close", f"no Connection: close in {headers}")
    b.expect_eof(2.0)  # no copy of it is left anywhere: it really ends
    print("  run 2: the 4 stored connections and one from the backlog answered on the same "
          "connections; FDSTOREREMOVE before READY; Connection: close ends one")

    run2.proc.send_signal(signal.SIGTERM)
    code = sup.collect_store(run2)
    check(code == 0, f"run 2 exited {code}")
    check(len(sup.stored) == 4, f"expected 4 stored by run 2, got {len(sup.stored)}")

    # Run 3 has no --store: at its stop each idle connection gets one more answer,
    # marked Connection: close, or is closed after 2 s of silence.
    run3 = sup.spawn(["--version", "3.0.0"], [("web", sup.listener.fileno())] + sup.take_store())
    sup.expect(run3, "FDSTOREREMOVE=1")
    sup.remove_store("conn")
    sup.expect(run3, "READY=1")
    c.get("3.0.0")
    run3.proc.send_signal(signal.SIGTERM)
    run3.wait_log("stopping")
    t0 = time.monotonic()
    headers = a.get("3.0.0")
    check(headers.get("connection") == "close", f"an answer during a stop without --store "
          f"should say Connection: close: {headers}")
    a.expect_eof(2.0)
    for client in (c, d, e):
        client.expect_eof(4.0)
    waited = time.monotonic() - t0
    code = sup.collect_store(run3)
    check(code == 0, f"run 3 exited {code}")
    check(not sup.stored, f"run 3 (no --store) stored {len(sup.stored)} fds")
    print(f"  run 3 (no --store): its stop answered one with Connection: close, closed "
          f"3 silent ones after {waited:.1f} s, stored nothing")
    for client in (a, b, c, d, e):
        client.close()


def slow_start(sup):
    """--start-ms: connections made before the server took its listener are answered."""
    run = sup.spawn(["--version", "4.0.0", "--start-ms", "300"], [("web", sup.listener.fileno())])
    t0 = time.monotonic()
    early = Client(("127.0.0.1", sup.port))
    early.request()
    sup.expect(run, "READY=1")
    ready = time.monotonic() - t0
    early.expect("4.0.0")
    run.proc.send_signal(signal.SIGTERM)
    early.expect_eof(4.0)
    check(sup.collect_store(run) == 0, "the slow run did not exit 0")
    check(ready >= 0.3, f"READY=1 came after {ready:.2f} s, before --start-ms 300")
    early.close()
    print(f"  --start-ms 300: READY=1 after {ready:.2f} s; a request sent before it answered")


def stop_during_slow_start(sup):
    """A SIGTERM while a run still sleeps (--start-ms) ends it gracefully once it has
    its sockets: the connection it was given goes back to the store, unanswered or
    answered, never lost."""
    z = Client(("127.0.0.1", sup.port))
    accepted, _ = sup.listener.accept()  # as if an earlier run had stored it
    sup.stored.append(("conn", accepted.detach()))
    z.request(path="/z")
    run = sup.spawn(["--version", "6.0.0", "--store", "--start-ms", "500"],
                    [("web", sup.listener.fileno())] + sup.take_store())
    run.wait_log("a slow start")  # its signals are caught from then on
    run.proc.send_signal(signal.SIGTERM)
    sup.expect(run, "FDSTOREREMOVE=1")
    sup.remove_store("conn")
    sup.expect(run, "READY=1")
    check(sup.collect_store(run) == 0, f"a run stopped during its start exited non-zero:\n{run.log()}")
    check(len(sup.stored) == 1, f"expected the connection back in the store, got {len(sup.stored)} fds")
    run = sup.spawn(["--version", "7.0.0"], [("web", sup.listener.fileno())] + sup.take_store())
    sup.expect(run, "FDSTOREREMOVE=1")
    sup.remove_store("conn")
    sup.expect(run, "READY=1")
    status, _, body = z.response()
    check(status == 200 and body in ("6.0.0\n", "7.0.0\n"), f"got {status} {body!r}")
    answered = ("answered by the stopping run, then stored" if body == "6.0.0\n"
                else "stored unanswered, answered by the next run")
    run.proc.send_signal(signal.SIGTERM)
    z.expect_eof(4.0)
    check(sup.collect_store(run) == 0, "the run after did not exit 0")
    z.close()
    print(f"  SIGTERM during --start-ms: exit 0, the connection kept ({answered}: {body.strip()})")


def store_refused(sup):
    """When the store cannot be reached at the stop, the idle connections are served
    as without --store: one more answer, with Connection: close."""
    path = os.path.join(sup.tmp, "notify-gone.sock")
    gone = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    gone.bind(path)
    gone.settimeout(STEP)
    run = sup.spawn(["--version", "8.0.0", "--store"], [("web", sup.listener.fileno())],
                    env={"NOTIFY_SOCKET": path})
    try:
        check(gone.recv(4096).startswith(b"READY=1"), "no READY=1")
    except socket.timeout:
        raise Fail(f"no READY=1 within {STEP} s; its log:\n{run.log()}")
    gone.close()  # the "supervisor" is gone: FDSTORE=1 will be refused
    q = Client(("127.0.0.1", sup.port))
    q.get("8.0.0")
    run.proc.send_signal(signal.SIGTERM)
    run.wait_log("could not be stored")
    headers = q.get("8.0.0")
    check(headers.get("connection") == "close", f"no Connection: close: {headers}")
    q.expect_eof(2.0)
    code = run.wait_exit()
    check(code == 0, f"exited {code}")
    q.close()
    print("  a refused FDSTORE=1: the idle connection got one more answer, with Connection: close")


def store_max(sup):
    """--store-max 1 with two idle connections: one is stored, the other gets one
    more answer with Connection: close."""
    run = sup.spawn(["--version", "9.0.0", "--store", "--store-max", "1"],
                    [("web", sup.listener.fileno())])
    sup.expect(run, "READY=1")
    m = Client(("127.0.0.1", sup.port))
    n = Client(("127.0.0.1", sup.port))
    m.get("9.0.0")
    n.get("9.0.0")
    run.proc.send_signal(signal.SIGTERM)
    run.wait_log("could not be stored")
    for client in (m, n):
        client.request()
    # The one stored gets no answer from this run; the other one does, and its end.
    code = sup.collect_store(run)
    check(code == 0, f"exited {code}")
    check(len(sup.stored) == 1, f"expected 1 stored (--store-max 1), got {len(sup.stored)}")
    run = sup.spawn(["--version", "9.0.1"], [("web", sup.listener.fileno())] + sup.take_store())
    sup.expect(run, "FDSTOREREMOVE=1")
    sup.remove_store("conn")
    sup.expect(run, "READY=1")
    answers = sorted((m.response()[2], n.response()[2]))
    check(answers == ["9.0.0\n", "9.0.1\n"], f"expected one answer from each run, got {answers}")
    run.proc.send_signal(signal.SIGTERM)
    check(sup.collect_store(run) == 0, "the run after did not exit 0")
    m.close()
    n.close()
    print("  --store-max 1: one connection stored (answered by the next run), the other "
          "answered by the stopping run")


def plain(sup):
    """Plain mode: it binds its own port and ends its connections cleanly on SIGTERM."""
    port = free_port()
    run = sup.spawn(["--bind", f"127.0.0.1:{port}", "--version", "1.0.0"],
                    env={"LISTEN_FDS": "1", "LISTEN_PID": "1"}, direct=True)
    sup.expect(run, "READY=1")
    addr = ("127.0.0.1", port)
    f = Client(addr)
    f.get("1.0.0")
    g = Client(addr)
    g.send(b"GET /partial HTTP/1.1\r\nHo")
    h = Client(addr)
    h.get("1.0.0")  # g's partial request is read now (see store_across_restarts)
    run.proc.send_signal(signal.SIGTERM)
    run.wait_log("stopping")
    try:
        Client(addr)
        raise Fail("a connection after the stop was accepted in plain mode")
    except ConnectionRefusedError:
        pass
    g.send(b"st: selftest\r\n\r\n")
    headers = g.expect("1.0.0")
    check(headers.get("connection") == "close", f"no Connection: close: {headers}")
    g.expect_eof(2.0)
    f.get("1.0.0")
    f.expect_eof(2.0)
    h.expect_eof(4.0)
    check(sup.collect_store(run) == 0, "plain run did not exit 0")
    check(not sup.stored, "a run without --store stored fds")
    check("not us" in run.log(), "LISTEN_PID of another process was not said to be ignored")
    for client in (f, g, h):
        client.close()

    path = os.path.join(sup.tmp, "web.sock")
    run = sup.spawn(["--bind", f"unix:{path}", "--version", "5.0.0"])
    sup.expect(run, "READY=1")
    u = Client(path, socket.AF_UNIX)
    u.get("5.0.0")
    run.proc.send_signal(signal.SIGTERM)
    u.expect_eof(4.0)
    check(sup.collect_store(run) == 0, "the unix-socket run did not exit 0")
    u.close()
    print("  plain: bound its port (LISTEN_PID of another process ignored), refused new "
          "connections at once on SIGTERM, finished a partial request, ended with "
          "Connection: close; unix:PATH served")


def crash(sup):
    run = sup.spawn(["--version", "9.9.9", "--crash"], [("web", sup.listener.fileno())])
    code = run.wait_exit()
    check(code == 1, f"--crash exited {code}, not 1")
    sup.notify.setblocking(False)
    try:
        data = sup.notify.recv(4096)
        raise Fail(f"--crash sent {data!r}")
    except BlockingIOError:
        pass
    print("  --crash: exit 1 at once, nothing sent")


def under_load(sup, restarts):
    """`--under-wrk N`: N restarts through the fake store, 100 ms apart, under wrk
    (`-t1 -c16`) and bench/lossless/probe.py; any error, refusal or failure fails."""
    url = f"http://127.0.0.1:{sup.port}/"
    probe_py = os.path.join(HERE, "..", "..", "bench", "lossless", "probe.py")
    run = sup.spawn(["--version", "1.0.0", "--store"], [("web", sup.listener.fileno())])
    sup.expect(run, "READY=1")
    loads = []
    try:
        loads.append(subprocess.Popen(["wrk", "-t1", "-c16", "-d600s", "--timeout", "10s", url],
                                      stdout=subprocess.PIPE, text=True))
        loads.append(subprocess.Popen([sys.executable, probe_py, str(sup.port)],
                                      stdout=subprocess.PIPE, text=True))
        stored = []
        t0 = time.monotonic()
        for i in range(restarts):
            time.sleep(0.1)  # a load between two restarts, not a wait for an event
            run.proc.send_signal(signal.SIGTERM)
            code = sup.collect_store(run)
            check(code == 0, f"restart {i + 1}: exited {code}")
            stored.append(len(sup.stored))
            run = sup.spawn(["--version", "1.0.0", "--store"],
                            [("web", sup.listener.fileno())] + sup.take_store())
            if sup.stored:
                sup.expect(run, "FDSTOREREMOVE=1")
                sup.remove_store("conn")
            sup.expect(run, "READY=1")
        took = time.monotonic() - t0
        for load in loads:
            load.send_signal(signal.SIGINT)
        wrk_out, probe_out = (load.communicate(timeout=STEP)[0] for load in loads)
    finally:
        for load in loads:
            if load.poll() is None:
                load.kill()
                load.wait()
    summary = [line.strip() for line in wrk_out.splitlines() if "requests in" in line
               or "errors" in line or "Non-2xx" in line]
    print(f"  {restarts} restarts in {took:.1f} s, {min(stored)} to {max(stored)} connections "
          f"stored at each; wrk: {'; '.join(summary)}; probe: {probe_out.strip()}")
    figures = probe_out.split()
    check(len(summary) == 1 and figures[3] == "0" and figures[5] == "0",
          "a restart cost the clients something (above)")


def main():
    restarts = None
    if sys.argv[1:2] == ["--under-wrk"] and len(sys.argv) == 3 and sys.argv[2].isdigit():
        restarts = int(sys.argv[2])
    elif sys.argv[1:]:
        print("usage: selftest.py [--under-wrk RESTARTS]", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="serve-selftest.")
    sup = FakeSupd(tmp)
    start = time.monotonic()
    try:
        if restarts is not None:
            print("under_load:")
            under_load(sup, restarts)
        else:
            for case in (store_across_restarts, slow_start, stop_during_slow_start,
                         store_refused, store_max, plain, crash):
                print(f"{case.__name__}:")
                case(sup)
    except (Fail, OSError) as e:
        where = traceback.extract_tb(e.__traceback__)
        where = [f for f in where if f.name not in ("check", "expect", "get", "response", "_more")][-1]
        print(f"selftest FAILED: {e}\n  at selftest.py:{where.lineno}: {where.line}", file=sys.stderr)
        for i, run in enumerate(sup.runs, 1):
            print(f"--- serve.py run {i}, its log:\n{run.log()}", file=sys.stderr, end="")
        return 1
    finally:
        sup.end()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"selftest: all passed in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
