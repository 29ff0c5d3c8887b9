#!/usr/bin/env bash
# soak nightly: one soak against the real box, then retention and the `latest` link.
#
# Settings come from the environment (systemd: EnvironmentFile=/etc/soak/nightly.env):
#   SOAK_CONFIG    run config (required), e.g. /etc/soak/pp8-nightly.yaml
#   SOAK_RUNS_DIR  folder holding one directory per run (default /var/lib/soak/runs)
#   SOAK_KEEP      newest runs to keep; the newest failing run is kept as well (default 14)
#   SOAK_DURATION  optional --duration override, e.g. 66m
#   SOAK_BIN       the soak executable (default: soak on PATH)
#   SOAK_PYTHON    the Python that has soak installed (default: the one beside SOAK_BIN)
# Exit status is soak run's (0 pass, 1 incident, 2 bad config, 3 target never ready,
# 130 interrupted), so the unit/cron job shows a failed night as failed.
set -uo pipefail

: "${SOAK_CONFIG:?set SOAK_CONFIG to the run config}"
RUNS_DIR=${SOAK_RUNS_DIR:-/var/lib/soak/runs}
KEEP=${SOAK_KEEP:-14}
SOAK=${SOAK_BIN:-soak}
if ! SOAK_PATH=$(command -v "$SOAK"); then
    echo "nightly: $SOAK not found" >&2
    exit 3
fi
PYTHON=${SOAK_PYTHON:-$(dirname "$SOAK_PATH")/python}

mkdir -p "$RUNS_DIR"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
run_dir="$RUNS_DIR/$stamp"
n=1
while [ -e "$run_dir" ]; do  # a second run within the same second
    n=$((n + 1))
    run_dir="$RUNS_DIR/$stamp-$n"
done
args=(run "$SOAK_CONFIG" --out "$run_dir")
if [ -n "${SOAK_DURATION:-}" ]; then
    args+=(--duration "$SOAK_DURATION")
fi

"$SOAK" "${args[@]}"
rc=$?

# soak run renders report.html and junit.xml itself; if it died first, render what it recorded.
if [ -d "$run_dir" ] && [ ! -f "$run_dir/report.html" ]; then
    "$SOAK" report "$run_dir" || echo "nightly: soak report $run_dir failed" >&2
fi

# Retention only ever deletes run directories directly inside RUNS_DIR, never the
# newest failing run, and points RUNS_DIR/latest at the newest run.
"$PYTHON" -m soak.report.retention "$RUNS_DIR" --keep "$KEEP" || echo "nightly: retention failed" >&2

exit $rc
