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
#   SOAK_HISTORY_DIR  where every night's summary, events, config and requests are kept
#                  beyond retention, and history.html/csv/json are written
#                  (default: history beside RUNS_DIR, /var/lib/soak/history; empty: none)
#   SOAK_PUSHGATEWAY  optional Pushgateway URL for `soak history`'s per-build figures
#                  (the night itself is pushed by soak run, from the config's pushgateway:)
#   SOAK_BOX       the box label of that push (default: the host name)
#   SOAK_BASELINE  the build soak history judges the others against (--baseline), e.g. the
#                  config's build: label of the unfixed build; unset: history names no baseline
#                  (it never guesses one, so a new night cannot change it)
#   SOAK_BASELINE_MTBF  optional --baseline-mtbf for soak history, e.g. 15m
#   SOAK_PROVE     optional: soak history's sequential test over the nights, its flags as one
#                  string, e.g. "--prove nightly-1206 --broken-build nightly-1203 --ratio 10"
#                  (docs/prove.md: is this build fixed, and when will we know)
#   SOAK_RUN_PREFIX  optional prefix of the run directory's name (the fleet nightly: the box,
#                  so that several boxes' nights share one runs folder and one history)
#   SOAK_HISTORY_RENDER  1 (default): run `soak history` after keeping the night's files;
#                  0: keep them only (the fleet nightly pools every box's night once, after all)
# Exit status is soak run's (0 pass, 1 incident, 2 bad config, 3 target never ready,
# 5 the sequential test undecided (prove:),
# 99 threshold breached, 130 interrupted), so the unit/cron job shows a failed night as failed.
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
stamp="${SOAK_RUN_PREFIX:-}$stamp"
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
# newest failing run, and points RUNS_DIR/latest at the newest run. Before history,
# so that history.html links only reports that still exist.
"$PYTHON" -m soak.report.retention "$RUNS_DIR" --keep "$KEEP" || echo "nightly: retention failed" >&2

# The nights' memory: the small files of every run (no samples, no evidence bundles)
# are kept beyond retention, and soak history reads them all.
HISTORY_DIR=${SOAK_HISTORY_DIR-$(dirname "$RUNS_DIR")/history}
if [ -n "$HISTORY_DIR" ] && [ -d "$run_dir" ]; then
    keep="$HISTORY_DIR/runs/$(basename "$run_dir")"
    mkdir -p "$keep"
    for f in summary.json events.jsonl config.yaml requests.jsonl plan.json; do
        [ -f "$run_dir/$f" ] && cp "$run_dir/$f" "$keep/"
    done
    if [ "${SOAK_HISTORY_RENDER:-1}" = 0 ]; then
        exit $rc
    fi
    hargs=(history "$HISTORY_DIR/runs" --out "$HISTORY_DIR" --reports "$RUNS_DIR")
    if [ -n "${SOAK_BASELINE:-}" ]; then
        hargs+=(--baseline "$SOAK_BASELINE")
    fi
    if [ -n "${SOAK_BASELINE_MTBF:-}" ]; then
        hargs+=(--baseline-mtbf "$SOAK_BASELINE_MTBF")
    fi
    if [ -n "${SOAK_PROVE:-}" ]; then
        # shellcheck disable=SC2206  # a list of flags, split on purpose
        hargs+=(${SOAK_PROVE})
    fi
    if [ -n "${SOAK_PUSHGATEWAY:-}" ]; then
        hargs+=(--pushgateway "$SOAK_PUSHGATEWAY" --label "box=${SOAK_BOX:-$(hostname -s)}")
    fi
    "$SOAK" "${hargs[@]}" || echo "nightly: soak history failed" >&2
fi

exit $rc
