"""Test rigs: programs that stand in for a real multi-GPU vLLM where one cannot run.

Run as ``python -m soak.rigs.<name>`` by tests/gpu, bench/ and the docs, never
imported by the harness itself:

- ``cuda_worker``: the simulator's pipeline worker as a real CUDA process
  (``soak sim --worker-backend cuda``);
- ``pp_nccl``: a small pipeline-parallel server over torch.distributed (NCCL,
  or gloo on CPU) that deadlocks the way vLLM's pipeline does;
- ``fr_dump``: makes a real flight-recorder dump from a one-rank process group.

torch is not a dependency of soak: only these programs import it, and only when
they run. Importing this package never needs torch.
"""
