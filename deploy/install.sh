#!/usr/bin/env bash
# Install marketwake as a systemd service: user, venv, config, state dir, units.
#
#   sudo deploy/install.sh                 # from a checkout at /opt/marketwake
#   deploy/install.sh --root /tmp/r --user "$(id -un)" --group "$(id -gn)" \
#       --owner "$(id -un)" --no-useradd --no-venv --no-systemctl   # a dry layout
#
# Idempotent: an existing config.toml, env file or agents directory is kept.
# The config is owned by --owner (root) and readable by the service's group, so
# the daemon (User=marketwake) can read it: systemd's ConfigurationDirectory=
# does not chown. Secrets go in /etc/marketwake/env (0600, read by systemd
# itself, never by the service user) and are used as ${VAR} in config.toml.
set -euo pipefail

ROOT=""
PREFIX=/opt/marketwake
SVC_USER=marketwake
SVC_GROUP=marketwake
OWNER=root
USERADD=1
VENV=1
SYSTEMCTL=1
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    echo "options: --root DIR --prefix DIR --user NAME --group NAME --owner NAME"
    echo "         --no-useradd --no-venv --no-systemctl"
}

while [ $# -gt 0 ]; do
    case "$1" in
        --root) ROOT="$2"; shift 2 ;;
        --prefix) PREFIX="$2"; shift 2 ;;
        --user) SVC_USER="$2"; shift 2 ;;
        --group) SVC_GROUP="$2"; shift 2 ;;
        --owner) OWNER="$2"; shift 2 ;;
        --no-useradd) USERADD=0; shift ;;
        --no-venv) VENV=0; shift ;;
        --no-systemctl) SYSTEMCTL=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done

ETC="$ROOT/etc/marketwake"
STATE="$ROOT/var/lib/marketwake"
UNITS="$ROOT/etc/systemd/system"

if [ "$USERADD" = 1 ] && ! id -u "$SVC_USER" >/dev/null 2>&1; then
    useradd --system --home /var/lib/marketwake --shell /usr/sbin/nologin "$SVC_USER"
fi

if [ "$VENV" = 1 ]; then
    [ -x "$PREFIX/.venv/bin/python" ] || python3 -m venv "$PREFIX/.venv"
    "$PREFIX/.venv/bin/pip" install -q "$SRC"
fi

# Config: root-owned, group-readable by the service (0750 dir, 0640 file).
install -d -m 0750 -o "$OWNER" -g "$SVC_GROUP" "$ETC"
if [ ! -e "$ETC/config.toml" ]; then
    sed -e 's|^state_dir = "state"|state_dir = "/var/lib/marketwake"|' \
        -e 's|^agents_dir = "agents"|agents_dir = "/var/lib/marketwake/agents"|' \
        "$SRC/config.toml" > "$ETC/config.toml.new"
    install -m 0640 -o "$OWNER" -g "$SVC_GROUP" "$ETC/config.toml.new" "$ETC/config.toml"
    rm -f "$ETC/config.toml.new"
fi
[ -e "$ETC/env" ] || install -m 0600 -o "$OWNER" -g "$(id -gn "$OWNER")" /dev/null "$ETC/env"

# State: the service's own (StateDirectory= would create it too; agents need it now).
install -d -m 0750 -o "$SVC_USER" -g "$SVC_GROUP" "$STATE"
if [ ! -e "$STATE/agents" ]; then
    cp -r "$SRC/agents" "$STATE/agents"
    chown -R "$SVC_USER:$SVC_GROUP" "$STATE/agents"
fi

# Units, pointed at the prefix.
install -d -m 0755 "$UNITS"
for unit in marketwake.service marketwake-rag.service; do
    sed -e "s|/opt/marketwake|$PREFIX|g" \
        -e "s|^User=marketwake|User=$SVC_USER|" -e "s|^Group=marketwake|Group=$SVC_GROUP|" \
        "$SRC/deploy/$unit" > "$UNITS/$unit.new"
    install -m 0644 "$UNITS/$unit.new" "$UNITS/$unit"
    rm -f "$UNITS/$unit.new"
done

if command -v systemd-analyze >/dev/null 2>&1 && [ -z "$ROOT" ]; then
    systemd-analyze verify "$UNITS/marketwake.service" "$UNITS/marketwake-rag.service" || true
fi
if [ "$SYSTEMCTL" = 1 ]; then
    systemctl daemon-reload
    echo "installed. start it:  systemctl enable --now marketwake"
else
    echo "installed under ${ROOT:-/} (systemctl not called)"
fi
