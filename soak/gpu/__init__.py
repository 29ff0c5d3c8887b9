"""Real-GPU pieces: a CUDA-backed simulator worker, a per-process NVML GPU
source, and a torch.distributed pipeline program that reproduces the
pipeline-parallel deadlock signature over NCCL (gloo on CPU).

torch is not a dependency of soak: only the modules run as programs here
(``cuda_worker``, ``pp_nccl``, ``fr_dump``) import it, and only when they run.
Importing this package, or ``soak.gpu.process_source``, never needs torch.
"""
