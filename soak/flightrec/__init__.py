"""PyTorch flight-recorder dumps (NCCL, gloo): read them and find where the ranks diverged.

``dumps`` reads one pickle (or JSON form) per rank into the per-rank table;
``diagnose`` names the first collective not every rank reached. Pure and a leaf:
the responder writes ``flight_recorder_summary.json`` with it at incident time,
and the report and ``soak diagnose`` read the same dumps later.
"""
