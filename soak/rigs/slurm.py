"""A real single-node Slurm cluster on loopback, for tests and the bisect bench.

Debian's ``slurm-wlm`` and ``munge`` (``scripts/test`` installs them): munged,
slurmctld and slurmd run in the foreground as children of this process, each on
its own socket or port and every file under one directory, so a test's cluster
shares nothing with the machine's (no /etc/slurm, no /run/munge) and stopping it
signals only the three daemons it started. The scheduler is real: pending,
running, cancelled, time limit are Slurm's own.

The configuration is the one docs/running.md's "cluster" section shows: process
tracking by the Linux process table and no task plugin (no cgroups needed in a
container), consumable cores so two one-core jobs run at once on ``cpus=2``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SLURM_COMMANDS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")


class ClusterError(RuntimeError):
    """The cluster did not come up; the message names the daemon and its log."""


def missing_commands() -> list[str]:
    """The Slurm/munge commands this machine lacks (PATH plus the sbin dirs)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [name for name in SLURM_COMMANDS if shutil.which(name, path=path) is None]


def slurm_conf(*, root: Path, host: str, ctld_port: int, node_port: int, cpus: int) -> str:
    """The cluster's slurm.conf, every path under ``root``."""
    return "\n".join(
        [
            "ClusterName=soaktest",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={node_port}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={root}/munge.sock",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={root}/state",
            f"SlurmdSpoolDir={root}/spool",
            f"SlurmctldPidFile={root}/slurmctld.pid",
            f"SlurmdPidFile={root}/slurmd.pid",
            f"SlurmctldLogFile={root}/log/slurmctld.log",
            f"SlurmdLogFile={root}/log/slurmd.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            # Finished jobs stay visible to scontrol for 10 minutes: the executor
            # reads a job's end state (COMPLETED, CANCELLED, TIMEOUT) from there,
            # there is no accounting database.
            "MinJobAge=600",
            "KillWait=5",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            "PartitionName=soak Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


@dataclass
class SlurmCluster:
    """A started cluster. ``env`` is what a client command needs (SLURM_CONF)."""

    root: Path
    host: str
    _daemons: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def stop(self) -> None:
        """Cancel every job, then stop the daemons; idempotent."""
        if not self._daemons:
            return
        try:
            self.run("scancel", "--user=root", "--full", timeout=10)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                queued = self.run("squeue", "-h", timeout=10).stdout.strip()
                if not queued:
                    break
                time.sleep(0.3)
        except (OSError, subprocess.TimeoutExpired):
            pass  # a wedged controller: the daemons are stopped below all the same
        for daemon in reversed(self._daemons):
            if daemon.poll() is None:
                daemon.terminate()
        for daemon in reversed(self._daemons):
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=10)
        self._daemons.clear()

    def __enter__(self) -> "SlurmCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_cluster(root: Path, *, ctld_port: int, node_port: int, cpus: int = 2, ready_s: float = 30.0) -> SlurmCluster:
    """Start munged, slurmctld and slurmd under ``root`` and wait until the node
    is idle. ``root`` must be empty or absent (a cluster's state is its own)."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir(exist_ok=True)
    host = socket.gethostname().split(".")[0]
    (root / "slurm.conf").write_text(slurm_conf(root=root, host=host, ctld_port=ctld_port, node_port=node_port, cpus=cpus))
    key = root / "munge.key"
    subprocess.run(["mungekey", "-c", "-k", str(key), "-b", "1024"], check=True, capture_output=True, timeout=30)
    key.chmod(0o600)
    cluster = SlurmCluster(root=root, host=host)
    env = cluster.env
    logs = root / "log"
    try:
        cluster._daemons.append(
            subprocess.Popen(
                ["munged", "-F", "--force", f"--socket={root}/munge.sock", f"--key-file={key}",
                 f"--pid-file={root}/munged.pid", f"--log-file={logs}/munged.log", f"--seed-file={root}/munge.seed"],
                stdout=subprocess.DEVNULL, stderr=open(logs / "munged.stderr", "wb"), env=env,
            )
        )
        _wait_for(lambda: (root / "munge.sock").exists(), ready_s, f"munged (see {logs}/munged.log)")
        cluster._daemons.append(
            subprocess.Popen(["slurmctld", "-D", "-c"], stdout=subprocess.DEVNULL,
                             stderr=open(logs / "slurmctld.stderr", "wb"), env=env)
        )
        cluster._daemons.append(
            subprocess.Popen(["slurmd", "-D", "-N", host], stdout=subprocess.DEVNULL,
                             stderr=open(logs / "slurmd.stderr", "wb"), env=env)
        )

        def idle() -> bool:
            for daemon in cluster._daemons:
                if daemon.poll() is not None:
                    raise ClusterError(f"{daemon.args[0]} exited with {daemon.returncode} (see {logs})")
            out = cluster.run("sinfo", "-h", "-o", "%T", timeout=10)
            return out.returncode == 0 and out.stdout.strip() == "idle"

        _wait_for(idle, ready_s, f"the Slurm node never became idle (see {logs})")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_for(ready, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    raise ClusterError(f"{what}: not ready in {within_s:.0f} s")
