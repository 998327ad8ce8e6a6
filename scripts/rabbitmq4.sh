#!/usr/bin/env bash
# A RabbitMQ 4.x node for the test suite, beside the shared broker on 127.0.0.1:5672.
#
# The node is Debian 13's own rabbitmq-server package (RabbitMQ 4.0.x on Erlang 27), run
# from a minimal Debian 13 root built with debootstrap. The root is built once and cached
# outside the clone; every node gets a fresh private directory inside it (data, logs,
# cookie, config), its own node name and its own ports, and loses all of it on `stop`.
#
# Usage: scripts/rabbitmq4.sh COMMAND
#   build    make sure the cached root exists (built when missing or incomplete)
#   start    build if needed, start the node, wait until it accepts AMQP connections;
#            prints the node's AMQP URL on the last line of stdout
#   stop     stop the node, remove its directory (no-op when it does not run)
#   status   exit 0 when the node runs, 1 when not
#   url      print the node's AMQP URL
#   ctl ARG...  run rabbitmqctl against the node (e.g. `ctl list_queues`)
#   clean    stop the node and delete the cached root
#   python   make sure the root has Debian's CPython with venv support (python3-venv), for
#            make test's pass on that Python (scripts/python-root.sh); prints its version
#
# Environment:
#   RABBITRY_RMQ4_CACHE   where the root is cached (default /var/cache/rabbitry-test when
#                         run as root, else ${XDG_CACHE_HOME:-~/.cache}/rabbitry-test)
#   RABBITRY_RMQ4_SUITE   Debian suite to bootstrap (default trixie)
#   RABBITRY_RMQ4_MIRROR  Debian mirror (default http://deb.debian.org/debian)
#   RABBITRY_RMQ4_PORT    AMQP port (default 5682); the distribution port is PORT+20000,
#                         the management port PORT+10000, the CLI ports PORT+30001..+30011
#   RABBITRY_RMQ4_WAIT    seconds to wait for the node to accept connections (default 120)
#
# Needs root (debootstrap, chroot and a private mount namespace for /proc and /dev);
# password-less sudo is used when not root. Never prompts: safe with CI=true and no stdin.
set -euo pipefail

readonly SUITE="${RABBITRY_RMQ4_SUITE:-trixie}"
readonly MIRROR="${RABBITRY_RMQ4_MIRROR:-http://deb.debian.org/debian}"
readonly PORT="${RABBITRY_RMQ4_PORT:-5682}"
readonly WAIT_SECONDS="${RABBITRY_RMQ4_WAIT:-120}"
# Bumped when what goes into the root changes, so an older cached root is rebuilt.
readonly ROOT_FORMAT=1
# The second Python of the test suite (make test's Python 3.13 pass) comes from the same
# root; a root built before it was added gets it from `python` (no rebuild).
readonly PYTHON_PACKAGES="python3-venv"

die() {
    echo "rabbitmq4: error: $*" >&2
    exit 1
}
say() { echo "rabbitmq4: $*" >&2; }

[[ "$PORT" =~ ^[0-9]+$ ]] && ((PORT >= 1024 && PORT <= 35000)) ||
    die "RABBITRY_RMQ4_PORT must be a port in 1024-35000, got '$PORT'"
[[ "$WAIT_SECONDS" =~ ^[0-9]+$ ]] || die "RABBITRY_RMQ4_WAIT must be a whole number, got '$WAIT_SECONDS'"
readonly DIST_PORT=$((PORT + 20000))
readonly MGMT_PORT=$((PORT + 10000))
readonly CLI_PORT_MIN=$((PORT + 30001))
readonly CLI_PORT_MAX=$((PORT + 30011))
for p in "$PORT" "$DIST_PORT" "$MGMT_PORT" "$CLI_PORT_MIN" "$CLI_PORT_MAX"; do
    case "$p" in 4369 | 5671 | 5672 | 15672 | 25672 | 3567[2-9] | 3568[0-2])
        die "RABBITRY_RMQ4_PORT=$PORT would give port $p, which the shared node uses" ;;
    esac
done
readonly NODE="rabbitry4-$PORT@localhost"
readonly URL="amqp://guest:guest@127.0.0.1:$PORT/"

if [[ -n "${RABBITRY_RMQ4_CACHE:-}" ]]; then
    CACHE="$RABBITRY_RMQ4_CACHE"
elif [[ "$(id -u)" -eq 0 ]]; then
    CACHE=/var/cache/rabbitry-test
else
    CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/rabbitry-test"
fi
readonly CACHE
readonly ROOT="$CACHE/debian-$SUITE-rabbitmq"
readonly STAMP="$ROOT/.rabbitry-root"
# The node's private directory, as seen from inside the root and from outside.
readonly NODE_DIR_IN="/run/rabbitry/$PORT"
readonly NODE_DIR="$ROOT$NODE_DIR_IN"

as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo -n "$@"
    else
        die "needs root (or password-less sudo) to run: $*"
    fi
}

answers() {
    # shellcheck disable=SC2016  # expanded by the inner bash, on purpose
    timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$PORT" 2>/dev/null
}

# Runs a command inside the root, in a private mount namespace with /proc and /dev, so
# no mount is ever left on the host: the namespace dies with its last process.
in_root() {
    as_root unshare --mount --propagation private -- /bin/sh -c '
        root="$1"; shift
        mount -t proc proc "$root/proc" && mount --rbind /dev "$root/dev" || exit 97
        exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"
    ' _ "$ROOT" "$@"
}

root_ok() {
    [[ -f "$STAMP" && "$(cat "$STAMP" 2>/dev/null)" == "format=$ROOT_FORMAT" ]] &&
        [[ -x "$ROOT/usr/lib/rabbitmq/bin/rabbitmq-server" ]]
}

build() {
    as_root mkdir -p "$CACHE"
    # One build at a time; a second caller waits for the first and then finds the root.
    exec 8>"$CACHE/.build.lock"
    flock -w 1800 8 || die "another build of $ROOT holds $CACHE/.build.lock for 30 minutes"
    if root_ok; then
        flock -u 8
        return 0
    fi
    local started=$SECONDS
    say "building the Debian $SUITE root with rabbitmq-server in $ROOT (a few minutes, once)"
    if ! command -v debootstrap >/dev/null 2>&1; then
        say "installing debootstrap"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap </dev/null ||
            { as_root apt-get update -q </dev/null &&
                as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap </dev/null; } ||
            die "could not install debootstrap with apt-get"
    fi
    # Built next to its final place and renamed at the end, so an interrupted build never
    # leaves a root that looks usable.
    local tmp="$CACHE/.building-$SUITE"
    as_root rm -rf "$tmp" "$ROOT"
    if ! as_root debootstrap --variant=minbase "$SUITE" "$tmp" "$MIRROR" </dev/null >"$CACHE/debootstrap.log" 2>&1; then
        tail -n 20 "$CACHE/debootstrap.log" >&2
        die "debootstrap $SUITE from $MIRROR failed (full log: $CACHE/debootstrap.log)"
    fi
    # Package scripts must not start services in the root.
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$tmp/usr/sbin/policy-rc.d" >/dev/null
    as_root chmod 755 "$tmp/usr/sbin/policy-rc.d"
    if ! as_root unshare --mount --propagation private -- /bin/sh -c '
        mount -t proc proc "$1/proc" && mount --rbind /dev "$1/dev" || exit 97
        exec chroot "$1" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
            DEBIAN_FRONTEND=noninteractive /bin/sh -c \
            "apt-get update -q && apt-get install -y -q --no-install-recommends rabbitmq-server $2 && apt-get clean"
    ' _ "$tmp" "$PYTHON_PACKAGES" </dev/null >"$CACHE/apt.log" 2>&1; then
        tail -n 20 "$CACHE/apt.log" >&2
        die "installing rabbitmq-server in the $SUITE root failed (full log: $CACHE/apt.log)"
    fi
    [[ -x "$tmp/usr/lib/rabbitmq/bin/rabbitmq-server" ]] ||
        die "rabbitmq-server is installed in the root but $tmp/usr/lib/rabbitmq/bin/rabbitmq-server is missing"
    echo "format=$ROOT_FORMAT" | as_root tee "$tmp/.rabbitry-root" >/dev/null
    as_root mv "$tmp" "$ROOT"
    say "root ready in $((SECONDS - started))s: $(version)"
    flock -u 8
}

python_ok() {
    [[ -x "$ROOT/usr/bin/python3" && -f "$ROOT/usr/share/doc/python3-venv/copyright" ]]
}

# Debian's CPython with venv support in the root (added to an older root in place).
python_root() {
    root_ok || build
    if ! python_ok; then
        exec 8>"$CACHE/.build.lock"
        flock -w 1800 8 || die "another build of $ROOT holds $CACHE/.build.lock for 30 minutes"
        if ! python_ok; then
            say "installing $PYTHON_PACKAGES in $ROOT"
            # shellcheck disable=SC2086  # a list of package names
            if ! in_root DEBIAN_FRONTEND=noninteractive /bin/sh -c \
                "apt-get update -q && apt-get install -y -q --no-install-recommends $PYTHON_PACKAGES && apt-get clean" \
                </dev/null >"$CACHE/apt-python.log" 2>&1; then
                tail -n 20 "$CACHE/apt-python.log" >&2
                die "installing $PYTHON_PACKAGES in the root failed (full log: $CACHE/apt-python.log)"
            fi
        fi
        flock -u 8
    fi
    in_root /usr/bin/python3 --version
}

version() {
    local v
    v="$(sed -n 's/^Version: //p' <(awk '/^Package: rabbitmq-server$/,/^$/' "$ROOT/var/lib/dpkg/status"))"
    echo "rabbitmq-server ${v:-unknown}"
}

# The CLI's environment: the node's private HOME (and so its cookie) and its ports.
node_env() {
    echo HOME="$NODE_DIR_IN/home" \
        RABBITMQ_NODENAME="$NODE" \
        RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
        RABBITMQ_NODE_PORT="$PORT" \
        RABBITMQ_DIST_PORT="$DIST_PORT" \
        RABBITMQ_CTL_DIST_PORT_MIN="$CLI_PORT_MIN" \
        RABBITMQ_CTL_DIST_PORT_MAX="$CLI_PORT_MAX" \
        RABBITMQ_CONFIG_FILE="$NODE_DIR_IN/rabbitmq.conf" \
        RABBITMQ_CONF_ENV_FILE="$NODE_DIR_IN/rabbitmq-env.conf" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$NODE_DIR_IN/enabled_plugins" \
        RABBITMQ_MNESIA_BASE="$NODE_DIR_IN/data" \
        RABBITMQ_LOG_BASE="$NODE_DIR_IN/log" \
        RABBITMQ_PID_FILE="$NODE_DIR_IN/pid"
}

ctl() {
    # shellcheck disable=SC2046  # node_env is a list of words on purpose
    in_root $(node_env) /usr/lib/rabbitmq/bin/rabbitmqctl -n "$NODE" "$@"
}

# Node processes: those whose root is ours and whose command line names the node's
# directory (Erlang 27 takes the node name from the environment, not the command line).
node_pids() {
    local d pid
    for d in /proc/[0-9]*; do
        pid="${d#/proc/}"
        [[ "$(readlink "$d/root" 2>/dev/null)" == "$ROOT" ]] || continue
        tr '\0' ' ' <"$d/cmdline" 2>/dev/null | grep -qF -- " $NODE_DIR_IN/" || continue
        echo "$pid"
    done
}

epmd_has_name() {
    # epmd NAMES request: length 1, 'n'.
    python3 - "${NODE%@*}" <<'EOF' 2>/dev/null
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", 4369), 2)
    s.sendall(b"\x00\x01n")
    data = b""
    while chunk := s.recv(4096):
        data += chunk
except OSError:
    sys.exit(1)
sys.exit(0 if f"name {sys.argv[1]} at".encode() in data else 1)
EOF
}

running() { [[ -n "$(node_pids)" ]]; }

start() {
    root_ok || build
    if running; then
        if answers; then
            say "$NODE already runs"
            echo "$URL"
            return 0
        fi
        say "$NODE runs but does not answer on $PORT; restarting it"
        stop
    fi
    local p
    for p in "$PORT" "$DIST_PORT" "$MGMT_PORT"; do
        if timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$p" 2>/dev/null; then
            die "port $p is taken by another process; pick other ports with RABBITRY_RMQ4_PORT"
        fi
    done
    as_root rm -rf "$NODE_DIR"
    as_root mkdir -p "$NODE_DIR/home" "$NODE_DIR/data" "$NODE_DIR/log"
    # A private random cookie: no CLI call made here can reach another node.
    head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' | as_root tee "$NODE_DIR/home/.erlang.cookie" >/dev/null
    as_root chmod 400 "$NODE_DIR/home/.erlang.cookie"
    as_root tee "$NODE_DIR/rabbitmq.conf" >/dev/null <<EOF
listeners.tcp.default = 127.0.0.1:$PORT
loopback_users = none
management.tcp.ip = 127.0.0.1
management.tcp.port = $MGMT_PORT
EOF
    : | as_root tee "$NODE_DIR/rabbitmq-env.conf" >/dev/null
    echo '[rabbitmq_management].' | as_root tee "$NODE_DIR/enabled_plugins" >/dev/null
    say "starting $NODE ($(version)) on 127.0.0.1:$PORT, management $MGMT_PORT, distribution $DIST_PORT"
    # shellcheck disable=SC2046
    in_root $(node_env) /usr/lib/rabbitmq/bin/rabbitmq-server -detached </dev/null >/dev/null 2>&1 ||
        { show_log; die "rabbitmq-server -detached failed"; }
    local began=$SECONDS
    until answers; do
        # The VM may take a few seconds to show up in /proc after -detached returns.
        if ((SECONDS - began >= WAIT_SECONDS)) || { ((SECONDS - began >= 15)) && ! running; }; then
            show_log
            stop || true
            die "$NODE did not accept AMQP connections on $PORT within $((SECONDS - began))s"
        fi
        sleep 1
    done
    if ! ctl -q await_startup --timeout "$WAIT_SECONDS" </dev/null >/dev/null 2>&1; then
        show_log
        die "$NODE answers on $PORT but 'rabbitmqctl await_startup' failed"
    fi
    say "$NODE is up"
    echo "$URL"
}

show_log() {
    local f
    for f in "$NODE_DIR"/log/*.log; do
        [[ -s "$f" ]] || continue
        echo "---- last lines of $f ----" >&2
        tail -n 20 "$f" >&2
    done
}

stop() {
    if running; then
        ctl stop </dev/null >/dev/null 2>&1 || true
        local deadline=$((SECONDS + 30))
        while running && ((SECONDS < deadline)); do sleep 0.5; done
        if running; then
            say "$NODE did not stop within 30s; killing it"
            node_pids | xargs -r kill -9 2>/dev/null || true
        fi
    fi
    # A node that is gone also leaves epmd; wait for that so the name is free again.
    local deadline=$((SECONDS + 15))
    while epmd_has_name && ((SECONDS < deadline)); do sleep 0.5; done
    epmd_has_name && say "warning: epmd still lists ${NODE%@*}"
    as_root rm -rf "$NODE_DIR"
    return 0
}

case "${1:-}" in
    build) build ;;
    start) start ;;
    stop) stop ;;
    status) running ;;
    url) echo "$URL" ;;
    ctl)
        shift
        running || die "$NODE does not run (start it first)"
        ctl "$@" </dev/null
        ;;
    python) python_root ;;
    clean) stop && as_root rm -rf "$ROOT" "$CACHE/.building-$SUITE" ;;
    *)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
