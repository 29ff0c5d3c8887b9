"""pp_tail_stall's evidence table. Written by scripts/fit_evidence.py: do not edit by hand."""

from soak.detect.evidence import EvidenceTable

PROVENANCE = "scripts/fit_evidence.py --healthy-minutes 240 --hangs 24: healthy_agentic.jsonl.gz; healthy_cold_prefill.jsonl.gz; healthy_idle_gaps.jsonl.gz; healthy_spec_burst.jsonl.gz; healthy_startup_pause.jsonl.gz; 12 simulated healthy runs of 20 min (seeds 9000-9011); 26 pp_deadlocks (2 fixtures, 24 recorded, seeds 9100+), 10 s after each onset. Counts: {'healthy': {'tail_pattern': {'working': 32413}, 'progress': {'age<0.6': 22110, 'age<1.2': 9595, 'age<2': 6, 'age<4': 12, 'age>=4': 690}}, 'hung': {'tail_pattern': {'stall': 751}, 'progress': {'age<1.2': 55, 'age<0.6': 64, 'age<2': 63, 'age<4': 152, 'age>=4': 417}}}. Priors: healthy floors {'stall': 0.0001, 'partial': 0.001}, given fresh progress {'stall': 0.01, 'partial': 0.05}, real onset {'working': 1, 'partial': 2, 'stall': 17} (issue 37, H100). No recorded real GPU trace yet."

TABLE = EvidenceTable(
    llr={'tail_pattern': {'stall': 9.132, 'partial': 3.919, 'working': -3.675}, 'progress': {'age<0.6': -2.075, 'age<1.2': -1.391, 'age<2': 6.041, 'age<4': 6.263, 'age>=4': 3.259}, 'tail_pattern|fresh_progress': {'stall': 4.526, 'partial': 0.007, 'working': -3.614}},
    period_s=0.5,
    healthy={'tail_pattern': {'stall': 0.0001, 'partial': 0.001, 'working': 0.9989}, 'progress': {'age<0.6': 0.682097, 'age<1.2': 0.296016, 'age<2': 0.000201, 'age<4': 0.000386, 'age>=4': 0.021302}, 'tail_pattern|fresh_progress': {'stall': 0.01, 'partial': 0.05, 'working': 0.94}},
    provenance=PROVENANCE,
)
