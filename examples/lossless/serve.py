#!/usr/bin/env python3
"""serve.py: a small HTTP/1.1 server that restarts without losing a connection.

It answers every request (any method, any path) with 200 and a body naming its
version ("1.0.0\\n"), keeps connections alive as HTTP/1.1 says, and reads
Content-Length bodies. One thread, one `selectors` loop, python3's standard
library only.

Where its sockets come from:

- From its supervisor, as sd_listen_fds(3) describes: when LISTEN_PID is our pid,
  fds 3 .. 3+LISTEN_FDS-1 are ours, named by LISTEN_FDNAMES (':'-separated). A
  listening socket (SO_ACCEPTCONN) is a listener; any other socket is a
  connection an earlier run stored (the fd store) and this one resumes serving.
- Otherwise it binds `--bind HOST:PORT` or `--bind unix:PATH` itself ("plain"
  mode, as under runit or s6).

On SIGTERM (or SIGINT) it stops gracefully:

1. it stops accepting at once (closes its copies of the listeners: under supd the
   listener lives on in supd, and what connects meanwhile waits in its backlog for
   the next run; in plain mode the kernel refuses and resets it);
2. it finishes every request it has partly read and answers it;
3. with `--store` (and NOTIFY_SOCKET set) it hands every idle keep-alive
   connection to its supervisor's fd store (FDSTORE=1, FDNAME=conn, the fds over
   SCM_RIGHTS) without reading the next request from it: whatever the client sent
   meanwhile stays in the kernel, and the next run, which gets the connection back
   in LISTEN_FDS, reads it (at most `--store-max N` of them: give it the
   service's fd_store, since supd refuses whole a message that would go past it).
   Without `--store` (and for those it cannot store) it
   waits up to 2 s for each idle connection's next request, answers it with
   `Connection: close`, and closes;
4. exits 0.

Bytes it has read are answered (a request begun has 10 s to arrive whole): during
the stop it reads with MSG_PEEK first and takes no byte past the end of the request
it is finishing.

Other options: `--version V` (the body), `--crash` (exit 1 at once: a broken
version), `--start-ms N` (sleep N ms before taking the sockets: a slow start).

Run it by hand:   examples/lossless/serve.py --bind 127.0.0.1:8080 --version 1.0.0
Under supd: see examples/README.md, "Lossless restarts".
"""

import argparse
import os
import selectors
import signal
import socket
import sys
import time

SD_LISTEN_FDS_START = 3  # sd_listen_fds(3): the first passed fd
STORE_NAME = "conn"  # the FDNAME of the connections we store
STORE_BATCH = 200  # fds per FDSTORE datagram (the kernel takes at most 253, SCM_MAX_FD)
IDLE_GRACE = 2.0  # without --store: how long an idle connection may take to send its last request
FINISH_GRACE = 10.0  # how long a partly read request may take to arrive whole during a stop
MAX_HEAD = 64 * 1024  # request line and headers
MAX_BODY = 16 * 1024 * 1024
READ_SIZE = 64 * 1024


def log(msg):
    print(f"serve.py[{os.getpid()}]: {msg}", file=sys.stderr, flush=True)


# --- HTTP: pure functions over the bytes read so far -------------------------------


class BadRequest(Exception):
    def __init__(self, status, reason):
        super().__init__(reason)
        self.status = status


class Request:
    """The head of one request, and where the request ends in the buffer."""

    def __init__(self, method, keep_alive, end, whole, expect_continue):
        self.method = method
        self.keep_alive = keep_alive
        self.end = end  # bytes from the buffer's start to the end of its body
        self.whole = whole  # its body is all in the buffer
        self.expect_continue = expect_continue  # the client waits for 100 Continue


def parse_request(buf):
    """The first request in `buf` once its head is there (see `whole` for its body),
    None while the head is not.

    Raises BadRequest for what cannot be a request. Empty lines before a request
    line are skipped (RFC 9112, 2.2), so `end` counts them."""
    start = 0
    while buf.startswith(b"\r\n", start):
        start += 2
    head_end = buf.find(b"\r\n\r\n", start)
    if head_end < 0:
        if len(buf) - start > MAX_HEAD:
            raise BadRequest(431, "request head too large")
        return None
    lines = bytes(buf[start:head_end]).decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(400, f"not an HTTP/1.x request line: {lines[0][:80]!r}")
    method, _, version = parts
    length = None
    connection = ""
    expect = ""
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(400, f"bad header line: {line[:80]!r}")
        name = name.lower()
        value = value.strip()
        if name == "content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                raise BadRequest(400, f"bad Content-Length: {value[:40]!r}")
            length = int(value)
        elif name == "transfer-encoding":
            # Chunked bodies are not read; refuse rather than misread the stream.
            raise BadRequest(501, "Transfer-Encoding is not supported; send Content-Length")
        elif name == "connection":
            connection += "," + value.lower()
        elif name == "expect":
            expect = value.lower()
    length = length or 0
    if length > MAX_BODY:
        raise BadRequest(413, "body too large")
    end = head_end + 4 + length
    tokens = {t.strip() for t in connection.split(",")}
    if version == "HTTP/1.0":
        keep_alive = "keep-alive" in tokens
    else:  # HTTP/1.1: keep-alive unless the client says close
        keep_alive = "close" not in tokens
    whole = len(buf) >= end
    return Request(method, keep_alive, end, whole,
                   expect == "100-continue" and version != "HTTP/1.0" and not whole)


def response(status, body, method, close, keep_alive_header=False):
    """The bytes of a response; HEAD gets the headers alone."""
    reason = {200: "OK", 400: "Bad Request", 413: "Content Too Large",
              431: "Request Header Fields Too Large", 501: "Not Implemented"}[status]
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: text/plain",
            f"Content-Length: {len(body)}"]
    if close:
        head.append("Connection: close")
    elif keep_alive_header:
        head.append("Connection: keep-alive")
    data = ("\r\n".join(head) + "\r\n\r\n").encode()
    return data if method == "HEAD" else data + body


# --- sockets from the supervisor ------------------------------------------------


def take_listen_fds():
    """The sockets sd_listen_fds(3) passes: (listeners, connections), each a list of
    (name, socket). Unsets LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES in any case, so
    that nothing we start takes them for its own."""
    pid = os.environ.pop("LISTEN_PID", None)
    count = os.environ.pop("LISTEN_FDS", None)
    names = os.environ.pop("LISTEN_FDNAMES", None)
    listeners, conns = [], []
    if pid is None or count is None:
        return listeners, conns
    if pid != str(os.getpid()):
        log(f"LISTEN_PID is {pid}, not us: the LISTEN_FDS are not ours, ignored")
        return listeners, conns
    try:
        n = int(count)
    except ValueError:
        log(f"LISTEN_FDS={count!r} is not a number: ignored")
        return listeners, conns
    names = names.split(":") if names is not None else []
    if len(names) != n:
        names = ["unknown"] * n
    for i in range(n):
        fd = SD_LISTEN_FDS_START + i
        try:
            sock = socket.socket(fileno=fd)  # family and type are read from the fd
        except OSError as e:
            log(f"fd {fd} ({names[i]}) is not a socket ({e.strerror}): left alone")
            continue
        os.set_inheritable(fd, False)
        sock.setblocking(False)
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            listeners.append((names[i], sock))
        else:
            conns.append((names[i], sock))
    return listeners, conns


def bind(spec):
    """Plain mode: binds `HOST:PORT` (SO_REUSEADDR, so a restart binds again at once
    over the old run's TIME_WAIT connections) or `unix:PATH` (a stale file replaced)."""
    if spec.startswith("unix:"):
        path = spec[len("unix:"):]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        sock.bind(path)
    else:
        host, sep, port = spec.rpartition(":")
        if not sep or not port.isdigit():
            raise SystemExit(f"serve.py: --bind {spec!r}: expected HOST:PORT or unix:PATH")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def describe(sock):
    try:
        addr = sock.getsockname()
    except OSError:
        return "?"
    if sock.family == socket.AF_UNIX:
        return f"unix:{addr}"
    return f"tcp:{addr[0]}:{addr[1]}"


class Notify:
    """The supervisor's NOTIFY_SOCKET (sd_notify(3)), or nothing when it is unset."""

    def __init__(self):
        path = os.environ.get("NOTIFY_SOCKET")
        self.sock = None
        if not path:
            return
        if path.startswith("@"):  # an abstract socket address
            path = "\0" + path[1:]
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.settimeout(2.0)  # a full socket of a wedged supervisor must not hang us
        try:
            self.sock.connect(path)
        except OSError as e:
            log(f"cannot reach NOTIFY_SOCKET {path!r}: {e.strerror}")
            self.sock = None

    def send(self, text, fds=()):
        """Sends one datagram; says whether it went."""
        if self.sock is None:
            return False
        try:
            if fds:
                socket.send_fds(self.sock, [text.encode()], list(fds))
            else:
                self.sock.send(text.encode())
            return True
        except OSError as e:
            log(f"cannot send {text.splitlines()[0]!r} to NOTIFY_SOCKET: {e.strerror or e}")
            return False


# --- the server -------------------------------------------------------------------


class Conn:
    def __init__(self, sock):
        self.sock = sock
        self.inbuf = bytearray()  # read, not yet answered: a partial request at most
        self.outbuf = bytearray()  # answered, not yet sent
        self.close_after = False  # close once outbuf is sent
        self.eof = False
        self.writing = False  # registered for EVENT_WRITE too
        self.continued = False  # 100 Continue sent for the request in inbuf

    def idle(self):
        return not self.inbuf and not self.outbuf


class Server:
    def __init__(self, version, store, store_max, notify):
        self.body = f"{version}\n".encode()
        self.store = store
        self.store_max = store_max  # None: no limit
        self.notify = notify
        self.sel = selectors.DefaultSelector()
        self.listeners = []
        self.conns = {}  # fd -> Conn
        self.stopping = None  # monotonic time of the stop, once asked
        self.to_store = []  # idle connections set aside for the fd store
        self.answered_in_stop = 0
        self.stored = 0
        # Signals arrive as a byte on this pipe, so the loop sees them between two
        # events and never in the middle of one (set_wakeup_fd also makes select()
        # return, which a Python handler alone would not: PEP 475 retries it).
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)
        self.sel.register(self.wake_r, selectors.EVENT_READ, "signal")

    def add_listener(self, sock):
        self.listeners.append(sock)
        self.sel.register(sock, selectors.EVENT_READ, "listener")

    def add_conn(self, sock):
        sock.setblocking(False)
        conn = Conn(sock)
        self.conns[sock.fileno()] = conn
        self.sel.register(sock, selectors.EVENT_READ, conn)

    def close(self, conn):
        self.sel.unregister(conn.sock)
        del self.conns[conn.sock.fileno()]
        conn.sock.close()

    # -- events

    def accept(self, listener):
        for _ in range(64):  # a burst at most, then the loop looks at the others
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE, ECONNABORTED: this one is lost, go on
                log(f"accept: {e.strerror}")
                return
            self.add_conn(sock)

    def readable(self, conn):
        try:
            if self.stopping is None:
                data = conn.sock.recv(READ_SIZE)
            else:
                data = self.read_rest_of_request(conn)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by the peer: nothing to answer to
            self.close(conn)
            return
        if not data:
            conn.eof = True
        conn.inbuf += data
        self.serve(conn)

    def read_rest_of_request(self, conn):
        """During a stop: reads the bytes that finish the request begun in inbuf (or
        the next one, without --store), never one byte past its end, so what the
        client sent after it stays in the kernel: for the next run, or unread."""
        peek = conn.sock.recv(READ_SIZE, socket.MSG_PEEK)
        if not peek:
            return b""
        try:
            req = parse_request(conn.inbuf + peek)
        except BadRequest:
            req = None  # take it all; serve() answers 400 and closes
        # Not whole: every byte peeked belongs to this request.
        take = req.end - len(conn.inbuf) if req and req.whole else len(peek)
        return conn.sock.recv(take)

    def serve(self, conn):
        """Answers every whole request in inbuf; sends what it can."""
        while conn.inbuf and not conn.close_after:
            try:
                req = parse_request(conn.inbuf)
            except BadRequest as e:
                conn.outbuf += response(e.status, f"{e}\n".encode(), "GET", close=True)
                conn.close_after = True
                conn.inbuf.clear()
                break
            if req is None:
                break
            if not req.whole:
                if req.expect_continue and not conn.continued:
                    conn.outbuf += b"HTTP/1.1 100 Continue\r\n\r\n"
                    conn.continued = True
                break
            conn.continued = False
            del conn.inbuf[:req.end]
            # Without --store a stop ends each connection after its next answer.
            close = not req.keep_alive or (self.stopping is not None and not self.storing())
            conn.outbuf += response(200, self.body, req.method, close,
                                    keep_alive_header=req.keep_alive)
            conn.close_after = close
            if self.stopping is not None:
                self.answered_in_stop += 1
        self.flush(conn)

    def flush(self, conn):
        while conn.outbuf:
            try:
                n = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.close(conn)
                return
            del conn.outbuf[:n]
        if conn.outbuf:
            if not conn.writing:
                self.sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
                conn.writing = True
            return
        if conn.close_after or conn.eof:
            # Answered and done; or the client half-closed, and what is left in inbuf
            # is a request that can never be whole.
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self.close(conn)
            return
        if conn.writing:
            self.sel.modify(conn.sock, selectors.EVENT_READ, conn)
            conn.writing = False
        if self.stopping is not None and self.storing() and conn.idle():
            self.set_aside(conn)

    # -- the stop

    def storing(self):
        return self.store and self.notify.sock is not None

    def begin_stop(self):
        self.stopping = time.monotonic()
        for sock in self.listeners:  # stop accepting; supd's copy keeps the backlog
            self.sel.unregister(sock)
            sock.close()
        self.listeners = []
        idle = sum(1 for c in self.conns.values() if c.idle())
        log(f"stopping: {len(self.conns) - idle} connection(s) with a request to finish, "
            f"{idle} idle" + (" (to the fd store)" if self.storing() else ""))
        if self.storing():
            for conn in list(self.conns.values()):
                if conn.idle():
                    self.set_aside(conn)

    def set_aside(self, conn):
        """An idle connection goes to the store: we read nothing more from it."""
        self.sel.unregister(conn.sock)
        del self.conns[conn.sock.fileno()]
        self.to_store.append(conn)

    def stop_timeout(self):
        """Seconds until the stop's next deadline."""
        now = time.monotonic()
        if not self.storing() and any(c.idle() for c in self.conns.values()):
            return max(0.0, self.stopping + IDLE_GRACE - now)
        return max(0.0, self.stopping + FINISH_GRACE - now)

    def stop_deadlines(self):
        now = time.monotonic()
        if not self.storing() and now >= self.stopping + IDLE_GRACE:
            for conn in [c for c in self.conns.values() if c.idle()]:
                self.close(conn)  # no request within the grace: nothing was read, nothing lost
        if now >= self.stopping + FINISH_GRACE and self.conns:
            log(f"stop: {len(self.conns)} connection(s) still had a request unfinished "
                f"after {FINISH_GRACE:.0f} s: closed")
            for conn in list(self.conns.values()):
                self.close(conn)

    def finish_stop(self):
        """Everything is answered: the idle connections go to the store, in batches.
        Says whether the run may end: when a batch could not be stored, its
        connections are served as without --store (one more answer, with Connection:
        close, or closed after 2 s of silence) and the loop goes on."""
        # A message that would take the store past its limit is refused whole (supd
        # closes its fds): past --store-max, connections are not offered at all.
        offered = self.to_store[:self.store_max]
        unstored = self.to_store[len(offered):]
        for i in range(0, len(offered), STORE_BATCH):
            batch = offered[i:i + STORE_BATCH]
            if self.notify.send(f"FDSTORE=1\nFDNAME={STORE_NAME}",
                                [c.sock.fileno() for c in batch]):
                for conn in batch:  # ours go; the connection lives on in the store
                    conn.sock.close()
                self.stored += len(batch)
            else:
                unstored += batch
        self.to_store = []
        if unstored:
            log(f"stop: {len(unstored)} connection(s) could not be stored (past --store-max, "
                "or refused): each gets one more answer, then is closed")
            self.store = False
            self.stopping = time.monotonic()  # the grace of an idle connection starts now
            for conn in unstored:
                self.conns[conn.sock.fileno()] = conn
                self.sel.register(conn.sock, selectors.EVENT_READ, conn)
            return False
        log(f"stopped: {self.answered_in_stop} answered during the stop, {self.stored} "
            "connection(s) stored")
        return True

    # -- the loop

    def run(self):
        while True:
            if self.stopping is not None:
                self.stop_deadlines()
                if not self.conns and self.finish_stop():
                    return
                timeout = self.stop_timeout()
            else:
                timeout = None
            for key, events in self.sel.select(timeout):
                what = key.data
                if what == "signal":
                    while True:
                        try:
                            if not os.read(self.wake_r, 64):
                                break
                        except BlockingIOError:
                            break
                    if self.stopping is None:
                        self.begin_stop()
                elif what == "listener":
                    if self.stopping is None:
                        self.accept(key.fileobj)
                elif what.sock.fileno() in self.conns:  # not closed by an earlier event
                    if events & selectors.EVENT_WRITE:
                        self.flush(what)
                    if events & selectors.EVENT_READ and what.sock.fileno() in self.conns:
                        self.readable(what)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--version", default="1.0.0", help="the body of every answer")
    ap.add_argument("--bind", help="HOST:PORT or unix:PATH, when no LISTEN_FDS are passed")
    ap.add_argument("--store", action="store_true",
                    help="on SIGTERM, hand idle connections to the fd store (NOTIFY_SOCKET)")
    ap.add_argument("--store-max", type=int, metavar="N",
                    help="store at most N connections (the service's fd_store); the rest "
                         "are served as without --store")
    ap.add_argument("--crash", action="store_true", help="exit 1 at once (a broken version)")
    ap.add_argument("--start-ms", type=int, default=0,
                    help="sleep this long before taking the sockets (a slow start)")
    args = ap.parse_args()

    if args.crash:
        log(f"version {args.version}: --crash: exiting 1")
        sys.exit(1)
    notify = Notify()
    if args.store and notify.sock is None:
        log("--store without a NOTIFY_SOCKET to store in: a stop serves idle connections as without it")
    # Signals are caught from here on: a SIGTERM during a slow start stops the run
    # gracefully once it has taken its sockets (its resumed connections go back to
    # the store), rather than killing it.
    server = Server(args.version, args.store, args.store_max, notify)
    if args.start_ms > 0:
        log(f"version {args.version}: a slow start: {args.start_ms} ms before taking the sockets")
        time.sleep(args.start_ms / 1000)
    listeners, conns = take_listen_fds()
    passed = len(listeners) + len(conns)
    # No listener passed: we bind our own (plain mode; or a service that binds its
    # port itself and still keeps its connections in the fd store).
    if not listeners and args.bind:
        try:
            listeners = [("bound", bind(args.bind))]
        except OSError as e:
            sys.exit(f"serve.py: cannot bind {args.bind}: {e.strerror}")
    if not listeners and not conns:
        sys.exit("serve.py: no LISTEN_FDS for this process and no --bind: nothing to serve on")
    for _, sock in listeners:
        server.add_listener(sock)
    for _, sock in conns:
        server.add_conn(sock)
    # Our copies are the only ones we want now: the store's would hold each connection
    # open after we close it (a Connection: close answer would never end it).
    for name in sorted({name for name, _ in conns}):
        notify.send(f"FDSTOREREMOVE=1\nFDNAME={name}")
    notify.send(f"READY=1\nSTATUS=serving version {args.version}")
    log(f"version {args.version}: {passed} fd(s) taken from LISTEN_FDS; listening on "
        + (", ".join(f"{describe(s)} ({name})" for name, s in listeners) or "nothing")
        + f"; {len(conns)} connection(s) resumed"
        + ("; --store" if args.store else ""))
    server.run()


if __name__ == "__main__":
    main()
