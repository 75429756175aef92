#!/usr/bin/env bash
# The oldest Dagster the project allows (pyproject.toml: dagster>=1.13,<1.15), checked: a
# fresh venv with that release pinned and the project's test extra, then the README's test
# command in it. Exits non-zero when the install or a test fails; prints the versions it got.
# (The newest allowed release is the other leg: scripts/fresh_clone_check.sh installs into a
# fresh venv with nothing pinned, so it resolves the newest.)
#
#   scripts/dagster_versions_check.sh [PYTEST_ARGS...]     e.g. -n 2
#
# Set AGENTENV_KEEP_VENV=1 to keep the venv for a look afterwards.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
lowest=(dagster==1.13.0 dagster-webserver==1.13.0 dagster-dg-cli==1.13.0)
work="$(mktemp -d "${TMPDIR:-/tmp}/agentenv-dagster-lowest.XXXXXX")"
cleanup() { [ "${AGENTENV_KEEP_VENV:-}" = 1 ] && echo "kept: $work" >&2 || rm -rf "$work"; }
trap cleanup EXIT

say() { echo "dagster_versions_check: $*" >&2; }

test_cmd="$(grep -m1 -E '^python -m pytest' "$repo/README.md")"
[ -n "$test_cmd" ] || { say "README.md: the test command is missing"; exit 1; }

python3 -m venv "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
unset AGENTENV_UPSTREAM_CORPUS PYTHONPATH DAGSTER_HOME
say "install: ${lowest[*]} -e .[test]"
start=$(date +%s)
python -m pip install --quiet --disable-pip-version-check "${lowest[@]}" -e "$repo[test]"
say "installed in $(( $(date +%s) - start )) s: $(python -m pip list --disable-pip-version-check 2>/dev/null \
  | awk '$1 ~ /^dagster(-webserver|-dg-cli)?$/ {printf "%s %s  ", $1, $2}')"
cd "$repo"
say "tests: $test_cmd $*"
start=$(date +%s)
eval "\"$repo/scripts/bounded.sh\" 900 $test_cmd" '"$@"'
say "the README's test command passed on the oldest allowed Dagster in $(( $(date +%s) - start )) s"
