#!/usr/bin/env bash
# soak fleet nightly: one soak per box, each against its own server, as one Slurm
# job array, then one job that pools every box's night with `soak history` and
# pushes each box's figures to the Pushgateway with a `box` label.
#
#   SOAK_FLEET_DIR=/shared/soak SOAK_CONFIG=/shared/soak/pp8-nightly.yaml SOAK_FLEET_BOXES=4 deploy/fleet.sh
#
# Settings (environment; the rest are deploy/nightly.sh's, passed through to every box):
#   SOAK_FLEET_DIR    a folder every node can read and write (a shared filesystem):
#                     runs/ (every box's nights, named <box>-<UTC time>), history/ (pooled)
#   SOAK_FLEET_BOXES  how many boxes (array tasks), default 2
#   SOAK_FLEET_SBATCH extra sbatch options for each box's job, e.g.
#                     "--partition=gpu --gres=gpu:8 --time=120" (default: --exclusive, whole nodes)
#   SOAK_FLEET_SHARE_NODES  1: several boxes' soaks may share a node (a node split in
#                     halves, or a test cluster): each task's box label is then
#                     <node>.<task> instead of the node's name, and --exclusive is left out
#   SOAK_PUSHGATEWAY  optional: each box's pooled nights are pushed with box=<box>
# Prints the two job ids; the nightly's state is Slurm's (squeue, sacct) and the
# pooled history lands in $SOAK_FLEET_DIR/history/history.html.
set -euo pipefail
: "${SOAK_FLEET_DIR:?set SOAK_FLEET_DIR to a folder every node can read}"
: "${SOAK_CONFIG:?set SOAK_CONFIG to the run config}"
here=$(cd "$(dirname "$0")" && pwd)
export SOAK_FLEET_DEPLOY="$here"  # sbatch runs a copy of each script: where nightly.sh is
boxes=${SOAK_FLEET_BOXES:-2}
mkdir -p "$SOAK_FLEET_DIR/runs" "$SOAK_FLEET_DIR/history/runs" "$SOAK_FLEET_DIR/slurm"
if [ "${SOAK_FLEET_SHARE_NODES:-0}" = 1 ]; then placement=(--cpus-per-task=1); else placement=(--exclusive --nodes=1); fi
# shellcheck disable=SC2206  # SOAK_FLEET_SBATCH is a list of options, split on purpose
extra=(${SOAK_FLEET_SBATCH:-})
array=$(sbatch --parsable --job-name=soak-fleet --comment="soak fleet nightly $(date -u +%F)" \
    --array="0-$((boxes - 1))" "${placement[@]}" "${extra[@]}" \
    --output="$SOAK_FLEET_DIR/slurm/box-%A_%a.out" --export=ALL "$here/fleet-box.sbatch")
array=${array%%;*}
pooled=$(sbatch --parsable --job-name=soak-fleet-history --dependency="afterany:$array" --cpus-per-task=1 \
    --output="$SOAK_FLEET_DIR/slurm/history-%j.out" --export=ALL "$here/fleet-history.sbatch")
echo "soak fleet: boxes job $array (array of $boxes), history job ${pooled%%;*}"
