#!/usr/bin/env bash
# Debian's CPython in a minimal Debian root, for the test passes of make test that run the
# suite on another Python than the host's.
#
# Usage: scripts/python-root.sh SUITE COMMAND [ARG...]
#   SUITE    trixie: the root scripts/rabbitmq4.sh builds for the RabbitMQ 4.x node (its
#            python3 is CPython 3.13); any other suite (e.g. sid): a root of its own with
#            that suite's newest python3.X and its venv support
#   build    make sure the root exists with the interpreter (built when missing); prints
#            the interpreter's version
#   python   print the interpreter's path inside the root (/usr/bin/python3.X)
#   run DIR CMD...  run CMD inside the root with DIR (an absolute path, e.g. the clone)
#            mounted at the same path and as the working directory. The root shares the
#            host's network, so the shared broker on 127.0.0.1:5672 answers there too.
#            HOME is DIR/.cache/root-home; RABBITMQ_URL, CI, PYTEST_ADDOPTS, PIP_INDEX_URL
#            and the RABBITRY_* variables are passed through, nothing else. The host's CA
#            bundle ($PIP_CERT, else $SSL_CERT_FILE, else Debian's) is mounted in and named
#            by PIP_CERT and SSL_CERT_FILE, so pip trusts what the host trusts
#   clean    delete the root (not the trixie one: scripts/rabbitmq4.sh clean does that)
#
# Environment: RABBITRY_RMQ4_CACHE and RABBITRY_RMQ4_MIRROR as for scripts/rabbitmq4.sh
# (one cache directory for all roots). Needs root, like scripts/rabbitmq4.sh; never prompts.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HERE="$here"
readonly SUITE="${1:-}"
readonly MIRROR="${RABBITRY_RMQ4_MIRROR:-http://deb.debian.org/debian}"
# Bumped when what goes into a root of this script changes.
readonly ROOT_FORMAT=1

die() {
    echo "python-root: error: $*" >&2
    exit 1
}
say() { echo "python-root: $*" >&2; }

[[ "$SUITE" =~ ^[a-z]+$ ]] || die "the first argument is a Debian suite (trixie, sid...), got '$SUITE'"

if [[ -n "${RABBITRY_RMQ4_CACHE:-}" ]]; then
    CACHE="$RABBITRY_RMQ4_CACHE"
elif [[ "$(id -u)" -eq 0 ]]; then
    CACHE=/var/cache/rabbitry-test
else
    CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/rabbitry-test"
fi
readonly CACHE
if [[ "$SUITE" == trixie ]]; then
    readonly ROOT="$CACHE/debian-trixie-rabbitmq"
else
    readonly ROOT="$CACHE/debian-$SUITE-python"
fi
readonly STAMP="$ROOT/.rabbitry-python-root"

as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo -n "$@"
    else
        die "needs root (or password-less sudo) to run: $*"
    fi
}

# The newest python3.X in the root.
interpreter() {
    local newest
    newest="$(find "$ROOT/usr/bin" -maxdepth 1 -name 'python3.[0-9]*' -regextype posix-extended \
        -regex '.*/python3\.[0-9]+' -printf '%f\n' 2>/dev/null | sort -t. -k2,2n | tail -n 1)"
    [[ -n "$newest" ]] || return 1
    echo "/usr/bin/$newest"
}

root_ok() {
    local py
    py="$(interpreter)" || return 1
    [[ -f "$STAMP" && "$(cat "$STAMP" 2>/dev/null)" == "format=$ROOT_FORMAT" ]] &&
        [[ -f "$ROOT/usr/share/doc/${py#/usr/bin/}-venv/copyright" ]]
}

# A root of its own: debootstrap, then the suite's newest python3.X with venv support.
build_own() {
    as_root mkdir -p "$CACHE"
    exec 8>"$CACHE/.build-$SUITE-python.lock"
    flock -w 1800 8 || die "another build of $ROOT holds its lock for 30 minutes"
    if root_ok; then
        flock -u 8
        return 0
    fi
    local started=$SECONDS
    say "building the Debian $SUITE root with its newest CPython in $ROOT (a few minutes, once)"
    if ! command -v debootstrap >/dev/null 2>&1; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap </dev/null ||
            { as_root apt-get update -q </dev/null &&
                as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap </dev/null; } ||
            die "could not install debootstrap with apt-get"
    fi
    local tmp="$CACHE/.building-$SUITE-python"
    as_root rm -rf "$tmp" "$ROOT"
    if ! as_root debootstrap --variant=minbase "$SUITE" "$tmp" "$MIRROR" </dev/null \
        >"$CACHE/debootstrap-$SUITE.log" 2>&1; then
        tail -n 20 "$CACHE/debootstrap-$SUITE.log" >&2
        die "debootstrap $SUITE from $MIRROR failed (full log: $CACHE/debootstrap-$SUITE.log)"
    fi
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$tmp/usr/sbin/policy-rc.d" >/dev/null
    as_root chmod 755 "$tmp/usr/sbin/policy-rc.d"
    # A mirror that serves a snapshot of sid keeps its Release file past the date in it;
    # apt would refuse that index.
    echo 'Acquire::Check-Valid-Until "false";' |
        as_root tee "$tmp/etc/apt/apt.conf.d/99rabbitry-snapshot" >/dev/null
    # The newest python3.X the suite has (sid often carries the next one beside python3's).
    if ! as_root unshare --mount --propagation private -- /bin/sh -c '
        mount -t proc proc "$1/proc" && mount --rbind /dev "$1/dev" || exit 97
        exec chroot "$1" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
            DEBIAN_FRONTEND=noninteractive /bin/sh -c "
            set -e
            apt-get update -q
            v=\$(apt-cache search --names-only \"^python3\\.[0-9]+-venv\$\" | cut -d\" \" -f1 |
                sed \"s/-venv\$//\" | sort -t. -k2,2n | tail -n 1)
            test -n \"\$v\"
            apt-get install -y -q --no-install-recommends \"\$v-venv\" ca-certificates
            apt-get clean"
    ' _ "$tmp" </dev/null >"$CACHE/apt-$SUITE-python.log" 2>&1; then
        tail -n 20 "$CACHE/apt-$SUITE-python.log" >&2
        die "installing CPython in the $SUITE root failed (full log: $CACHE/apt-$SUITE-python.log)"
    fi
    echo "format=$ROOT_FORMAT" | as_root tee "$tmp/.rabbitry-python-root" >/dev/null
    as_root mv "$tmp" "$ROOT"
    say "root ready in $((SECONDS - started))s"
    flock -u 8
}

build() {
    if [[ "$SUITE" == trixie ]]; then
        bash "$HERE/rabbitmq4.sh" python >/dev/null
    else
        root_ok || build_own
    fi
    local py
    py="$(interpreter)" || die "no python3.X in $ROOT"
    run_in_root / "$py" --version
}

run_in_root() {
    local dir="${1:-}"
    shift || true
    [[ "$dir" == /* && -d "$dir" ]] || die "run needs an absolute directory, got '$dir'"
    (($# > 0)) || die "run needs a command after the directory"
    interpreter >/dev/null || die "$ROOT has no python3.X: run '$0 $SUITE build' first"
    local pass=(HOME="$dir/.cache/root-home" LANG=C.UTF-8) name
    for name in RABBITMQ_URL CI PYTEST_ADDOPTS PIP_INDEX_URL $(compgen -v RABBITRY_ || true); do
        [[ -n "${!name+x}" ]] && pass+=("$name=${!name}")
    done
    local ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}" ca_in=""
    if [[ -f "$ca" && -r "$ca" ]]; then
        ca_in=/run/rabbitry-host-ca.crt
        [[ -f "$ROOT$ca_in" ]] || as_root touch "$ROOT$ca_in"
        pass+=(PIP_CERT="$ca_in" SSL_CERT_FILE="$ca_in")
    fi
    if [[ "$dir" != / ]]; then
        mkdir -p "$dir/.cache/root-home"
        as_root mkdir -p "$ROOT$dir"
    fi
    # A private mount namespace: /proc, /dev and DIR are mounted for this command only and
    # disappear with its last process.
    as_root unshare --mount --propagation private -- /bin/sh -c '
        root="$1" dir="$2" ca="$3" ca_in="$4"; shift 4
        mount -t proc proc "$root/proc" && mount --rbind /dev "$root/dev" || exit 97
        if [ "$dir" != / ]; then mount --bind "$dir" "$root$dir" || exit 97; fi
        if [ -n "$ca_in" ]; then mount --bind -o ro "$ca" "$root$ca_in" || exit 97; fi
        exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
            /bin/sh -c "cd \"\$0\" && exec /usr/bin/env \"\$@\"" "$dir" "$@"
    ' _ "$ROOT" "$dir" "$ca" "$ca_in" "${pass[@]}" "$@"
}

case "${2:-}" in
    build) build ;;
    python) interpreter || die "no python3.X in $ROOT" ;;
    run)
        shift 2
        run_in_root "$@"
        ;;
    clean)
        [[ "$SUITE" != trixie ]] || die "the trixie root is scripts/rabbitmq4.sh's: use its clean"
        as_root rm -rf "$ROOT" "$CACHE/.building-$SUITE-python"
        ;;
    *)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
