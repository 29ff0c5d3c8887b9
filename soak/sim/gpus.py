"""Simulated GPUs, one per pipeline stage, derived from what the pipeline is doing.

Every stage is busy in a prefill step, decode leaves pipeline bubbles
(``decode_util_pct``), idle reads 0%. In ``pp_deadlock`` stages 0..pp-2 read
100% (NCCL kernels spinning in a broadcast) and the last stage 0%. Memory is
held while a process holds the GPU, as vLLM preallocates its KV cache.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Sequence

from soak.metric_names import DCGM_FIELDS
from soak.sim.config import SimConfig


class Activity(str, Enum):
    IDLE = "idle"
    PREFILL = "prefill"
    DECODE = "decode"
    PAUSE = "pause"  # compile / a long healthy kernel: every stage busy
    PP_DEADLOCK = "pp_deadlock"
    ALL_IDLE_DEADLOCK = "all_idle_deadlock"
    DEAD = "dead"


@dataclass(frozen=True)
class SimGpu:
    index: int
    uuid: str
    util_pct: float
    mem_used_mib: float
    mem_total_mib: float
    power_w: float
    sm_clock_mhz: float
    pids: tuple[int, ...]

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "util_pct": self.util_pct,
            "mem_used_mib": self.mem_used_mib,
            "mem_total_mib": self.mem_total_mib,
            "power_w": self.power_w,
            "sm_clock_mhz": self.sm_clock_mhz,
            "pids": list(self.pids),
        }


def gpu_uuid(seed: int, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"soak-sim/{seed}/{index}"))


def stage_util(activity: Activity, stage: int, pp_size: int, decode_util_pct: float) -> float:
    if activity in (Activity.PREFILL, Activity.PAUSE):
        return 100.0
    if activity is Activity.DECODE:
        return decode_util_pct
    if activity is Activity.PP_DEADLOCK:
        return 0.0 if stage == pp_size - 1 else 100.0
    return 0.0


def gpu_readings(
    config: SimConfig, activity: Activity, worker_pids: Sequence[int | None], held: Sequence[bool]
) -> list[SimGpu]:
    out = []
    for i in range(config.pp_size):
        util = stage_util(activity, i, config.pp_size, config.decode_util_pct)
        holding = held[i] if i < len(held) else False
        pid = worker_pids[i] if i < len(worker_pids) else None
        power = config.gpu_power_idle_w + (config.gpu_power_busy_w - config.gpu_power_idle_w) * util / 100.0
        out.append(
            SimGpu(
                index=i,
                uuid=gpu_uuid(config.seed, i),
                util_pct=util,
                mem_used_mib=float(config.gpu_mem_used_mib if holding else 0),
                mem_total_mib=float(config.gpu_mem_total_mib),
                power_w=round(power if holding else config.gpu_power_idle_w * 0.5, 1),
                sm_clock_mhz=1695.0 if util > 0 else 210.0,
                pids=(pid,) if holding and pid is not None else (),
            )
        )
    return out


def dcgm_text(gpus: Sequence[SimGpu], *, hostname: str, model_name: str = "NVIDIA GeForce RTX 3090",
              energy_mj: Sequence[float] | None = None) -> str:
    """dcgm-exporter's exposition: one gauge family per field, labels gpu, UUID, device, modelName, Hostname
    (3.3.x; ``hostname`` after 4.5.x). ``energy_mj``: DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION per GPU."""
    energy = list(energy_mj) if energy_mj is not None else None
    values = {
        "util": lambda g: g.util_pct,
        "mem_used_mib": lambda g: g.mem_used_mib,
        "mem_free_mib": lambda g: g.mem_total_mib - g.mem_used_mib,
        "power_w": lambda g: g.power_w,
        "sm_clock_mhz": lambda g: g.sm_clock_mhz,
        "xid_errors": lambda g: 0,
    }
    if energy is not None:
        values["energy_mj"] = lambda g: float(round(energy[g.index])) if g.index < len(energy) else 0.0
    lines: list[str] = []
    for key, get in values.items():
        f = DCGM_FIELDS[key]
        lines.append(f"# HELP {f.exposed} {f.help}")
        lines.append(f"# TYPE {f.exposed} gauge")
        for g in gpus:
            labels = (
                f'gpu="{g.index}",UUID="{g.uuid}",device="nvidia{g.index}",'
                f'modelName="{model_name}",Hostname="{hostname}"'
            )
            value = get(g)
            text = f"{value:g}" if isinstance(value, float) else str(value)
            lines.append(f"{f.exposed}{{{labels}}} {text}")
    return "\n".join(lines) + "\n"
