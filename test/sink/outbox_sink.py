#!/usr/bin/env python3
"""outbox_sink: an HTTP webhook receiver for the outbox tests and demo.

Standard library only (Python 3.11).  Typical use:

    python3 test/sink/outbox_sink.py --port 0 --port-file sink.port \\
        --record sink.jsonl [--status 204] [--fail-rate P --seed N] \\
        [--delay-ms N] [--retry-after S] [--refuse-for SECONDS] \\
        [--secret whsec_...] [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]

Every request (except GET/POST /_control and GET /_stats) is appended to the
record file as one JSON line, in arrival order:

    {"seq": n, "t": time.time(), "mono": time.monotonic(), "method": ...,
     "path": ..., "headers": {lower-cased name: value}, "body": "...",
     "status": <status answered, null when the connection was dropped>,
     "sig_ok": true|false|null, "delay_ms": n, "conn": n}

("conn" numbers the TCP connections the sink accepted, from 1.)

HTTPS: with --tls-cert and --tls-key the sink speaks TLS only (the PEM
certificate chain and its key); with --tls-client-ca as well it requires a
client certificate signed by that CA (ssl.CERT_REQUIRED).  Records then
carry "tls": {"version": "TLSv1.3", "peer_subject": s}, s the client
certificate's subject as "organizationName=...,commonName=..." (in the
certificate's order), or null.  A failed handshake is not a request: it is
logged to stderr, as "tls handshake failed #n: <reason>" (n counts the
failures), and counted in /_stats as "tls_failures".

("body_b64" is added when the body is not valid UTF-8; "body" then holds it
decoded with replacement characters.)  The line is written, and t and mono
taken, under a lock once the body has been read and the answer decided, i.e.
before any --delay-ms sleep; so seq, t and mono all follow file order.

Runtime control:
    POST /_control  {"path": "/slow", "status": 200, "fail_rate": 0.0,
                     "delay_ms": 2000, "retry_after": null, "secret": null,
                     "drop": false, "close": false, "keep_body": true}
        Fields given override the mode for requests whose path equals "path"
        (the path without its query string also matches); fields not given
        are inherited from the global default.  With "key" instead of
        "path", they apply to requests whose outbox-key header equals it
        (on any path, over the path's mode).  With neither, the global
        default is changed.  "drop": true closes the connection without an
        answer; "close": true answers, with "Connection: close", and then
        closes it; "keep_body": false records "body": null (every
        record has "body_len", the body's bytes), for large bodies;
        "hold": true records a request and holds its answer (then
        delay_ms) until "hold" is false again for its path or key.  Extra commands (may be combined):
            {"path": "/x", "reset": true}  forget the overrides of /x
            {"key": "k", "reset": true}    forget the overrides of key k
            {"reset": true}                forget all per-path and per-key
                                           overrides
            {"reset_stats": true}          zero /_stats (not seq)
            {"refuse_for": S}              after answering, close the
                                           listening socket and all open
                                           connections, refuse connections
                                           for S seconds (or until the
                                           process gets SIGUSR1), then
                                           listen again on the same port
        Answers the resulting configuration (as GET /_control).
    GET /_control   {"default": {...}, "paths": {path: {overrides}},
                     "keys": {key: {overrides}},
                     "port": n, "listening": bool}
    GET /_stats     {"requests": n, "by_status": {"204": n, ...},
                     "by_path": {...}, "sig_fail": n, "connections": n,
                     "tls_failures": n}
        ("connections": TCP connections accepted since the start or the
        last reset_stats, "tls_failures" the TLS handshakes that failed)

The signature check follows Standard Webhooks; verify() and sign() can be
imported by other scripts (sys.path.insert(0, "test/sink")).
"""

import argparse
import base64
import binascii
import hashlib
import hmac
import json
import os
import random
import signal
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SIG_TOLERANCE = 5 * 60
CONTROL_PATHS = ("/_control", "/_stats")


# --------------------------------------------------------------------------
# Standard Webhooks signatures


def decode_secret(secret):
    """The HMAC key of a "whsec_<base64>" secret (the prefix is optional)."""
    if isinstance(secret, bytes):
        secret = secret.decode("ascii")
    if secret.startswith("whsec_"):
        secret = secret[len("whsec_"):]
    secret = secret.strip()
    secret += "=" * (-len(secret) % 4)
    return base64.b64decode(secret, validate=True)


def sign(secret, msg_id, timestamp, body):
    """The "v1,<base64>" signature of a message, as a sender would make it."""
    if isinstance(body, str):
        body = body.encode("utf-8")
    msg = f"{msg_id}.{timestamp}.".encode("utf-8") + body
    digest = hmac.new(decode_secret(secret), msg, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def verify(secret, headers, body, now=None, tolerance=SIG_TOLERANCE):
    """True if the webhook-signature header holds a valid v1 signature.

    secret: "whsec_<base64>" (or a list of them: any may match);
    headers: a mapping of header names (any case) to values;
    body: the raw body, bytes or str.
    False when a webhook-* header is missing or malformed, or when
    webhook-timestamp is more than `tolerance` seconds away from now.
    """
    h = {str(k).lower(): v for k, v in headers.items()}
    msg_id = h.get("webhook-id")
    ts = h.get("webhook-timestamp")
    sig_header = h.get("webhook-signature")
    if msg_id is None or ts is None or sig_header is None:
        return False
    try:
        ts_int = int(str(ts).strip())
    except ValueError:
        return False
    if now is None:
        now = time.time()
    if abs(now - ts_int) > tolerance:
        return False
    secrets = secret if isinstance(secret, (list, tuple)) else [secret]
    if isinstance(body, str):
        body = body.encode("utf-8")
    ok = False
    for s in secrets:
        try:
            expected = sign(s, msg_id, str(ts).strip(), body).encode("ascii")
        except (binascii.Error, ValueError, UnicodeError):
            continue
        for entry in str(sig_header).split():
            # Compare every entry (no early exit) in constant time.
            if hmac.compare_digest(entry.encode("utf-8", "replace"), expected):
                ok = True
    return ok


# --------------------------------------------------------------------------
# Configuration


MODE_KEYS = ("status", "fail_rate", "delay_ms", "retry_after", "secret", "drop", "close",
             "keep_body", "hold")


def _check_mode_value(key, value):
    """Validate and normalise one mode field; raise ValueError if bad."""
    if key == "status":
        if isinstance(value, bool) or not isinstance(value, int) or not 200 <= value <= 599:
            raise ValueError("status must be an integer in 200..599")
        return value
    if key == "fail_rate":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError("fail_rate must be a number in 0..1")
        return float(value)
    if key == "delay_ms":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError("delay_ms must be a number >= 0")
        return value
    if key == "retry_after":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError("retry_after must be null, a number or a string")
        return str(value)
    if key == "secret":
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError("secret must be null or a string")
        try:
            decode_secret(value)
        except (binascii.Error, ValueError, UnicodeError):
            raise ValueError("secret must be whsec_<base64>")
        return value
    if key in ("drop", "close", "keep_body", "hold"):
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false")
        return value
    raise ValueError(f"unknown field {key!r}")


class Config:
    """Global mode plus per-path and per-key overrides; one short lock."""

    def __init__(self, default):
        self.lock = threading.Lock()
        self.default = dict(default)
        self.paths = {}
        self.keys = {}

    def effective(self, path, key=None):
        with self.lock:
            mode = dict(self.default)
            over = self.paths.get(path)
            if over is None and "?" in path:
                over = self.paths.get(path.split("?", 1)[0])
            if over:
                mode.update(over)
            if key is not None and key in self.keys:
                mode.update(self.keys[key])
        return mode

    def snapshot(self):
        with self.lock:
            return {"default": dict(self.default),
                    "paths": {p: dict(o) for p, o in self.paths.items()},
                    "keys": {k: dict(o) for k, o in self.keys.items()}}

    def apply(self, req):
        """Apply a /_control body; raise ValueError on a bad one."""
        if not isinstance(req, dict):
            raise ValueError("control body must be a JSON object")
        commands = {"path", "key", "reset", "reset_stats", "refuse_for"}
        unknown = set(req) - set(MODE_KEYS) - commands
        if unknown:
            raise ValueError(f"unknown fields: {sorted(unknown)}")
        path = req.get("path")
        if path is not None and (not isinstance(path, str) or not path.startswith("/")):
            raise ValueError("path must be a string starting with /")
        key = req.get("key")
        if key is not None and not isinstance(key, str):
            raise ValueError("key must be a string")
        if path is not None and key is not None:
            raise ValueError("give path or key, not both")
        changes = {k: _check_mode_value(k, req[k]) for k in MODE_KEYS if k in req}
        with self.lock:
            if req.get("reset"):
                if path is not None:
                    self.paths.pop(path, None)
                elif key is not None:
                    self.keys.pop(key, None)
                else:
                    self.paths.clear()
                    self.keys.clear()
            if changes:
                if path is not None:
                    self.paths.setdefault(path, {}).update(changes)
                elif key is not None:
                    self.keys.setdefault(key, {}).update(changes)
                else:
                    self.default.update(changes)


# --------------------------------------------------------------------------
# Recording and statistics


class Recorder:
    """Assigns seq numbers, writes record lines, keeps stats (one lock)."""

    def __init__(self, path):
        self.lock = threading.Lock()
        self.file = open(path, "a", encoding="utf-8") if path else None
        self.seq = 0
        self.conn_seq = 0
        self.reset_stats()

    def reset_stats(self):
        self.requests = 0
        self.by_status = {}
        self.by_path = {}
        self.sig_fail = 0
        self.connections = 0
        self.tls_failures = 0

    def tls_failure(self):
        """Count a failed TLS handshake; return the count."""
        with self.lock:
            self.tls_failures += 1
            return self.tls_failures

    def next_connection(self):
        """Count an accepted connection; return its number (from 1)."""
        with self.lock:
            self.connections += 1
            self.conn_seq += 1
            return self.conn_seq

    def record(self, entry):
        """Give entry the next seq, append it to the record file; return seq."""
        with self.lock:
            self.seq += 1
            # t and mono are taken here, under the lock, so that they never
            # go back in seq (= file) order.
            line = json.dumps({"seq": self.seq, "t": time.time(), "mono": time.monotonic(),
                               **entry}, separators=(",", ":"))
            if self.file is not None:
                self.file.write(line + "\n")
                self.file.flush()
            self.requests += 1
            key = str(entry["status"])
            self.by_status[key] = self.by_status.get(key, 0) + 1
            self.by_path[entry["path"]] = self.by_path.get(entry["path"], 0) + 1
            if entry["sig_ok"] is False:
                self.sig_fail += 1
            return self.seq

    def stats(self):
        with self.lock:
            return {"requests": self.requests,
                    "by_status": dict(self.by_status),
                    "by_path": dict(self.by_path),
                    "sig_fail": self.sig_fail,
                    "connections": self.connections,
                    "tls_failures": self.tls_failures,
                    "last_seq": self.seq}

    def close(self):
        with self.lock:
            if self.file is not None:
                self.file.close()
                self.file = None


# --------------------------------------------------------------------------
# The server


class SinkHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # Do not track the per-connection threads, and do not join them in
    # server_close(): an idle keep-alive connection would block it.
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 256

    ssl_context = None

    def get_request(self):
        sock, addr = super().get_request()
        if self.ssl_context is not None:
            # The handshake is done by the connection's own thread (the
            # handler's setup()), not by the one accepting connections.
            sock = self.ssl_context.wrap_socket(sock, server_side=True,
                                                do_handshake_on_connect=False)
        return sock, addr

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
            return
        super().handle_error(request, client_address)


class Sink:
    """Holds the state shared by the handlers, and the (re)bindable server."""

    def __init__(self, args):
        self.args = args
        self.config = Config({
            "status": args.status,
            "fail_rate": args.fail_rate,
            "delay_ms": args.delay_ms,
            "retry_after": None if args.retry_after is None else str(args.retry_after),
            "secret": args.secret,
            "drop": False,
            "close": False,
            "keep_body": True,
            "hold": False,
        })
        self.recorder = Recorder(args.record)
        self.rng = random.Random(args.seed)
        self.rng_lock = threading.Lock()
        self.stop = threading.Event()
        self.server_lock = threading.Lock()
        self.server = None
        self.serve_thread = None
        self.port = args.port
        self.conns_lock = threading.Lock()
        self.conns = set()
        self.refusing = threading.Lock()
        self.refuse_end = threading.Event()  # set by SIGUSR1
        self.ssl_context = None
        if args.tls_cert:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(args.tls_cert, args.tls_key)
            if args.tls_client_ca:
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(cafile=args.tls_client_ca)
            self.ssl_context = ctx

    def roll(self):
        with self.rng_lock:
            return self.rng.random()

    # -- listening socket ---------------------------------------------------

    def bind(self):
        """Bind (retrying briefly if the port is still taken) and serve."""
        handler = make_handler(self)
        deadline = time.monotonic() + 10
        while True:
            try:
                server = SinkHTTPServer((self.args.host, self.port), handler)
                break
            except OSError:
                if self.port == 0 or time.monotonic() > deadline or self.stop.is_set():
                    raise
                time.sleep(0.05)
        server.ssl_context = self.ssl_context
        self.port = server.server_address[1]
        thread = threading.Thread(target=server.serve_forever,
                                  kwargs={"poll_interval": 0.2},
                                  name="serve", daemon=True)
        with self.server_lock:
            self.server = server
            self.serve_thread = thread
        thread.start()

    def unbind(self):
        with self.server_lock:
            server, self.server = self.server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def drop_connections(self):
        with self.conns_lock:
            conns = list(self.conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def refuse(self, seconds):
        """Stop listening for `seconds`, closing open connections too."""
        if not self.refusing.acquire(blocking=False):
            return  # already refusing
        try:
            log(f"refusing connections for {seconds} s")
            self.unbind()
            self.drop_connections()
            end = time.monotonic() + seconds
            while not self.refuse_end.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    break
                if self.stop.wait(min(left, 0.05)):
                    return
            self.bind()
            log(f"listening again on {self.args.host}:{self.port}")
        finally:
            self.refusing.release()

    def listening(self):
        with self.server_lock:
            return self.server is not None


def log(msg):
    print(msg, flush=True)


def make_handler(sink):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "outbox-sink/1"
        sys_version = ""
        timeout = sink.args.idle_timeout

        def setup(self):
            if isinstance(self.request, ssl.SSLSocket):
                self.request.settimeout(10)
                try:
                    self.request.do_handshake()
                except (OSError, ValueError) as e:
                    n = sink.recorder.tls_failure()
                    sys.stderr.write(f"tls handshake failed #{n}: {e}\n")
                    sys.stderr.flush()
                    raise
            super().setup()
            # Answers go out as headers then body: without TCP_NODELAY,
            # Nagle and delayed ACKs add ~40 ms to every non-empty answer.
            try:
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            with sink.conns_lock:
                sink.conns.add(self.connection)
            self.conn_number = sink.recorder.next_connection()

        def finish(self):
            with sink.conns_lock:
                sink.conns.discard(self.connection)
            try:
                super().finish()
            except OSError:
                pass

        def log_message(self, format, *args):
            if sink.args.verbose:
                sys.stderr.write("sink: %s %s\n" % (self.address_string(), format % args))

        # -- reading ----------------------------------------------------------

        def read_body(self):
            te = self.headers.get("Transfer-Encoding", "")
            if "chunked" in te.lower():
                parts = []
                while True:
                    line = self.rfile.readline(65537)
                    if not line:
                        raise ConnectionError("eof in chunked body")
                    size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                    if size == 0:
                        # trailers, up to the empty line
                        while True:
                            t = self.rfile.readline(65537)
                            if not t or t in (b"\r\n", b"\n"):
                                break
                        return b"".join(parts)
                    data = self.rfile.read(size)
                    if len(data) < size:
                        raise ConnectionError("eof in chunk")
                    parts.append(data)
                    self.rfile.readline(3)  # CRLF after the chunk
            length = self.headers.get("Content-Length")
            if length is None:
                return b""
            n = int(length)
            if n < 0:
                raise ValueError("negative Content-Length")
            data = self.rfile.read(n)
            if len(data) < n:
                raise ConnectionError("eof in body")
            return data

        # -- answering ----------------------------------------------------------

        def answer(self, status, body=b"", content_type="application/json", extra=()):
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            if body:
                self.send_header("Content-Type", content_type)
            for name, value in extra:
                self.send_header(name, value)
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)
            self.wfile.flush()

        def answer_json(self, status, obj, extra=()):
            self.answer(status, (json.dumps(obj, sort_keys=True) + "\n").encode(), extra=extra)

        def control_state(self):
            state = sink.config.snapshot()
            state["port"] = sink.port
            state["listening"] = sink.listening()
            return state

        def handle_control(self, path, body):
            if path == "/_stats":
                return self.answer_json(200, sink.recorder.stats())
            # /_control
            if self.command == "GET":
                return self.answer_json(200, self.control_state())
            if self.command != "POST":
                return self.answer_json(405, {"error": "GET or POST"})
            try:
                req = json.loads(body.decode("utf-8") or "{}")
                refuse_for = None
                if isinstance(req, dict) and "refuse_for" in req:
                    refuse_for = req["refuse_for"]
                    if isinstance(refuse_for, bool) or not isinstance(refuse_for, (int, float)) \
                            or refuse_for < 0:
                        raise ValueError("refuse_for must be a number >= 0")
                sink.config.apply(req)
            except (ValueError, UnicodeError) as e:
                return self.answer_json(400, {"error": str(e)})
            if req.get("reset_stats"):
                with sink.recorder.lock:
                    sink.recorder.reset_stats()
            if refuse_for is not None:
                # before the answer: a SIGUSR1 sent once it is read ends
                # this refusal
                sink.refuse_end.clear()
            self.answer_json(200, self.control_state())
            if refuse_for is not None:
                self.close_connection = True
                threading.Thread(target=sink.refuse, args=(refuse_for,),
                                 name="refuse", daemon=True).start()

        def handle_any(self):
            try:
                body = self.read_body()
            except (ValueError, ConnectionError, OSError):
                self.close_connection = True
                try:
                    self.answer_json(400, {"error": "bad body"})
                except OSError:
                    pass
                return
            path = self.path
            bare = path.split("?", 1)[0]
            if bare in CONTROL_PATHS:
                return self.handle_control(bare, body)

            headers = {}
            for name, value in self.headers.items():
                k = name.lower()
                headers[k] = value if k not in headers else headers[k] + ", " + value
            mode = sink.config.effective(path, headers.get("outbox-key"))

            if mode["drop"]:
                status = None
            elif mode["fail_rate"] > 0 and sink.roll() < mode["fail_rate"]:
                status = 500
            else:
                status = mode["status"]
            sig_ok = None
            if mode["secret"] is not None:
                sig_ok = verify(mode["secret"], headers, body)

            b64 = None
            if not mode["keep_body"]:
                text = None
            else:
                try:
                    text = body.decode("utf-8")
                except UnicodeDecodeError:
                    text = body.decode("utf-8", "replace")
                    b64 = base64.b64encode(body).decode("ascii")
            entry = {"method": self.command, "path": path,
                     "headers": headers, "body": text, "body_len": len(body),
                     "status": status, "sig_ok": sig_ok,
                     "delay_ms": mode["delay_ms"], "conn": self.conn_number}
            if b64 is not None:
                entry["body_b64"] = b64
            if isinstance(self.connection, ssl.SSLSocket):
                peer = self.connection.getpeercert()
                subject = None
                if peer:
                    subject = ",".join(f"{k}={v}" for rdn in peer.get("subject", ())
                                       for k, v in rdn)
                entry["tls"] = {"version": self.connection.version(),
                                "peer_subject": subject}
            seq = sink.recorder.record(entry)

            if mode["hold"]:
                # Held: answered (as decided above) once "hold" is lifted
                # for its path or key; a test decides when, not a clock.
                while sink.config.effective(path, headers.get("outbox-key"))["hold"]:
                    if sink.stop.wait(0.02):
                        self.close_connection = True
                        return
            if mode["delay_ms"]:
                if sink.stop.wait(mode["delay_ms"] / 1000.0):
                    self.close_connection = True
                    return
            if status is None:
                # drop: close the connection without any answer
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            extra = []
            if mode["close"]:
                # answer "Connection: close" and close, as some servers do
                extra.append(("Connection", "close"))
                self.close_connection = True
            if status in (429, 503) and mode["retry_after"] is not None:
                extra.append(("Retry-After", mode["retry_after"]))
            if status == 204:
                self.answer(204, extra=extra)
            else:
                self.answer_json(status, {"status": status, "seq": seq,
                                          "ok": 200 <= status < 300}, extra=extra)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = handle_any

    return Handler


# --------------------------------------------------------------------------
# Main


def write_port_file(path, port):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)


def parse_args(argv):
    p = argparse.ArgumentParser(description="HTTP webhook receiver for the outbox tests")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port, 0 for a free one (0)")
    p.add_argument("--port-file", help="write the bound port here (atomically)")
    p.add_argument("--record", help="append one JSON line per request here")
    p.add_argument("--status", type=int, default=204, help="answer status (204)")
    p.add_argument("--fail-rate", type=float, default=0.0,
                   help="probability of answering 500 instead (0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the --fail-rate draws (0)")
    p.add_argument("--delay-ms", type=int, default=0, help="sleep before answering (0)")
    p.add_argument("--retry-after", help="Retry-After value on 429/503 answers")
    p.add_argument("--refuse-for", type=float, default=0,
                   help="do not bind for this many seconds after start (needs --port)")
    p.add_argument("--secret", help="whsec_<base64>: check Standard Webhooks signatures")
    p.add_argument("--idle-timeout", type=float, default=60,
                   help="close idle keep-alive connections after this many seconds (60)")
    p.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (chain)")
    p.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca",
                   help="require client certificates signed by this PEM CA (needs --tls-cert)")
    p.add_argument("--verbose", action="store_true", help="log requests to stderr")
    args = p.parse_args(argv)
    try:
        for key in ("status", "fail_rate", "delay_ms", "secret"):
            _check_mode_value(key, getattr(args, key))
    except ValueError as e:
        p.error(str(e))
    if bool(args.tls_cert) != bool(args.tls_key):
        p.error("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        p.error("--tls-client-ca needs --tls-cert and --tls-key")
    if args.refuse_for > 0 and args.port == 0:
        p.error("--refuse-for needs a fixed --port")
    return args


def main(argv=None):
    args = parse_args(argv)
    sink = Sink(args)

    def on_signal(signum, frame):
        sink.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # SIGUSR1 ends a refusal (refuse_for) now: a test ends an outage when
    # it is ready, not after a time.
    signal.signal(signal.SIGUSR1, lambda signum, frame: sink.refuse_end.set())

    if args.refuse_for > 0:
        log(f"refusing connections on {args.host}:{args.port} for {args.refuse_for} s")
        if sink.stop.wait(args.refuse_for):
            sink.recorder.close()
            return 0
    with sink.refusing:  # a /_control refuse_for cannot race the first bind
        sink.bind()
    if args.port_file:
        write_port_file(args.port_file, sink.port)
    log(f"listening on {args.host}:{sink.port}")

    while not sink.stop.wait(0.5):
        pass
    sink.unbind()
    sink.drop_connections()
    sink.recorder.close()
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
