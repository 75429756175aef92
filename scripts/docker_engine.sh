#!/usr/bin/env bash
# A private Docker engine for container sandboxes (Coder Eval `sandbox.driver: docker`).
#
#   docker_engine.sh start            install docker.io if missing, start dockerd, print DOCKER_HOST
#   docker_engine.sh stop             end that dockerd, its containerd and shims, drop docker0
#   docker_engine.sh image [--python] build agentenv-sandbox:busybox (and :python) locally
#
# These machines do not auto-start dockerd and reach no image registry, so the engine is
# started by hand under $AGENTENV_DOCKER_ROOT (default /tmp/agentenv-docker) with its own
# socket, exec root and pid file (never clashing with a system daemon), and images are built
# from local files. Every command is idempotent. Progress goes to stderr; `start` prints only
# the DOCKER_HOST value on stdout: export DOCKER_HOST="$(scripts/docker_engine.sh start)".
set -euo pipefail

ROOT="${AGENTENV_DOCKER_ROOT:-/tmp/agentenv-docker}"
SOCK="$ROOT/docker.sock"
HOST="unix://$SOCK"
PIDFILE="$ROOT/dockerd.pid"
LOG="$ROOT/dockerd.log"
START_TIMEOUT="${AGENTENV_DOCKER_START_TIMEOUT:-60}"
BUSYBOX_IMAGE="agentenv-sandbox:busybox"
PYTHON_IMAGE="agentenv-sandbox:python"
export PATH="$PATH:/usr/sbin:/sbin"

say() { echo "docker_engine: $*" >&2; }
die() { say "$*"; exit 1; }

dock() { docker -H "$HOST" "$@"; }

answers() { timeout 10 docker -H "$HOST" info >/dev/null 2>&1; }

daemon_pid() {
  # The pid in our pid file, only while that process is still a dockerd.
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null)" || return 1
  [[ -n "$pid" && "$(cat "/proc/$pid/comm" 2>/dev/null)" == dockerd ]] || return 1
  echo "$pid"
}

apt_install() {
  # One `apt-get update` per call, and only when something is missing.
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  say "installing ${missing[*]} with apt"
  apt-get update -qq >&2 || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || die "apt-get install ${missing[*]} failed"
}

start() {
  command -v dockerd >/dev/null && command -v docker >/dev/null && [[ -x /bin/busybox ]] \
    || apt_install docker.io busybox-static
  command -v dockerd >/dev/null || die "dockerd is not installed (apt package docker.io)"
  mkdir -p "$ROOT"
  local launched=""
  if ! daemon_pid >/dev/null; then
    rm -f "$PIDFILE" "$SOCK"
    say "starting dockerd (data root $ROOT/data, log $LOG)"
    setsid dockerd --data-root "$ROOT/data" --exec-root "$ROOT/exec" --pidfile "$PIDFILE" \
      -H "$HOST" >>"$LOG" 2>&1 </dev/null &
    launched=$!
  fi
  local deadline=$((SECONDS + START_TIMEOUT))
  until answers; do
    if ((SECONDS >= deadline)); then
      die "dockerd did not answer at $HOST within ${START_TIMEOUT}s; last log lines: $(tail -n 5 "$LOG" 2>/dev/null | tr '\n' ' ')"
    fi
    # The pid file appears only once dockerd is up; before that the launched one must live.
    if ! daemon_pid >/dev/null && ! { [[ -n "$launched" ]] && kill -0 "$launched" 2>/dev/null; }; then
      die "dockerd exited; last log lines: $(tail -n 5 "$LOG" 2>/dev/null | tr '\n' ' ')"
    fi
    sleep 0.5
  done
  echo "$HOST"
}

our_processes() {
  # containerd and its shims, found by our exec root in their command line (only ours).
  local p cmd
  for p in /proc/[0-9]*; do
    cmd="$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)" || continue
    [[ "$cmd" == *"$ROOT/exec/"* ]] && echo "${p#/proc/}"
  done
  return 0
}

end_pids() {
  # SIGTERM, up to 15 s for them to go, then SIGKILL.
  local pids=("$@") i p alive
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for i in $(seq 30); do
    alive=()
    for p in "${pids[@]}"; do [[ -e "/proc/$p" ]] && alive+=("$p"); done
    ((${#alive[@]})) || return 0
    sleep 0.5
  done
  say "still running after SIGTERM, sending SIGKILL: ${alive[*]}"
  kill -KILL "${alive[@]}" 2>/dev/null || true
}

stop() {
  local pid
  if pid="$(daemon_pid)"; then
    # Removing the containers first spares dockerd its 10 s stop timeout per container.
    local ids
    ids="$(timeout 20 docker -H "$HOST" ps -aq 2>/dev/null || true)"
    [[ -z "$ids" ]] || timeout 60 docker -H "$HOST" rm -f $ids >/dev/null 2>&1 || true
    say "stopping dockerd $pid"
    end_pids "$pid"
  fi
  mapfile -t leftovers < <(our_processes)
  end_pids "${leftovers[@]}"
  # A killed dockerd leaves its overlay and netns mounts behind; deepest first.
  if [[ -d "$ROOT" ]]; then
    awk -v root="$ROOT/" 'index($2, root) == 1 { print $2 }' /proc/mounts | sort -r \
      | while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
  fi
  rm -f "$PIDFILE" "$SOCK"
  local p others=0
  for p in /proc/[0-9]*; do [[ "$(cat "$p/comm" 2>/dev/null)" == dockerd ]] && others=1; done
  if ((others == 0)) && ip link show docker0 >/dev/null 2>&1; then
    ip link delete docker0 || say "could not remove the docker0 bridge"
  fi
  say "stopped"
}

build_busybox() {
  [[ -x /bin/busybox ]] || apt_install busybox-static
  local rootfs applet
  rootfs="$(mktemp -d)"
  mkdir -p "$rootfs"/{bin,dev,etc,proc,sys,tmp,root}
  chmod 1777 "$rootfs/tmp"
  cp /bin/busybox "$rootfs/bin/busybox"
  # Relative links: an absolute /bin/busybox would point at the host while the rootfs is built.
  for applet in $("$rootfs/bin/busybox" --list); do
    [[ "$applet" == busybox ]] || ln -sf busybox "$rootfs/bin/$applet"
  done
  echo 'root:x:0:0:root:/root:/bin/sh' >"$rootfs/etc/passwd"
  echo 'root:x:0:' >"$rootfs/etc/group"
  tar -C "$rootfs" -c . | dock import -c 'ENV PATH=/bin' -c 'CMD ["/bin/sh"]' - "$BUSYBOX_IMAGE" >/dev/null
  rm -rf "$rootfs"
}

build_python() {
  command -v debootstrap >/dev/null || apt_install debootstrap
  local rootfs
  rootfs="$(mktemp -d)"
  debootstrap --variant=minbase --include=python3 bookworm "$rootfs" >&2 || die "debootstrap failed"
  tar -C "$rootfs" -c . | dock import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'CMD ["/bin/sh"]' - "$PYTHON_IMAGE" >/dev/null
  rm -rf "$rootfs"
}

image() {
  answers || die "no Docker engine answers at $HOST: run scripts/docker_engine.sh start first"
  if dock image inspect "$BUSYBOX_IMAGE" >/dev/null 2>&1; then
    say "$BUSYBOX_IMAGE is present"
  else
    say "building $BUSYBOX_IMAGE"
    build_busybox
  fi
  if [[ "${1:-}" == --python ]]; then
    if dock image inspect "$PYTHON_IMAGE" >/dev/null 2>&1; then
      say "$PYTHON_IMAGE is present"
    else
      say "building $PYTHON_IMAGE with debootstrap (slow)"
      build_python
    fi
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  image) image "${2:-}" ;;
  *) die "usage: $0 start|stop|image [--python]" ;;
esac
