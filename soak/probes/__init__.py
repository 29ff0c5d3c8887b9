"""Probes: GPUs, server metrics, health, process liveness, the server log, client progress."""
