"""What a newcomer trips over (issue 35): the README's "Serve your own GGUF files" section run as
written by an unprivileged user and answered through the OpenAI Node SDK; a models-only config;
every listener mistake named before any model loads; a model that cannot load summarized at start,
marked in /v1/models and refused by --strict; the reload report naming every changed key;
max_context said once, as it applies."""
import json
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

DATA = os.path.join(gsd.ROOT, "tests", "data")
NODE_DIR = os.path.join(gsd.ROOT, "tests", "node")
README = os.path.join(gsd.ROOT, "README.md")
AS_ROOT = os.geteuid() == 0
NOBODY = pwd.getpwnam("nobody") if AS_ROOT else None


def readme_block(marker):
    text = open(README).read()
    m = re.search(r"<!-- %s -->\n```sh\n(.*?)```" % re.escape(marker), text, re.S)
    assert m, "README.md has no <!-- %s --> block" % marker
    return [l for l in m.group(1).splitlines() if l.strip()]


_BIN = []


def user_binary():
    """gpuswapd copied where nobody may run it (the checkout may sit under a 0700 home)."""
    if not _BIN:
        d = user_dir("gsd-bin-")
        _BIN.append(shutil.copy(gsd.GPUSWAPD, os.path.join(d, "gpuswapd")))
    return _BIN[0]


def user_dir(prefix):
    """A directory the unprivileged user owns (the user itself when not root)."""
    d = gsd.tmpdir(prefix=prefix)
    os.chmod(d, 0o755)
    if AS_ROOT:
        os.chown(d, NOBODY.pw_uid, NOBODY.pw_gid)
    return d


def as_user(cmd, cwd, env_more=None, **kw):
    """cmd run as nobody (when root; as this user otherwise), with a runtime dir of its own."""
    env = dict(os.environ)
    env.update(env_more or {})
    prefix = ["setpriv", "--reuid=%d" % NOBODY.pw_uid, "--regid=%d" % NOBODY.pw_gid,
              "--clear-groups"] if AS_ROOT else []
    return subprocess.Popen(prefix + cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def wait_http(url, proc, log, timeout):
    deadline = time.time() + gsd.scaled(timeout)
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError("gpuswapd exited %d:\n%s" % (proc.returncode, log()))
        try:
            return http_get(url, 2)
        except OSError:
            time.sleep(0.1)
    raise AssertionError("no answer from %s:\n%s" % (url, log()))


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
    try:
        out, _ = proc.communicate(timeout=gsd.scaled(30))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def test_the_readme_serve_section_as_an_unprivileged_user_with_the_openai_sdk():
    """A copy of what the section names (the binary, the files), run as written by nobody."""
    home = user_dir("gsd-serve-")
    for rel in ("build/gpuswapd", "tests/data/stories260K.gguf", "tests/data/stories260K-F16.gguf"):
        os.makedirs(os.path.join(home, os.path.dirname(rel)), exist_ok=True)
        src = gsd.GPUSWAPD if rel == "build/gpuswapd" else os.path.join(gsd.ROOT, rel)
        shutil.copy(src, os.path.join(home, rel))
    run = user_dir("gsd-xdg-")
    os.chmod(run, 0o700)
    (serve_cmd,) = readme_block("serve-own")
    proc = as_user(shlex.split(serve_cmd), home, {"XDG_RUNTIME_DIR": run})
    out = ""
    try:
        wait_http("http://127.0.0.1:8400/v1/models", proc, lambda: stop(proc), 30)
        for line in readme_block("serve-own-client"):
            r = subprocess.run(line, shell=True, capture_output=True, text=True, cwd=home,
                               timeout=gsd.scaled(60))
            assert r.returncode == 0 and r.stdout.strip().startswith("{"), (line, r)
            body = json.loads(r.stdout)
            assert "error" not in body, (line, body)
        node = shutil.which("node")
        if not node:
            print("  skip: node not installed", flush=True)
        else:
            assert os.path.isdir(os.path.join(NODE_DIR, "node_modules", "openai")), \
                "the openai npm package is missing: run `make deps`"
            r = subprocess.run([node, os.path.join(NODE_DIR, "openai_serve.mjs"), "http://127.0.0.1:8400/v1"],
                               capture_output=True, text=True, timeout=gsd.scaled(120), cwd=NODE_DIR)
            assert r.returncode == 0, r.stdout + r.stderr
            res = json.loads(r.stdout.strip().splitlines()[-1])
            assert [m["id"] for m in res["models"]] == ["stories260K", "stories260K-F16"], res
            assert all(m["available"] for m in res["models"]), res
            assert res["text"] and res["finish_reason"] in ("length", "stop"), res
            print("  openai node sdk: %s -> %r" % (res["models"][0]["id"], res["text"]), flush=True)
    finally:
        out = stop(proc)
    assert proc.returncode == 0, out
    where = os.path.join(run, "gpuswapd")
    assert "OpenAI API on http://127.0.0.1:8400/v1; try: curl" in out, out
    assert "serving on %s/gpuswapd.sock (admin %s/admin.sock)" % (where, where) in out, out
    assert os.path.isfile(os.path.join(where, "serve.yaml")), os.listdir(where)
    if AS_ROOT:
        assert os.stat(where).st_uid == NOBODY.pw_uid and os.stat(where).st_mode & 0o777 == 0o700


def write(d, name, text):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)
    return path


def test_a_models_only_config_starts_as_an_unprivileged_user():
    d = user_dir("gsd-mo-")
    shutil.copy(os.path.join(DATA, "stories260K.gguf"), d)
    port = gsd.free_port()
    # only models: sockets beside the file (no XDG_RUNTIME_DIR); --http is serve's, so the port
    # comes from a listen section with http alone
    cfg = write(d, "my.yaml", "models:\n  - name: tiny\n    path: stories260K.gguf\n")
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    r = subprocess.run((["setpriv", "--reuid=%d" % NOBODY.pw_uid, "--regid=%d" % NOBODY.pw_gid, "--clear-groups"]
                        if AS_ROOT else []) + [user_binary(), "--check-config", cfg],
                       capture_output=True, text=True, env=env, timeout=gsd.scaled(30))
    if r.returncode and "8400" in r.stderr and "in use" in r.stderr:
        print("  (127.0.0.1:8400 is in use here: checked with a listen section instead)")
    else:
        assert r.returncode == 0, r
        assert 'http: "127.0.0.1:8400"' in r.stdout and 'socket: "%s/gpuswapd.sock"' % d in r.stdout, r.stdout
        # max_context said once, as it applies: the model was trained on 2048
        assert "trained context 2048, max_context 2048 (the default 4096" in r.stderr, r.stderr
        assert "max_context: 2048" in r.stdout, r.stdout
    write(d, "my.yaml", "listen:\n  http: 127.0.0.1:%d\nmodels:\n  - name: tiny\n    path: stories260K.gguf\n" % port)
    proc = as_user([user_binary(), "--config", "my.yaml"], d, {"XDG_RUNTIME_DIR": ""})
    try:
        models = wait_http("http://127.0.0.1:%d/v1/models" % port, proc, lambda: stop(proc), 30)
        assert [m["id"] for m in models["data"]] == ["tiny"], models
    finally:
        out = stop(proc)
    assert "serving on %s/gpuswapd.sock (admin %s/admin.sock)" % (d, d) in out, out
    assert "lowered" not in out, "the default max_context is no warning: " + out
    assert "context 2048" in out, out


def check_config(d, text):
    cfg = write(d, "c.yaml", text)
    return subprocess.run([gsd.GPUSWAPD, "--check-config", cfg], capture_output=True, text=True,
                          timeout=gsd.scaled(30)), cfg


def start_fails_before_loading(d, cfg, want):
    r = subprocess.run([gsd.GPUSWAPD, "--config", cfg], capture_output=True, text=True, timeout=gsd.scaled(30))
    assert r.returncode == 1, r
    assert want in r.stderr and "loading model" not in r.stderr and "nothing started" in r.stderr, r.stderr


def test_listener_mistakes_are_named_before_any_model_loads():
    d = gsd.tmpdir(prefix="gsd-pre-")
    model = os.path.join(DATA, "stories260K.gguf")
    tail = "models:\n  - name: tiny\n    path: %s\n" % model
    # a socket directory that does not exist
    r, cfg = check_config(d, "listen:\n  socket: %s/nodir/s.sock\nadmin:\n  socket: ~\n" % d + tail)
    assert r.returncode == 1 and "listen.socket: the socket's directory %s/nodir: No such file" % d in r.stderr, r.stderr
    start_fails_before_loading(d, cfg, "listen.socket: the socket's directory")
    # a port in use
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        r, cfg = check_config(d, "listen:\n  socket: %s/s.sock\n  http: 127.0.0.1:%d\nadmin:\n  socket: ~\n" % (d, port) + tail)
        assert r.returncode == 1 and "listen.http: 127.0.0.1:%d: Address already in use" % port in r.stderr, r.stderr
        start_fails_before_loading(d, cfg, "Address already in use")
    finally:
        busy.close()
    # a socket directory this user may not write (as nobody, a root-owned 0755 directory)
    if AS_ROOT:
        os.chmod(d, 0o755)  # nobody reads the config
        ro = gsd.tmpdir(prefix="gsd-ro-")
        os.chmod(ro, 0o755)
        cfg = write(d, "ro.yaml", "listen:\n  socket: %s/s.sock\nadmin:\n  socket: ~\n" % ro + tail)
        r = subprocess.run(["setpriv", "--reuid=%d" % NOBODY.pw_uid, "--regid=%d" % NOBODY.pw_gid, "--clear-groups",
                            user_binary(), "--check-config", cfg], capture_output=True, text=True, timeout=gsd.scaled(30))
        assert r.returncode == 1 and "no write permission in %s" % ro in r.stderr, r.stderr
    # no config at all
    r = subprocess.run([gsd.GPUSWAPD, "--config", os.path.join(d, "none.yaml")], capture_output=True, text=True)
    assert r.returncode == 1 and "cannot open" in r.stderr, r
    # both the files and a config
    r = subprocess.run([gsd.GPUSWAPD, "serve", "--config", "x.yaml", model], capture_output=True, text=True)
    assert r.returncode == 2 and "not both" in r.stderr, r


def test_a_model_that_cannot_load_is_summarized_marked_and_refused_by_strict():
    port = gsd.free_port()
    m = gsd.mkmodel(os.path.join(gsd.tmpdir(), "m.gguf"),
                    "--type q8_0 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 300 --ctx 512 --seed 3")
    d = gsd.Daemon([("good", m, ""), ("gone", "/nonexistent/gone.gguf", "")], memory="4MiB",
                   listen="http: 127.0.0.1:%d" % port)
    try:
        ms = wait_http("http://127.0.0.1:%d/v1/models" % port, d.proc, d.logtext, 30)["data"]
        by = {x["id"]: x for x in ms}
        assert by["good"]["available"] is True and by["gone"]["available"] is False, ms
        assert by["gone"]["state"] == "failed" and "error" not in by["gone"], ms
        warn = [l for l in d.logtext().splitlines() if "could not be loaded and are unavailable" in l]
        assert warn and "1 of 2 models" in warn[0] and "'gone'" in warn[0], d.logtext()
    finally:
        assert d.stop() == 0
    r = subprocess.run([gsd.GPUSWAPD, "--config", d.config, "--strict"], capture_output=True, text=True,
                       timeout=gsd.scaled(60))
    assert r.returncode == 1 and "--strict:" in r.stderr and "'gone'" in r.stderr, r


def test_the_reload_report_names_every_changed_key():
    m = gsd.mkmodel(os.path.join(gsd.tmpdir(), "m.gguf"),
                    "--type q8_0 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 300 --ctx 512 --seed 3")
    d = gsd.Daemon([("a", m, ""), ("b", m, "")], memory="4MiB")
    try:
        d.write_config([("a", m, "chat_template: chatml\ngpu_quota: 2MiB\ndefaults:\n  temperature: 0.5"),
                        ("b", m, "")], memory="4MiB", scheduler="max_wait: 3s")
        r = d.admin_call({"op": "reload", "id": 1})
        assert r.get("ok"), r
        assert r["changed"] == ["a"], r
        assert sorted(r["changed_keys"]["a"]) == ["chat_template", "defaults.temperature", "gpu_quota"], r
        assert r["settings"] == ["scheduler.max_wait"], r
        env = dict(os.environ, GPUSWAP_ADMIN_SOCKET=d.admin, GPUSWAP_SOCKET=d.sock)
        d.write_config([("a", m, "chat_template: llama3"), ("b", m, "")], memory="4MiB")
        cli = subprocess.run([os.path.join(gsd.BUILD, "gpuswap"), "reload"], capture_output=True, text=True, env=env)
        assert cli.returncode == 0, cli
        assert "changed a (gpu_quota, chat_template, defaults.temperature); settings scheduler.max_wait" \
            in cli.stdout, cli.stdout
        assert "reload: model 'a': gpu_quota, chat_template, defaults.temperature changed" in d.logtext(), d.logtext()
    finally:
        assert d.stop() == 0


if __name__ == "__main__":
    runner = gsd.Runner()
    for fn in (test_the_readme_serve_section_as_an_unprivileged_user_with_the_openai_sdk,
               test_a_models_only_config_starts_as_an_unprivileged_user,
               test_listener_mistakes_are_named_before_any_model_loads,
               test_a_model_that_cannot_load_is_summarized_marked_and_refused_by_strict,
               test_the_reload_report_names_every_changed_key):
        runner.run(fn)
    sys.exit(runner.exit_code())
