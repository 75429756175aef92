#!/usr/bin/env bash
# Run a command with a time limit; past it, show where it stands, then end it. For CI's test
# commands: a hang there (a pytest-xdist worker cut off from its controller waits forever) would
# otherwise use up the whole CI budget and leave nothing to read.
#
#   scripts/bounded.sh SECONDS COMMAND [ARGS...]
#
# Exits with the command's status, or 124 past the limit, after printing every process the
# command started, all threads' stacks of each pytest process (tests/conftest.py has
# faulthandler write them to $AGENTENV_STACKS_DIR/<pid>.txt on SIGUSR1) and, last, each pytest
# process's state with its first descriptors and their flags.
set -uo pipefail

limit="$1"
shift
stacks="$(mktemp -d "${TMPDIR:-/tmp}/agentenv-stacks.XXXXXX")"
trap 'rm -rf "$stacks"' EXIT
export AGENTENV_STACKS_DIR="$stacks"

descendants() {
  # Every process below $1, parents first.
  local children
  children="$(ps -e -o pid= -o ppid= | awk -v parent="$1" '$2 == parent { print $1 }')"
  for child in $children; do
    echo "$child"
    descendants "$child"
  done
}

"$@" &
command_pid=$!
deadline=$((SECONDS + limit))
while kill -0 "$command_pid" 2>/dev/null && ((SECONDS < deadline)); do
  sleep 2
done
if ! kill -0 "$command_pid" 2>/dev/null; then
  wait "$command_pid"
  exit $?
fi

echo "bounded: '$*' still running after ${limit} s; where it stands:" >&2
mapfile -t tree < <(echo "$command_pid"; descendants "$command_pid")
for pid in "${tree[@]}"; do
  [ -e "$stacks/$pid.txt" ] && kill -USR1 "$pid" 2>/dev/null
done
sleep 3
# the other processes in a line each, then the pytest processes' stacks, then (last, as CI
# shows the end of the output) each pytest process with its descriptors
for pid in "${tree[@]}"; do
  [ -d "/proc/$pid" ] && [ ! -e "$stacks/$pid.txt" ] && ps -o pid=,ppid=,stat=,etime=,args= -p "$pid" | cut -c1-200 >&2
done
for pid in "${tree[@]}"; do
  [ -s "$stacks/$pid.txt" ] && { echo "--- stacks of $pid" && head -n 120 "$stacks/$pid.txt"; } >&2
done
for pid in "${tree[@]}"; do
  [ -d "/proc/$pid" ] && [ -e "$stacks/$pid.txt" ] || continue
  echo "--- $(ps -o pid=,ppid=,stat=,wchan:24=,etime=,args= -p "$pid" | cut -c1-160)" >&2
  for fd in 0 1 2 3 4; do
    [ -e "/proc/$pid/fd/$fd" ] || continue
    echo "    fd $fd -> $(readlink "/proc/$pid/fd/$fd") $(grep -m1 flags "/proc/$pid/fdinfo/$fd" 2>/dev/null)" >&2
  done
done
echo "bounded: ending it (exit 124)" >&2
kill -TERM "${tree[@]}" 2>/dev/null
sleep 5
kill -KILL "${tree[@]}" 2>/dev/null
wait "$command_pid" 2>/dev/null
exit 124
