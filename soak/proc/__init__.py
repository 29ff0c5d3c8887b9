"""The harness's view of processes: reading /proc, the target's tree, the one
decision whether a PID may be signalled, the kill, identity checks, the
target's cgroup and its /dev/shm segments.

A leaf (stage floor 0): the standard library, psutil and other leaves only, so
the guardian (``soak.run.guardian``, started with every launched soak) and the
simulator import it without the responder.

- ``facts``: ``Pin`` (PID + start time), ``ProcFacts``, ``Member``, ``ProcTable`` (pure)
- ``read``: one pass over /proc, the socket scan, per-process reads
- ``snapshots``: ``ProcSnapshots``, the one reader a process's users share
- ``belonging``: ``decide`` (pure)
- ``tree``: ``ProcessTree``, the record of the target's processes over the run
- ``kill``: SIGSTOP/SIGKILL of a tree, leftovers, stragglers
- ``identity``: is this PID the server at that URL
- ``cgroup``, ``shm``: the target's cgroup and /dev/shm segments
"""
