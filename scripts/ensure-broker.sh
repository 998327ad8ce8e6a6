#!/usr/bin/env bash
# Make sure an AMQP broker answers at $RABBITMQ_URL, starting (or installing and
# starting) the local Debian rabbitmq-server if needed.
#
# Environment:
#   RABBITMQ_URL          broker to check (default amqp://guest:guest@127.0.0.1:5672/)
#   BROKER_WAIT_SECONDS   how long to wait for it to answer (default 90)
#   RABBITMQ_NODE_PORT    AMQP port the local rabbitmq-server uses, if not 5672
#
# A local server is only started when the URL names this machine *and* the port the
# local rabbitmq-server would listen on. Any other address is assumed to be somebody
# else's broker (a proxy, a throw-away test node, a remote host): starting the default
# node there would not help and could clash with a node that is already running.
#
# Fast and side-effect free when the broker already answers.
set -euo pipefail

readonly DEFAULT_URL="amqp://guest:guest@127.0.0.1:5672/"
readonly LOG_DIR="/var/log/rabbitmq"
readonly RABBITMQ_CONF="/etc/rabbitmq/rabbitmq.conf"
readonly RABBITMQ_ENV_CONF="/etc/rabbitmq/rabbitmq-env.conf"

url="${RABBITMQ_URL:-$DEFAULT_URL}"
wait_seconds="${BROKER_WAIT_SECONDS:-90}"

die() {
    echo "broker: error: $*" >&2
    exit 1
}

[[ "$wait_seconds" =~ ^[0-9]+$ ]] || die "BROKER_WAIT_SECONDS must be a whole number, got '$wait_seconds'"

# --- parse scheme://[user[:password]@]host[:port][/vhost][?query] --------------------
[[ "$url" == *://* ]] || die "RABBITMQ_URL '$url' is not a URL (expected amqp://host:port/)"
scheme="${url%%://*}"
authority="${url#*://}"
authority="${authority%%[/?#]*}"
hostport="${authority##*@}" # the last '@' ends the credentials
case "$scheme" in
    amqp) default_port=5672 ;;
    amqps) default_port=5671 ;;
    *) die "unsupported scheme '$scheme' in RABBITMQ_URL (expected amqp or amqps)" ;;
esac
if [[ "$hostport" == \[* ]]; then # [IPv6]:port
    host="${hostport#[}"
    host="${host%%]*}"
    port="${hostport#*]}"
    port="${port#:}"
else
    host="${hostport%%:*}"
    port=""
    [[ "$hostport" == *:* ]] && port="${hostport#*:}"
fi
host="${host:-localhost}"
port="${port:-$default_port}"
[[ "$port" =~ ^[0-9]+$ ]] || die "bad port '$port' in RABBITMQ_URL"
display="$host:$port"
[[ "$host" == *:* ]] && display="[$host]:$port"

# --- helpers ---------------------------------------------------------------------------
answers() {
    # A bare TCP connect: enough to tell "something listens" without speaking AMQP.
    # The timeout keeps a black-holed remote address from stalling each probe.
    # shellcheck disable=SC2016  # expanded by the inner bash, on purpose
    timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$host" "$port" 2>/dev/null
}

is_local_host() {
    case "$host" in
        localhost | localhost.localdomain | 127.* | ::1 | 0.0.0.0 | "$(hostname 2>/dev/null || true)") return 0 ;;
    esac
    return 1
}

# Ports the local rabbitmq-server would listen on for this scheme.
local_server_ports() {
    local node_port="${RABBITMQ_NODE_PORT:-}" listener_key="tcp"
    if [[ "$scheme" == amqp ]]; then
        if [[ -z "$node_port" && -r "$RABBITMQ_ENV_CONF" ]]; then
            node_port="$(sed -n 's/^[[:space:]]*NODE_PORT=["]\{0,1\}\([0-9]*\).*/\1/p' "$RABBITMQ_ENV_CONF" | tail -n 1)"
        fi
        echo "${node_port:-5672}"
    else
        listener_key="ssl" # the default install has no TLS listener unless configured
    fi
    if [[ -r "$RABBITMQ_CONF" ]]; then
        # e.g. "listeners.tcp.default = 5672" or "listeners.tcp.local = 127.0.0.1:5672"
        sed -n "s/^[[:space:]]*listeners\.$listener_key\.[^=]*=[[:space:]]*\(.*:\)\{0,1\}\([0-9][0-9]*\)[[:space:]]*$/\2/p" "$RABBITMQ_CONF"
    fi
}

is_local_default_broker() {
    is_local_host || return 1
    local p
    for p in $(local_server_ports); do
        [[ "$p" == "$port" ]] && return 0
    done
    return 1
}

as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo -n "$@"
    else
        die "need root (or password-less sudo) to run: $*"
    fi
}

node_running() {
    # The Erlang node can be up (still booting) before the AMQP port opens; starting
    # a second node with the same name would only fail, so check first.
    command -v rabbitmq-diagnostics >/dev/null 2>&1 || return 1
    timeout 20 rabbitmq-diagnostics -q ping >/dev/null 2>&1
}

show_logs() {
    echo "broker: logs are in $LOG_DIR" >&2
    local f
    for f in "$LOG_DIR"/startup_err "$LOG_DIR"/startup_log "$LOG_DIR"/rabbit@*.log; do
        if [[ -s "$f" ]]; then
            echo "---- last lines of $f ----" >&2
            tail -n 10 "$f" >&2 || true
        fi
    done
}

# --- fast path -------------------------------------------------------------------------
if answers; then
    echo "broker: answering at $display"
    exit 0
fi

tried="checked $display"
if is_local_default_broker; then
    if ! command -v rabbitmq-server >/dev/null 2>&1; then
        echo "broker: nothing answers at $display and rabbitmq-server is not installed; installing it"
        tried="$tried; installed rabbitmq-server with apt-get"
        as_root apt-get update -q
        if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q rabbitmq-server; then
            # The package's postinst may fail to start the service where there is no
            # init system; the server itself is usable if the binary got installed.
            command -v rabbitmq-server >/dev/null 2>&1 || die "could not install rabbitmq-server ($tried)"
            echo "broker: apt-get reported an error, but rabbitmq-server is installed; carrying on"
        fi
    fi
    if answers; then
        : # the package's postinst started it
    elif node_running; then
        echo "broker: the local rabbitmq node is running but not accepting connections yet"
        tried="$tried; found the local node already running"
    else
        echo "broker: nothing answers at $display; starting the local rabbitmq-server"
        tried="$tried; ran 'rabbitmq-server -detached'"
        as_root rabbitmq-server -detached
    fi
else
    if is_local_host; then
        reason="it is not the local default broker port, so not starting one"
    else
        reason="it is not on this machine, so not starting one"
    fi
    echo "broker: nothing answers at $display yet; $reason; waiting up to ${wait_seconds}s"
    tried="$tried; $reason"
fi

# --- wait --------------------------------------------------------------------------------
deadline=$((SECONDS + wait_seconds))
printf 'broker: waiting for %s ' "$display"
until answers; do
    if ((SECONDS >= deadline)); then
        echo
        echo "broker: error: nothing answers at $display after waiting ${wait_seconds}s ($tried)" >&2
        if is_local_default_broker; then
            show_logs
        fi
        exit 1
    fi
    printf '.'
    sleep 1
done
echo " up"

# The listener opens near the end of boot; await_startup covers the rest (plugins,
# definitions) so tests do not race a half-started node.
# Only for the default local node: that is the node rabbitmqctl talks to.
if is_local_default_broker && command -v rabbitmqctl >/dev/null 2>&1; then
    remaining=$((deadline - SECONDS))
    ((remaining < 5)) && remaining=5
    if ! out="$(timeout "$((remaining + 5))" rabbitmqctl -q await_startup --timeout "$remaining" 2>&1)"; then
        # The AMQP port already answers, so this is most likely a CLI problem
        # (cookie, permissions) rather than a broker that is not ready.
        echo "broker: warning: 'rabbitmqctl await_startup' failed; the AMQP port answers, carrying on" >&2
        [[ -n "$out" ]] && echo "$out" | tail -n 5 >&2
    fi
fi

echo "broker: answering at $display"
