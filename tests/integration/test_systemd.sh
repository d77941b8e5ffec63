#!/usr/bin/env bash
# test_systemd.sh: make install layout, systemd-analyze verify of the units, real socket activation and the sd_notify protocol of gpuswapd.
#
# Run from the repository root (GPUSWAPD_BUILD=build). Prints one "ok ..." or
# "FAIL ..." line per check, "skip: ..." when a tool is missing, and exits
# non-zero when a check failed. No PID 1 systemd is needed: activation goes
# through systemd-socket-activate, notifications to a Python datagram socket.
set -u
cd "$(dirname "$0")/../.."
BUILD=${GPUSWAPD_BUILD:-build}
PY=/usr/bin/python3
GSD=$PWD/$BUILD/gpuswapd
fails=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gsd-systemd.XXXXXX")
daemon_pid=

ok() { echo "ok $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
skip() { echo "skip: $*"; }

cleanup() {
    if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
        kill -KILL "$daemon_pid" 2>/dev/null
        wait "$daemon_pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

# Prints the last lines of a log, indented, after a FAIL.
show() { sed 's/^/    | /' "$1" | tail -n "${2:-15}"; }

# Waits up to $2 tenths of a second for process $1 to exit; returns its exit code, 124 if it did not.
wait_exit() {
    local pid=$1 n=${2:-300} i
    for ((i = 0; i < n; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        return 124
    fi
    wait "$pid"
}

if [ ! -x "$GSD" ] || [ ! -x "$BUILD/mkmodel" ]; then
    fail "setup: $BUILD/gpuswapd and $BUILD/mkmodel must be built (make all)"
    exit 1
fi

# ------------------------------------------------------------------ (a) make install
UNITS="gpuswapd.service gpuswapd.socket gpuswapd-admin.socket"
dest=$tmp/root
# -o: install exactly the binary under test, never rebuild it here
if make --no-print-directory -s -o "$BUILD/gpuswapd" BUILD="$BUILD" install DESTDIR="$dest" >"$tmp/install.log" 2>&1; then
    ok "install: make install DESTDIR=... succeeds"
else
    fail "install: make install DESTDIR=... failed"
    show "$tmp/install.log"
fi

expect=(usr/local/bin/gpuswapd
        usr/local/lib/systemd/system/gpuswapd.service
        usr/local/lib/systemd/system/gpuswapd.socket
        usr/local/lib/systemd/system/gpuswapd-admin.socket
        usr/lib/sysusers.d/gpuswapd.conf
        usr/lib/tmpfiles.d/gpuswapd.conf
        etc/gpuswapd/gpuswapd.yaml
        usr/local/share/doc/gpuswapd/README.md
        usr/local/share/doc/gpuswapd/PROTOCOL.md
        usr/local/share/doc/gpuswapd/docs/ARCHITECTURE.md
        usr/local/share/doc/gpuswapd/docs/operations.md)
[ -x "$BUILD/gpuswap" ] && expect+=(usr/local/bin/gpuswap)
missing=()
for f in "${expect[@]}"; do [ -f "$dest/$f" ] || missing+=("$f"); done
if [ ${#missing[@]} -eq 0 ]; then
    ok "install: all ${#expect[@]} files in place"
else
    fail "install: missing ${missing[*]}"
fi
if [ -x "$dest/usr/local/bin/gpuswapd" ] && cmp -s "$GSD" "$dest/usr/local/bin/gpuswapd"; then
    ok "install: bin/gpuswapd is the built binary, executable"
else
    fail "install: bin/gpuswapd differs from $BUILD/gpuswapd or is not executable"
fi
if [ -x "$BUILD/gpuswap" ]; then
    if [ -x "$dest/usr/local/bin/gpuswap" ]; then ok "install: bin/gpuswap installed"
    else fail "install: $BUILD/gpuswap exists but was not installed"; fi
fi
svc=$dest/usr/local/lib/systemd/system/gpuswapd.service
if [ -f "$svc" ] && ! grep -q '@[A-Z]*@' "$svc" &&
   grep -qx 'ExecStart=/usr/local/bin/gpuswapd --config /etc/gpuswapd/gpuswapd.yaml' "$svc"; then
    ok "install: unit template substituted (ExecStart=/usr/local/bin/gpuswapd)"
else
    fail "install: gpuswapd.service still has @VARS@ or a wrong ExecStart"
    grep -n 'ExecStart\|@' "$svc" 2>/dev/null | sed 's/^/    | /'
fi

# the socket units listen where the shipped config says the sockets are
"$GSD" --check-config "$dest/etc/gpuswapd/gpuswapd.yaml" >"$tmp/cfg.txt" 2>&1
cfg_sock=$(awk '/^listen:/{s=1} /^admin:/{s=2} s==1 && $1=="socket:"{gsub(/"/,"",$2); print $2; s=0}' "$tmp/cfg.txt")
cfg_admin=$(awk '/^admin:/{s=1} s==1 && $1=="socket:"{gsub(/"/,"",$2); print $2; s=0}' "$tmp/cfg.txt")
u_sock=$(sed -n 's/^ListenStream=//p' "$dest/usr/local/lib/systemd/system/gpuswapd.socket" 2>/dev/null)
u_admin=$(sed -n 's/^ListenStream=//p' "$dest/usr/local/lib/systemd/system/gpuswapd-admin.socket" 2>/dev/null)
if [ -n "$cfg_sock" ] && [ "$cfg_sock" = "$u_sock" ] && [ -n "$cfg_admin" ] && [ "$cfg_admin" = "$u_admin" ]; then
    ok "install: socket units listen on the config's paths ($u_sock, $u_admin)"
else
    fail "install: config sockets ($cfg_sock, $cfg_admin) != socket units ($u_sock, $u_admin)"
fi

# a second install keeps the operator's config
echo "# operator edit" >>"$dest/etc/gpuswapd/gpuswapd.yaml"
make --no-print-directory -s -o "$BUILD/gpuswapd" BUILD="$BUILD" install DESTDIR="$dest" >"$tmp/install2.log" 2>&1
if tail -n 1 "$dest/etc/gpuswapd/gpuswapd.yaml" | grep -qx '# operator edit'; then
    ok "install: an existing /etc/gpuswapd/gpuswapd.yaml is not overwritten"
else
    fail "install: a second make install overwrote the operator's config"
fi

# PREFIX moves binaries, units, docs and ExecStart together
dest2=$tmp/root-usr
make --no-print-directory -s -o "$BUILD/gpuswapd" BUILD="$BUILD" install PREFIX=/usr DESTDIR="$dest2" >"$tmp/install3.log" 2>&1
if [ -x "$dest2/usr/bin/gpuswapd" ] && [ -f "$dest2/usr/share/doc/gpuswapd/README.md" ] &&
   grep -qx 'ExecStart=/usr/bin/gpuswapd --config /etc/gpuswapd/gpuswapd.yaml' \
       "$dest2/usr/lib/systemd/system/gpuswapd.service" 2>/dev/null; then
    ok "install: PREFIX=/usr puts bin, units and docs under /usr"
else
    fail "install: PREFIX=/usr layout wrong"
    show "$tmp/install3.log"
fi

# uninstall removes everything but the config
make --no-print-directory -s BUILD="$BUILD" uninstall PREFIX=/usr DESTDIR="$dest2" >"$tmp/uninstall.log" 2>&1
left=$(cd "$dest2" && find . -type f | sort | tr '\n' ' ')
if [ "$left" = "./etc/gpuswapd/gpuswapd.yaml " ]; then
    ok "uninstall: removes every installed file, keeps the config"
else
    fail "uninstall: left behind: $left"
    show "$tmp/uninstall.log"
fi

# ------------------------------------------------------------------ (b) systemd-analyze verify
if ! command -v systemd-analyze >/dev/null; then
    skip "systemd-analyze not installed: unit verification not run"
else
    # The installed ExecStart= names /usr/local/bin/gpuswapd, which need not exist on this host;
    # verify checks that the command is executable, so point it at the binary under test.
    vdir=$tmp/verify
    mkdir -p "$vdir"
    for u in $UNITS; do cp "$dest/usr/local/lib/systemd/system/$u" "$vdir/" 2>/dev/null; done
    sed -i "s|^ExecStart=/usr/local/bin/gpuswapd |ExecStart=$GSD |" "$vdir/gpuswapd.service"
    (cd "$vdir" && systemd-analyze verify --man=no $UNITS) >"$tmp/verify.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && [ ! -s "$tmp/verify.log" ]; then
        ok "verify: systemd-analyze verify accepts the three units without a warning"
    else
        fail "verify: systemd-analyze verify exited $rc or warned"
        show "$tmp/verify.log"
    fi
    if systemd-analyze security --help 2>/dev/null | grep -q -- '--offline'; then
        # The exposure the unit reached (docs/operations.md "Hardening"): a change that raises it fails
        # here. --threshold is in tenths (14 = 1.4); the parsed score is checked as well.
        max_exposure=1.4
        (cd "$vdir" && systemd-analyze security --offline=yes --threshold=14 "$vdir/gpuswapd.service") \
            >"$tmp/security.log" 2>&1
        rc=$?
        score=$(sed -n 's/.*Overall exposure level for gpuswapd.service: \([0-9][0-9.]*\).*/\1/p' \
                "$tmp/security.log")
        if [ $rc -eq 0 ] && [ -n "$score" ] && awk -v s="$score" -v m="$max_exposure" 'BEGIN { exit !(s <= m) }'; then
            ok "verify: systemd-analyze security exposure $score (at most $max_exposure)"
        else
            fail "verify: systemd-analyze security exposure ${score:-?} above $max_exposure (rc $rc)"
            grep -E '✗|Overall' "$tmp/security.log" | sed 's/^/    | /'
        fi
        # the settings the score rests on, and the ones the GPU needs, are all there
        missing=()
        for kv in User=gpuswapd NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes \
                  DevicePolicy=closed 'DeviceAllow=char-nvidia\* rw' LimitMEMLOCK=infinity \
                  CapabilityBoundingSet= MemoryDenyWriteExecute=yes 'RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6' \
                  SystemCallFilter=@system-service SystemCallArchitectures=native; do
            grep -qx "$kv" "$vdir/gpuswapd.service" || missing+=("$kv")
        done
        if grep -q '^PrivateDevices=yes' "$vdir/gpuswapd.service"; then missing+=("no PrivateDevices=yes"); fi
        if [ ${#missing[@]} -eq 0 ]; then
            ok "verify: unprivileged user, hardening, nvidia devices only, unlimited memlock"
        else
            fail "verify: gpuswapd.service lacks: ${missing[*]}"
        fi
    fi
fi
if command -v systemd-sysusers >/dev/null && command -v systemd-tmpfiles >/dev/null; then
    # into the DESTDIR tree: user and group databases of its own, not the host's
    if systemd-sysusers --root="$dest" gpuswapd.conf >"$tmp/sysusers.log" 2>&1 &&
       grep -q '^gpuswapd:x:[0-9]*:[0-9]*:.*:/var/lib/gpuswapd:' "$dest/etc/passwd" &&
       grep -q '^video:x:[0-9]*:.*gpuswapd' "$dest/etc/group"; then
        ok "sysusers: creates system user gpuswapd, a member of video"
    else
        fail "sysusers: gpuswapd.conf did not create the user and memberships"
        show "$tmp/sysusers.log"
    fi
    systemd-tmpfiles --root="$dest" --create gpuswapd.conf >"$tmp/tmpfiles.log" 2>&1
    uid=$(awk -F: '$1=="gpuswapd"{print $3}' "$dest/etc/passwd" 2>/dev/null)
    got=$(cd "$dest" && stat -c '%n %a %u' run/gpuswapd var/lib/gpuswapd/models 2>/dev/null | tr '\n' ' ')
    if [ -n "$uid" ] && [ "$got" = "run/gpuswapd 755 $uid var/lib/gpuswapd/models 750 $uid " ]; then
        ok "tmpfiles: /run/gpuswapd 0755 and /var/lib/gpuswapd/models 0750, owned by gpuswapd"
    else
        fail "tmpfiles: got '$got' (gpuswapd uid '$uid')"
        show "$tmp/tmpfiles.log"
    fi
else
    skip "systemd-sysusers/systemd-tmpfiles not installed: sysusers.d and tmpfiles.d entries not run"
fi

# ------------------------------------------------------------------ daemon config for (c) and (d)
"$BUILD/mkmodel" --out "$tmp/m.gguf" --type f16 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 \
    --vocab 320 >/dev/null 2>&1 || fail "setup: mkmodel failed"

# write_config DIR: a sim-backend config with sockets DIR/s.sock and DIR/a.sock
write_config() {
    mkdir -p "$1"
    cat >"$1/gpuswapd.yaml" <<EOF
listen:
  socket: $1/s.sock
admin:
  socket: $1/a.sock
device:
  backend: sim
  memory: 4MiB
  page_size: 64KiB
  threads: 1
scheduler:
  drain_timeout: 5s
models:
  - name: m
    path: $tmp/m.gguf
EOF
}

# ------------------------------------------------------------------ (c) socket activation
if [ ! -x /usr/bin/systemd-socket-activate ]; then
    skip "/usr/bin/systemd-socket-activate not installed: socket activation not run"
elif [ ! -x "$PY" ]; then
    skip "$PY not installed: socket activation not run"
else
    sa=$tmp/sa
    write_config "$sa"
    # admin first: the daemon must match the passed fds by path, not by position
    /usr/bin/systemd-socket-activate -l "$sa/a.sock" -l "$sa/s.sock" \
        "$GSD" --config "$sa/gpuswapd.yaml" >"$sa/log" 2>&1 &
    daemon_pid=$!
    for ((i = 0; i < 100; i++)); do
        [ -S "$sa/s.sock" ] && [ -S "$sa/a.sock" ] && break
        sleep 0.05
    done
    ino_s=$(stat -c %i "$sa/s.sock" 2>/dev/null)
    ino_a=$(stat -c %i "$sa/a.sock" 2>/dev/null)
    if [ -n "$ino_s" ] && [ -n "$ino_a" ]; then
        ok "activate: systemd-socket-activate listens on both sockets"
    else
        fail "activate: systemd-socket-activate did not create the sockets"
        show "$sa/log"
    fi
    # the first connection makes systemd-socket-activate exec the daemon (same pid)
    "$PY" - "$sa/s.sock" "$sa/a.sock" >"$sa/client.log" 2>&1 <<'EOF'
import json, socket, sys

def call(path, req, want):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    s.sendall((json.dumps(req) + "\n").encode())
    buf = b""
    try:
        while True:
            while b"\n" not in buf:
                chunk = s.recv(65536)
                if not chunk:
                    return "connection closed"
                buf += chunk
            line, buf = buf.split(b"\n", 1)
            ev = json.loads(line)
            if want(ev):
                return None
            if ev.get("event") == "error" or ev.get("ok") is False:
                return "error answer: %s" % line.decode()
    except socket.timeout:
        return "no answer within 10 s"
    finally:
        s.close()

gen = {"op": "generate", "id": 1, "model": "m", "prompt": "hi", "max_tokens": 3, "temperature": 0}
bad = 0
for n in (1, 2):
    gen["id"] = n
    err = call(sys.argv[1], gen, lambda ev: ev.get("id") == n and ev.get("event") == "done")
    print(("ok activate: generate %d on the activated inference socket ends with a done event" % n)
          if err is None else ("FAIL activate: generate %d: %s" % (n, err)))
    bad += err is not None
    if err:
        break
err = call(sys.argv[2], {"op": "stats", "id": "s"}, lambda ev: ev.get("id") == "s" and ev.get("ok") is True)
print("ok activate: stats answered on the activated admin socket" if err is None
      else "FAIL activate: stats on the admin socket: %s" % err)
bad += err is not None
sys.exit(1 if bad else 0)
EOF
    crc=$?
    grep -E '^(ok|FAIL) ' "$sa/client.log"
    fails=$((fails + $(grep -c '^FAIL ' "$sa/client.log")))
    if [ $crc -ne 0 ]; then
        if ! grep -qE '^(ok|FAIL) ' "$sa/client.log"; then
            fail "activate: client crashed"
            show "$sa/client.log"
        fi
        # the usual cause: an adopted listening fd left blocking (accept4 then blocks the loop)
        if [ -r "/proc/$daemon_pid/syscall" ] && [ "$(cut -d' ' -f1 "/proc/$daemon_pid/syscall")" = 288 ]; then
            echo "    | the daemon's event loop is blocked in accept4(): sockets from sd_listen_fds() are"
            echo "    | blocking unless the daemon makes them O_NONBLOCK (systemd-socket-activate never does)"
        fi
        show "$sa/log"
    fi
    exe=$(readlink "/proc/$daemon_pid/exe" 2>/dev/null)
    if [ "${exe% (deleted)}" = "$(readlink -f "$GSD")" ]; then
        ok "activate: systemd-socket-activate exec'd gpuswapd (pid $daemon_pid)"
    else
        fail "activate: pid $daemon_pid runs '${exe:-nothing}', not gpuswapd"
        show "$sa/log"
    fi
    if [ "$(stat -c %i "$sa/s.sock" 2>/dev/null)" = "$ino_s" ] &&
       [ "$(stat -c %i "$sa/a.sock" 2>/dev/null)" = "$ino_a" ]; then
        ok "activate: the daemon used the passed fds (socket inodes unchanged while serving)"
    else
        fail "activate: a socket was unlinked or re-created by the daemon"
    fi
    kill -TERM "$daemon_pid" 2>/dev/null
    wait_exit "$daemon_pid" 150
    rc=$?
    daemon_pid=
    if [ $rc -eq 0 ]; then
        ok "activate: SIGTERM: the daemon drains and exits 0"
    else
        fail "activate: SIGTERM: exit code $rc (124 = still running after 15 s)"
        show "$sa/log"
    fi
    if [ "$(stat -c %i "$sa/s.sock" 2>/dev/null)" = "$ino_s" ] &&
       [ "$(stat -c %i "$sa/a.sock" 2>/dev/null)" = "$ino_a" ]; then
        ok "activate: socket files systemd owns are left in place after exit"
    else
        fail "activate: the daemon unlinked a socket file it did not create"
    fi
fi

# ------------------------------------------------------------------ (d) sd_notify
if [ ! -x "$PY" ]; then
    skip "$PY not installed: sd_notify not run"
else
    nd=$tmp/notify
    write_config "$nd"
    "$PY" - "$GSD" "$nd" >"$nd/notify.log" 2>&1 <<'EOF'
import os, signal, socket, subprocess, sys, time

gsd, d = sys.argv[1], sys.argv[2]
cfg = os.path.join(d, "gpuswapd.yaml")
good_cfg = open(cfg).read()
ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
ns.bind(os.path.join(d, "notify.sock"))
env = dict(os.environ, NOTIFY_SOCKET=os.path.join(d, "notify.sock"), WATCHDOG_USEC="400000")
env.pop("WATCHDOG_PID", None)
env.pop("LISTEN_FDS", None)
env.pop("LISTEN_PID", None)
log = open(os.path.join(d, "log"), "w")
p = subprocess.Popen([gsd, "--config", cfg], env=env, stdout=log, stderr=subprocess.STDOUT)
seen = []   # every variable assignment received, in order
bad = 0

def check(cond, what):
    global bad
    print(("ok notify: " if cond else "FAIL notify: ") + what)
    bad += not cond
    return cond

def wait_for(pred, timeout):
    """Reads notifications until pred(seen) or timeout; True when pred held."""
    end = time.time() + timeout
    while not pred():
        left = end - time.time()
        if left <= 0:
            return False
        ns.settimeout(left)
        try:
            msg = ns.recv(4096).decode()
        except socket.timeout:
            return False
        seen.extend(l for l in msg.split("\n") if l)
    return True

def after(mark, var):
    return lambda: any(v == var or (var.endswith("=") and v.startswith(var)) for v in seen[mark:])

check(wait_for(after(0, "READY=1"), 30), "READY=1 once serving")
check(wait_for(after(0, "STATUS="), 5), "STATUS= sent (%s)" % next((v for v in seen if v.startswith("STATUS=")), "none"))
m = len(seen)
check(wait_for(after(m, "WATCHDOG=1"), 3), "WATCHDOG=1 within 3 s when WATCHDOG_USEC=400000")

m = len(seen)
p.send_signal(signal.SIGHUP)
check(wait_for(after(m, "RELOADING=1"), 10) and wait_for(after(seen.index("RELOADING=1", m) + 1, "READY=1"), 10),
      "SIGHUP: RELOADING=1 then READY=1")

# A refused reload (bad file) keeps the old config running; systemd must still be told the reload is over.
with open(cfg, "w") as f:
    f.write("listen: [\n")
m = len(seen)
p.send_signal(signal.SIGHUP)
check(wait_for(after(m, "RELOADING=1"), 10) and wait_for(after(seen.index("RELOADING=1", m) + 1, "READY=1"), 10),
      "SIGHUP with a broken config: RELOADING=1 then READY=1 (old config kept)")
with open(cfg, "w") as f:
    f.write(good_cfg)
check(p.poll() is None, "the daemon survives a refused reload")

m = len(seen)
p.send_signal(signal.SIGTERM)
check(wait_for(after(m, "STOPPING=1"), 10), "SIGTERM: STOPPING=1")
try:
    rc = p.wait(timeout=15)
except subprocess.TimeoutExpired:
    p.kill()
    rc = "still running after 15 s"
check(rc == 0, "SIGTERM: exit code %s" % rc)
if bad:
    print("notifications: %r" % seen)
sys.exit(1 if bad else 0)
EOF
    nrc=$?
    grep -E '^(ok|FAIL) ' "$nd/notify.log"
    fails=$((fails + $(grep -c '^FAIL ' "$nd/notify.log")))
    if [ $nrc -ne 0 ]; then
        grep -v -E '^(ok|FAIL) ' "$nd/notify.log" | sed 's/^/    | /' | tail -n 15
        if ! grep -qE '^(ok|FAIL) ' "$nd/notify.log"; then fail "notify: driver crashed"; fi
        show "$nd/log"
    fi
fi

if [ $fails -eq 0 ]; then
    echo "test_systemd: all checks passed"
else
    echo "test_systemd: $fails check(s) failed"
fi
[ $fails -eq 0 ]
