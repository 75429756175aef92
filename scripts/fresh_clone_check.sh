#!/usr/bin/env bash
# What a newcomer does, checked: clone the committed HEAD alone into a temporary folder (no
# ../shared beside it), make a fresh venv, run the README's install command and its test
# command. Exits non-zero when either fails; prints the test command's wall time.
# It is also the "newest" leg of the Dagster versions CI tests: nothing is pinned, so the fresh
# venv resolves the newest Dagster pyproject.toml allows (it prints which);
# scripts/dagster_versions_check.sh is the oldest leg.
#
#   scripts/fresh_clone_check.sh [REF]      (default: HEAD of this checkout)
#
# Set AGENTENV_KEEP_CLONE=1 to keep the folder for a look afterwards.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
ref="${1:-HEAD}"
work="$(mktemp -d "${TMPDIR:-/tmp}/agentenv-fresh-clone.XXXXXX")"
cleanup() { [ "${AGENTENV_KEEP_CLONE:-}" = 1 ] && echo "kept: $work" >&2 || rm -rf "$work"; }
trap cleanup EXIT

say() { echo "fresh_clone_check: $*" >&2; }

git clone --quiet --no-hardlinks "$repo" "$work/project"
git -C "$work/project" checkout --quiet --detach "$(git -C "$repo" rev-parse "$ref")"
[ ! -e "$work/shared" ] || { say "$work/shared exists: the clone must stand alone"; exit 1; }

cd "$work/project"
# The README's two commands, extracted from it, so this checks what the README says.
install_cmd="$(grep -m1 -E "^pip install -e '\.\[test\]'" README.md | sed 's/ && agentenv-dagster run.*//')"
test_cmd="$(grep -m1 -E '^python -m pytest' README.md)"
[ -n "$install_cmd" ] && [ -n "$test_cmd" ] || { say "README.md: the install or the test command is missing"; exit 1; }

python3 -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
# Nothing of this machine's own environment leaks in: only what the README installs.
unset AGENTENV_UPSTREAM_CORPUS PYTHONPATH DAGSTER_HOME
say "install: $install_cmd"
start=$(date +%s)
eval "$install_cmd"
say "installed in $(( $(date +%s) - start )) s, dagster $(python -c 'import dagster; print(dagster.__version__)')"
say "the example: agentenv-dagster run tasks/reply_to_dana.json"
agentenv-dagster run tasks/reply_to_dana.json >"$work/example.log" 2>&1 || { cat "$work/example.log" >&2; exit 1; }
say "tests: $test_cmd"
start=$(date +%s)
eval "scripts/bounded.sh 900 $test_cmd"  # a hang shows its stacks and ends (scripts/bounded.sh)
say "the README's test command passed in $(( $(date +%s) - start )) s"
