"""benchnet: what the HTTP benchmarks share: a free local port, waiting for a server's /health, and a
JSON POST."""
import http.client
import json
import socket
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, proc, what, timeout=300):
    """Until GET /health answers 200; exits naming `what` if proc dies or time runs out."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit("%s exited %d" % (what, proc.returncode))
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("%s did not come up" % what)


def post(port, path, body, timeout=3600):
    """The decoded JSON answer of POST path; exits on a status other than 200."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise SystemExit("POST %s: %d %s" % (path, r.status, data[:300]))
    return json.loads(data)
