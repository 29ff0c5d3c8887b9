"""Name the faulty rank from py-spy stacks when no flight recorder can tell (pure core).

The CPU build's process groups are gloo, and torch 2.13's gloo records no
send/recv in the flight recorder and opens no dump pipe (FACTS.md), so a
pipeline that hangs because one stage never posted its send leaves no dump.
What is left is where each worker's main thread stands, as ``py-spy dump``
printed it, and each process's state from /proc at the same moment.

``parse_py_spy(text) -> Stack``; ``place_of(worker) -> Place``: blocked in a
torch.distributed call (which call, the vLLM line that made it), idle waiting
for the next RPC (``MessageQueue.dequeue``), waiting in a native call at a vLLM
line, running Python (spinning), or stopped (state T);
``diagnose_stacks(workers) -> StackDiagnosis``: the rank that is behind.

A rank blocked in a receive from its previous stage, whose previous stage is
not sending, is waiting for a send that stage never posted: the previous stage
is the faulty rank. A rank running while the others wait on it is the faulty
rank, and so is a stopped one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Iterable, Sequence

from soak.metric_names import ProcessRole, parse_process_title
from soak.plain import plain
from soak.printable import printable

# A frame, title or thread name longer than this is cut (a path is rarely over 200).
MAX_FIELD = 300
_PROCESS = re.compile(r"^Process (\d+): (.*)$")
# The closing quote is optional: py-spy prints a thread's name raw, and a name with a
# line break in it ends the header line early.
_THREAD = re.compile(r"^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?:: \"(.*?)\"?)?\s*$")
_FRAME = re.compile(r"^\s+(\S.*?) \((.+?)(?::(\d+))?\)\s*$")

# torch.distributed calls a worker blocks in, by the function py-spy names.
P2P_RECV = frozenset({"recv", "irecv", "recv_object_list"})
P2P_SEND = frozenset({"send", "isend", "send_object_list"})
P2P = P2P_RECV | P2P_SEND | {"batch_isend_irecv"}
_WRAPPERS = frozenset({"wrapper", "_exception_logger.<locals>.wrapper", "_time_logger.<locals>.wrapper"})
# GroupCoordinator methods that only the pipeline group calls in vLLM's workers.
_PIPELINE_METHODS = frozenset({"isend_tensor_dict", "irecv_tensor_dict", "send_tensor_dict", "recv_tensor_dict"})
_IDLE_RPC = ("MessageQueue.dequeue", "MessageQueue.acquire_read")


class Activity(str, Enum):
    BLOCKED = "blocked"      # inside a torch.distributed call: recv, send, a collective
    IDLE_RPC = "idle_rpc"    # MessageQueue.dequeue: waiting for the engine's next RPC
    WAITING = "waiting"      # idle in native code under a vLLM frame (a handle's wait, a lock)
    SPINNING = "spinning"    # running Python, not in a collective
    STOPPED = "stopped"      # state T: SIGSTOPped or traced
    UNKNOWN = "unknown"      # no stack, or none of the above


class Reason(str, Enum):
    STOPPED = "stopped"
    SPINNING = "spinning"
    MISSING_SEND = "missing_send"        # the receiver waits; the sender never posted
    MISSING_RECV = "missing_recv"        # the sender waits; the receiver never posted
    MISSING_COLLECTIVE = "missing_collective"
    NONE = "none"


@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int | None

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.func}" if self.line is not None else f"{self.file} {self.func}"


@dataclass(frozen=True)
class Thread:
    tid: str
    status: str  # py-spy's: "idle", "active", "active+gil", ...
    name: str
    frames: tuple[Frame, ...]  # innermost first, as py-spy prints them

    @property
    def active(self) -> bool:
        return "active" in self.status


@dataclass(frozen=True)
class Stack:
    pid: int | None
    title: str
    threads: tuple[Thread, ...]

    @property
    def main(self) -> Thread | None:
        """The thread that runs the worker's RPCs: MainThread, else the first."""
        return next((t for t in self.threads if t.name == "MainThread"), self.threads[0] if self.threads else None)


def parse_py_spy(text: str) -> Stack:
    """``py-spy dump`` output -> Stack; lines it does not know are skipped."""
    pid, title = None, ""
    threads: list[Thread] = []
    current: list[Frame] | None = None
    head: tuple[str, str, str] | None = None

    def close() -> None:
        if head is not None and current is not None:
            threads.append(Thread(head[0], head[1], head[2], tuple(current)))

    # Every field is the traced process's text (its title, its code's names and paths):
    # made printable here, so no escape or line break reaches a summary line or terminal.
    for raw in text.split("\n"):  # py-spy ends lines with \n; a \r or \x85 in a name is not a line end
        m = _PROCESS.match(raw)
        if m and pid is None:
            pid, title = int(m.group(1)), printable(m.group(2).strip(), limit=MAX_FIELD)
            continue
        m = _THREAD.match(raw)
        if m:
            close()
            head = (m.group(1), printable(m.group(2), limit=MAX_FIELD), printable(m.group(3) or "", limit=MAX_FIELD))
            current = []
            continue
        m = _FRAME.match(raw)
        if m and current is not None:
            current.append(Frame(printable(m.group(1), limit=MAX_FIELD), printable(m.group(2), limit=MAX_FIELD),
                                 int(m.group(3)) if m.group(3) else None))
    close()
    return Stack(pid=pid, title=title, threads=tuple(threads))


@dataclass(frozen=True)
class Worker:
    """One vLLM worker at the incident: its title, /proc state and stack."""

    pid: int
    title: str
    state: str | None = None  # /proc/<pid>/stat's state letter
    stack: Stack | None = None
    cpu: float | None = None  # cores busy just before py-spy attached, when measured


@dataclass(frozen=True)
class Place:
    """Where one worker stands."""

    pid: int
    rank: int | None  # global rank: stage * tp_size + tp rank
    stage: int | None
    tp_rank: int | None
    activity: Activity
    call: str | None = None        # the torch.distributed function: "recv", "broadcast", ...
    group: str | None = None       # "pp" where the vLLM method only serves the pipeline group
    vllm_frame: str | None = None  # innermost vLLM frame: "vllm/distributed/parallel_state.py:935 GroupCoordinator.recv_object"
    vllm_calls: tuple[str, ...] = ()  # GroupCoordinator methods on the way, outermost last
    entry: str | None = None       # innermost vLLM frame outside parallel_state: who asked
    top: str | None = None         # the innermost frame of all
    state: str | None = None
    cpu: float | None = None

    @property
    def who(self) -> str:
        bits = [f"stage {self.stage}" if self.stage is not None else None, f"PID {self.pid}"]
        return f"rank {self.rank if self.rank is not None else '?'} ({', '.join(b for b in bits if b)})"

    def describe(self) -> str:
        if self.activity is Activity.BLOCKED:
            where = f" at {self.vllm_frame}" if self.vllm_frame else ""
            outer = [m for m in self.vllm_calls if not (self.vllm_frame or "").endswith("." + m)]
            via = ", ".join([*outer, *([f"from {self.entry}"] if self.entry else [])])
            return f"blocked in gloo {self.call}{where}{f' ({via})' if via else ''}"
        if self.activity is Activity.IDLE_RPC:
            return f"idle in MessageQueue.dequeue (waits for the next RPC){_at(self.vllm_frame)}"
        if self.activity is Activity.WAITING:
            return f"waiting in native code{_at(self.vllm_frame)}"
        if self.activity is Activity.SPINNING:
            cpu = f", {self.cpu:.1f} cores" if self.cpu is not None else ""
            under = f" under {self.entry}" if self.entry and self.entry != self.top else ""
            return f"running{cpu} at {self.top}{under}"
        if self.activity is Activity.STOPPED:
            return f"stopped (state T){_at(self.vllm_frame)}"
        return "no stack" if self.top is None else f"at {self.top}"


def _at(frame: str | None) -> str:
    return f" at {frame}" if frame else ""


def _is_vllm(f: Frame) -> bool:
    return f.file.startswith("vllm/") or "/vllm/" in f.file


def _is_torch_distributed(f: Frame) -> bool:
    return f.file.startswith("torch/distributed/") or "/torch/distributed/" in f.file


def _method(func: str) -> str:
    return func.rsplit(".", 1)[-1]


def place_of(worker: Worker, *, tp_size: int = 1) -> Place:
    """Classify one worker's main thread (see the module's docstring)."""
    title = parse_process_title(worker.title) if worker.title else None
    stage = title.pipeline_stage if title is not None and title.role is ProcessRole.WORKER else None
    tp_rank = (title.group("TP") or 0) if stage is not None and title is not None else None
    rank = stage * tp_size + (tp_rank or 0) if stage is not None else None
    base = Place(pid=worker.pid, rank=rank, stage=stage, tp_rank=tp_rank, activity=Activity.UNKNOWN,
                 state=worker.state, cpu=worker.cpu)
    thread = worker.stack.main if worker.stack is not None else None
    frames = thread.frames if thread is not None else ()
    vllm = [f for f in frames if _is_vllm(f)]
    top = str(frames[0]) if frames else None
    vllm_frame = str(vllm[0]) if vllm else None
    entry = next((str(f) for f in vllm if not f.file.endswith("parallel_state.py")), None)
    coordinator = tuple(_method(f.func) for f in vllm if f.func.startswith("GroupCoordinator."))
    # Any frame of these names, vLLM's or a wrapper of it, is on the pipeline group's path.
    group = "pp" if any(_method(f.func) in _PIPELINE_METHODS for f in frames) else None
    place = replace(base, top=top, vllm_frame=vllm_frame, entry=entry, vllm_calls=coordinator, group=group)
    if worker.state == "T":
        return replace(place, activity=Activity.STOPPED)
    if not frames:
        return place
    call = next((_method(f.func) for f in frames if _is_torch_distributed(f) and f.func not in _WRAPPERS
                 and not f.file.endswith("c10d_logger.py")), None)
    if call is not None:
        return replace(place, activity=Activity.BLOCKED, call=call)
    if any(f.func in _IDLE_RPC for f in frames[:6]):
        idle = next(str(f) for f in reversed(frames[:6]) if f.func in _IDLE_RPC)
        return replace(place, activity=Activity.IDLE_RPC, vllm_frame=idle)
    running = thread is not None and thread.active and worker.state in (None, "R")
    if running:
        return replace(place, activity=Activity.SPINNING)
    if vllm and frames[0] == vllm[0]:  # idle with a vLLM frame innermost: a native wait
        return replace(place, activity=Activity.WAITING)
    return place


@dataclass(frozen=True)
class StackDiagnosis:
    line: str
    reason: Reason
    faulty: Place | None
    blocked: Place | None  # the rank waiting on the faulty one, when one does
    group: str | None
    places: tuple[Place, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def named(self) -> bool:
        return self.faulty is not None

    def to_json(self) -> dict[str, Any]:
        return plain(self)


def _waiting(p: Place) -> bool:
    return p.activity in (Activity.BLOCKED, Activity.IDLE_RPC, Activity.WAITING)


def _by_stage(places: Sequence[Place], stage: int, tp_rank: int | None) -> Place | None:
    return next((p for p in places if p.stage == stage and (p.tp_rank or 0) == (tp_rank or 0)), None)


def diagnose_stacks(workers: Iterable[Worker]) -> StackDiagnosis:
    """The faulty rank among the workers, or a line that says none stands out."""
    workers = list(workers)
    titles = [parse_process_title(w.title) for w in workers if w.title]
    tp_size = 1 + max((t.group("TP") or 0 for t in titles if t is not None), default=0)
    places = tuple(sorted((place_of(w, tp_size=tp_size) for w in workers),
                          key=lambda p: (p.rank if p.rank is not None else 1 << 30, p.pid)))
    last = max((p.stage for p in places if p.stage is not None), default=None)

    def found(reason: Reason, faulty: Place, blocked: Place | None, text: str) -> StackDiagnosis:
        group = faulty.group or (blocked.group if blocked is not None else None) or (
            "pp" if reason in (Reason.MISSING_SEND, Reason.MISSING_RECV) else None)
        head = f"{group} group: " if group else ""
        line = f"{head}{faulty.who} is behind: {text}"
        return StackDiagnosis(line=line, reason=reason, faulty=faulty, blocked=blocked, group=group, places=places)

    stopped = [p for p in places if p.activity is Activity.STOPPED]
    if stopped:
        others = [p for p in places if p not in stopped and _waiting(p)]
        blocked = next((p for p in others if p.activity is Activity.BLOCKED), others[0] if others else None)
        tail = f"; {blocked.who} {blocked.describe()}" if blocked else ""
        return found(Reason.STOPPED, stopped[0], blocked, f"{stopped[0].describe()}{tail}")
    spinning = [p for p in places if p.activity is Activity.SPINNING]
    waiting = [p for p in places if _waiting(p)]
    if len(spinning) == 1 and waiting:
        spin = spinning[0]
        blocked = next((p for p in waiting if p.activity is Activity.BLOCKED), None) \
            or next((p for p in waiting if p.activity is Activity.WAITING), waiting[0])
        return found(Reason.SPINNING, spin, blocked,
                     f"{spin.describe()}, never returning to the engine; {blocked.who} {blocked.describe()}")
    for p in places:
        if p.activity is not Activity.BLOCKED or p.stage is None:
            continue
        if p.call in P2P_RECV and p.stage > 0:
            sender = _by_stage(places, p.stage - 1, p.tp_rank)
            if sender is not None and not (sender.activity is Activity.BLOCKED and sender.call in P2P_SEND):
                return found(Reason.MISSING_SEND, sender, p,
                             f"it never posted the send that {p.who} waits for "
                             f"({p.describe()}); rank {sender.rank} is {sender.describe()}")
        if p.call in P2P_SEND and last is not None and p.stage < last:
            receiver = _by_stage(places, p.stage + 1, p.tp_rank)
            if receiver is not None and not (receiver.activity is Activity.BLOCKED and receiver.call in P2P_RECV):
                return found(Reason.MISSING_RECV, receiver, p,
                             f"it never posted the receive that {p.who} waits in "
                             f"({p.describe()}); rank {receiver.rank} is {receiver.describe()}")
    collective = [p for p in places if p.activity is Activity.BLOCKED and p.call not in P2P]
    if collective:
        calls = {p.call for p in collective}
        absent = [p for p in places if p not in collective and p.stage is not None]
        if len(calls) == 1 and len(absent) == 1:
            return found(Reason.MISSING_COLLECTIVE, absent[0], collective[0],
                         f"it never joined the {collective[0].call} that {collective[0].who} waits in "
                         f"({collective[0].describe()}); rank {absent[0].rank} is {absent[0].describe()}")
    seen = "; ".join(f"{p.who} {p.describe()}" for p in places) or "no worker stacks"
    return StackDiagnosis(line=f"no rank stands out in the stacks: {seen}", reason=Reason.NONE, faulty=None,
                          blocked=None, group=None, places=places)


def format_places(d: StackDiagnosis) -> str:
    """One row per worker: where py-spy found it."""
    rows = [f"  {'rank':>4} {'stage':>5} {'pid':>8} {'state':>5} {'cpu':>5}  where"]
    for p in d.places:
        cpu = f"{p.cpu:.2f}" if p.cpu is not None else "-"
        mark = "  <- behind" if d.faulty is not None and p.pid == d.faulty.pid else ""
        rows.append(f"  {_s(p.rank):>4} {_s(p.stage):>5} {p.pid:>8} {_s(p.state):>5} {cpu:>5}  "
                    f"{p.activity.value}: {p.describe()}{mark}")
    return "\n".join(rows)


def _s(v: Any) -> str:
    return "-" if v is None else str(v)
