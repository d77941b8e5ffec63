"""A small Python client for gpuswapd's JSON-line sockets (proto/PROTOCOL.md); standard library only.

    from gpuswap import Client, GpuswapError

    c = Client()                                   # or Client(socket_path=..., admin_socket=...)
    done = c.generate("llama3-8b", "Once upon a time", max_tokens=32, temperature=0)
    print(done["text"], done["finish_reason"], done["timing"]["ttft_ms"])

    s = c.generate("llama3-8b", "Once upon a time", stream=True, max_tokens=32)
    for text in s:                                 # token texts as they arrive
        print(text, end="", flush=True)
    print(s.done["usage"])                         # the done event, once the stream ended

    c.chat("qwen2-7b", [{"role": "user", "content": "Hi"}])["text"]
    c.stats()["models"]["llama3-8b"]["total_page_ins"]

    c = Client(socket_path="10.0.0.5:8401", api_key="gsk_...")  # listen.tcp with an API key

An API key (api_key=, else the GPUSWAP_API_KEY environment variable) is sent in
an "auth" op first on every inference connection; a refused key raises
GpuswapError("unauthorized" or "rate_limited", ...). socket_path "HOST:PORT"
(no '/') connects to listen.tcp instead of a Unix socket.

Sampling keywords are the protocol's field names (max_tokens, temperature, top_k,
top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty, seed, stop)
and go to the daemon as given; the daemon validates them, and a bad one raises GpuswapError("bad_request", ...).

Errors: an error answer raises GpuswapError(code, message) (code is one of the
protocol's: "unknown_model", "bad_request", "overloaded", ...). A socket that
cannot be reached or a connection that breaks raises ConnectionError (OSError);
the next call reconnects.

Overload: a request may carry deadline_ms (its first token wanted within that many ms); one
the daemon cannot serve in time is refused at once with "overloaded" and retry_after_ms
(GpuswapError.retry_after_ms). generate and chat without stream wait that long and send it
again, up to retries times (default 3) and retry_budget seconds of waiting in all (default 30);
Client(retries=0) turns it off. A stream is not retried: its error comes while it is read.

Threads: a Client runs one request at a time; calls from several threads are
serialised by a lock (a streaming request holds it until its stream ends or is
closed), so share a Client between threads only when that is acceptable, and
otherwise give each thread its own Client. Stream.cancel() / Client.cancel() are
the exception: they may be called from any thread while a stream is being read.
"""
import json
import os
import socket
import threading
import time

__all__ = ["Client", "Stream", "GpuswapError", "DEFAULT_SOCKET", "DEFAULT_ADMIN_SOCKET"]

DEFAULT_SOCKET = "/run/gpuswapd/gpuswapd.sock"
DEFAULT_ADMIN_SOCKET = "/run/gpuswapd/admin.sock"


class GpuswapError(Exception):
    """An error answer from the daemon: .code (a protocol error code) and .message."""

    def __init__(self, code, message, answer=None):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        self.answer = answer
        # overloaded for a deadline: when the daemon predicts it could serve it (ms), else None
        self.retry_after_ms = ((answer or {}).get("error") or {}).get("retry_after_ms")


class _Conn:
    """One socket with line framing; lines of other requests than the one awaited are dropped."""

    def __init__(self, path, timeout):
        self.path = path
        tcp = "/" not in path and ":" in path
        try:
            if tcp:
                host, _, port = path.rpartition(":")
                self.sock = socket.create_connection((host.strip("[]"), int(port)), timeout)
            else:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(timeout)
                self.sock.connect(path)
        except (OSError, ValueError) as e:
            if not tcp:
                self.sock.close()
            raise ConnectionError("cannot connect to %s: %s" % (path, getattr(e, "strerror", None) or e)) from e
        self.buf = bytearray()
        self.send_lock = threading.Lock()

    def send(self, obj):
        data = (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")
        with self.send_lock:
            try:
                self.sock.sendall(data)
            except OSError as e:
                raise ConnectionError("connection to %s lost: %s" % (self.path, e)) from e

    def recv(self):
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 1]
                return json.loads(line.decode("utf-8"))
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                raise
            except OSError as e:
                raise ConnectionError("connection to %s lost: %s" % (self.path, e)) from e
            if not chunk:
                raise ConnectionError("connection to %s lost: the daemon closed it" % self.path)
            self.buf += chunk

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def _raise_if_error(ev):
    if ev.get("event") == "error" or ev.get("ok") is False:
        err = ev.get("error") or {}
        raise GpuswapError(err.get("code", "internal"), err.get("message", ""), ev)
    return ev


class Stream:
    """Token texts of a streaming generate/chat, in order. Iterating ends at the done
    event, available as .done (also .text, .finish_reason). Closing (or leaving a
    `with` block) before the end drops the connection, which cancels the request."""

    def __init__(self, client, conn, rid):
        self._client = client
        self._conn = conn
        self.id = rid
        self.done = None
        self._parts = []
        self._closed = False

    @property
    def text(self):
        """The whole completion once done, else the text received so far."""
        return self.done["text"] if self.done else "".join(self._parts)

    @property
    def finish_reason(self):
        return self.done["finish_reason"] if self.done else None

    def __iter__(self):
        return self

    def __next__(self):
        if self._closed:
            raise StopIteration
        try:
            while True:
                ev = self._conn.recv()
                rid = ev.get("id")
                if rid is not None and rid != self.id:
                    continue  # the answer to a cancel
                if rid is None and ev.get("event") != "error":
                    continue
                kind = ev.get("event")
                if kind == "token":
                    self._parts.append(ev.get("text", ""))
                    return ev.get("text", "")
                self._finish()
                if kind == "done":
                    self.done = ev
                    raise StopIteration
                _raise_if_error(ev)
                raise GpuswapError("internal", "unexpected answer %r" % (ev,), ev)
        except (OSError, ValueError, KeyboardInterrupt):
            self._finish(drop=True)
            raise

    def cancel(self):
        """Asks the daemon to stop this request; the stream then ends with
        finish_reason "cancelled". Safe from another thread."""
        if not self._closed and self.done is None:
            self._conn.send({"op": "cancel", "id": "cancel-%s" % self.id, "target": self.id})

    def close(self):
        """Stops reading; an unfinished request is abandoned (its connection dropped)."""
        if not self._closed:
            self._finish(drop=self.done is None)

    def _finish(self, drop=False):
        if self._closed:
            return
        self._closed = True
        self._client._stream_ended(self, drop)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Client:
    """A client of one gpuswapd: the inference socket and, for the operator ops, the admin socket.
    Connections open on first use and stay open; timeout (seconds, None = wait forever) applies
    to each socket operation."""

    def __init__(self, socket_path=None, admin_socket=None, timeout=None, api_key=None, retries=3,
                 retry_budget=30.0):
        self.retries, self.retry_budget = retries, retry_budget
        self.socket_path = socket_path or os.environ.get("GPUSWAP_SOCKET") or DEFAULT_SOCKET
        self.api_key = api_key or os.environ.get("GPUSWAP_API_KEY") or None
        self.admin_socket = admin_socket or os.environ.get("GPUSWAP_ADMIN_SOCKET") or DEFAULT_ADMIN_SOCKET
        self.timeout = timeout
        self._lock = threading.Lock()  # held by the request in flight (a stream: until it ends)
        self._conns = {}
        self._next_id = 0
        self._stream = None
        self._stream_thread = None

    # ---------------------------------------------------------------- plumbing

    def _conn(self, admin):
        path = self.admin_socket if admin else self.socket_path
        c = self._conns.get(path)
        if c is None:
            c = _Conn(path, self.timeout)
            if not admin and self.api_key:
                try:
                    c.send({"op": "auth", "id": "auth", "key": self.api_key})
                    _raise_if_error(c.recv())
                except BaseException:
                    c.close()
                    raise
            self._conns[path] = c
        return c

    def _drop(self, conn):
        conn.close()
        for k, v in list(self._conns.items()):
            if v is conn:
                del self._conns[k]

    def _new_id(self):
        self._next_id += 1
        return self._next_id

    def _acquire(self):
        if self._stream is not None and self._stream_thread == threading.get_ident():
            raise RuntimeError("this thread is still reading a stream of this Client: "
                               "finish or close it first")
        self._lock.acquire()

    def _call(self, req, admin=False, on_progress=None):
        """Sends req and returns its final answer (ok or done), raising GpuswapError for an error."""
        self._acquire()
        try:
            conn = self._conn(admin)
            rid = self._new_id()
            req = dict(req, id=rid)
            try:
                try:
                    conn.send(req)
                except ConnectionError as e:
                    # the daemon refuses a line over its max_line with too_large and
                    # hangs up while we are still sending: report its answer if it came
                    try:
                        conn.sock.settimeout(1.0)
                        ev = conn.recv()
                    except (OSError, ValueError):
                        raise e from None
                    finally:
                        self._drop(conn)
                    if ev.get("event") != "error":
                        raise
                    return _raise_if_error(ev)
                while True:
                    ev = conn.recv()
                    if ev.get("id") != rid and not (ev.get("id") is None and ev.get("event") == "error"):
                        continue
                    kind = ev.get("event")
                    if kind == "token":
                        continue
                    if kind == "progress":
                        if on_progress:
                            on_progress(ev.get("bytes", 0), ev.get("total", 0))
                        continue
                    break
            except BaseException:  # a broken line, a timeout, ^C, a raising progress callback
                self._drop(conn)  # the request's remaining lines would confuse the next one
                raise
            if (ev.get("error") or {}).get("code") == "too_large":
                self._drop(conn)  # the daemon closes the connection after it
        finally:
            self._lock.release()
        return _raise_if_error(ev)

    def _start_stream(self, req):
        self._acquire()
        conn = None
        try:
            conn = self._conn(False)
            rid = self._new_id()
            conn.send(dict(req, id=rid, stream=True))
        except BaseException:
            if conn is not None:
                self._drop(conn)
            self._lock.release()
            raise
        s = Stream(self, conn, rid)
        self._stream = s
        self._stream_thread = threading.get_ident()
        return s

    def _stream_ended(self, stream, drop):
        if self._stream is not stream:
            return
        self._stream = None
        self._stream_thread = None
        if drop:
            self._drop(stream._conn)
        self._lock.release()

    def close(self):
        """Closes the connections (requests in flight are cancelled by the daemon)."""
        for c in list(self._conns.values()):
            c.close()
        self._conns.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---------------------------------------------------------------- inference

    def generate(self, model, prompt=None, tokens=None, stream=False, **sampling):
        """Completes prompt (text) or tokens (ids). Returns the done dict ("text",
        "finish_reason", "usage", "timing"), or with stream=True a Stream."""
        req = {"op": "generate", "model": model}
        if prompt is not None:
            req["prompt"] = prompt
        if tokens is not None:
            req["tokens"] = list(tokens)
        req.update(sampling)
        if stream:
            return self._start_stream(req)
        return self._call_retrying(req)

    def _call_retrying(self, req):
        """_call, again after the wait an overloaded answer asks for (retry_after_ms), within
        self.retries and self.retry_budget."""
        waited = 0.0
        for attempt in range(self.retries + 1):
            try:
                return self._call(req)
            except GpuswapError as e:
                wait = (e.retry_after_ms or 0) / 1000.0
                if (e.code != "overloaded" or wait <= 0 or attempt == self.retries
                        or waited + wait > self.retry_budget):
                    raise
                time.sleep(wait)
                waited += wait

    def chat(self, model, messages, stream=False, **sampling):
        """Like generate, with messages [{"role": "system"|"user"|"assistant", "content": str}, ...]."""
        req = {"op": "chat", "model": model, "messages": list(messages)}
        req.update(sampling)
        if stream:
            return self._start_stream(req)
        return self._call_retrying(req)

    def tokenize(self, model, text, add_bos=True):
        """The token ids of text."""
        return self._call({"op": "tokenize", "model": model, "text": text, "add_bos": add_bos})["tokens"]

    def models(self, admin=False):
        """The configured models (list of dicts); admin=True asks the admin socket, which says more."""
        return self._call({"op": "models"}, admin=admin)["models"]

    def cancel(self, request_id=None):
        """Cancels the stream being read (or the request id given) on this client's
        inference connection; the stream ends with finish_reason "cancelled"."""
        s = self._stream
        if request_id is None:
            if s is not None:
                s.cancel()
            return
        conn = self._conns.get(self.socket_path)
        if conn is not None:
            conn.send({"op": "cancel", "id": "cancel-%s" % request_id, "target": request_id})

    # ---------------------------------------------------------------- admin

    def stats(self):
        """The daemon's stats report: "uptime_s", "pool", "models" (by name), "server"."""
        return self._call({"op": "stats"}, admin=True)

    def load(self, model, progress=None):
        """Pages model onto the device and waits until it is resident; progress(bytes, total)
        is called as segments land. Returns the answer ("state", "bytes", "swap_ms")."""
        req = {"op": "load", "model": model}
        if progress is not None:
            req["stream"] = True
        return self._call(req, admin=True, on_progress=progress)

    def evict(self, model):
        return self._call({"op": "evict", "model": model}, admin=True)

    def pin(self, model):
        return self._call({"op": "pin", "model": model}, admin=True)

    def unpin(self, model):
        return self._call({"op": "unpin", "model": model}, admin=True)

    def reload(self):
        """Re-reads the daemon's configuration; returns "added", "removed", "changed"."""
        return self._call({"op": "reload"}, admin=True)

    def drain(self):
        """Stops the daemon after the requests in flight; returns "completed"."""
        return self._call({"op": "drain"}, admin=True)
