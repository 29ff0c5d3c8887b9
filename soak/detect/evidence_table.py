"""pp_tail_stall's evidence table. Written by scripts/fit_evidence.py: do not edit by hand."""

from soak.detect.evidence import EvidenceTable

PROVENANCE = "scripts/fit_evidence.py --healthy-minutes 240 --hangs 24: healthy_agentic.jsonl.gz; healthy_cold_prefill.jsonl.gz; healthy_idle_gaps.jsonl.gz; healthy_spec_burst.jsonl.gz; healthy_startup_pause.jsonl.gz; 12 simulated healthy runs of 20 min (seeds 9000-9011); 26 pp_deadlocks (2 fixtures, 24 recorded, seeds 9100+), 10 s after each onset. Counts: {'healthy': {'tail_pattern': {'working': 32413}, 'progress': {'age<0.6': 21957, 'age<1.2': 9748, 'age<2': 6, 'age<4': 12, 'age>=4': 690}}, 'hung': {'tail_pattern': {'stall': 758}, 'progress': {'age<1.2': 41, 'age<0.6': 61, 'age<4': 152, 'age>=4': 491, 'age<2': 13}}}. Priors: healthy floors {'stall': 0.0001, 'partial': 0.001}, given fresh progress {'stall': 0.01, 'partial': 0.05}, given nothing in flight {'stall': 0.02, 'partial': 0.07}, real onset {'working': 1, 'partial': 2, 'stall': 17} (issue 37, H100). No recorded real GPU trace yet."

TABLE = EvidenceTable(
    llr={'tail_pattern': {'stall': 9.132, 'partial': 3.919, 'working': -3.675}, 'progress': {'age<0.6': -2.125, 'age<1.2': -1.707, 'age<2': 4.483, 'age<4': 6.254, 'age>=4': 3.412}, 'tail_pattern|fresh_progress': {'stall': 4.526, 'partial': 0.007, 'working': -3.614}, 'tail_pattern|nothing_in_flight': {'stall': 3.833, 'partial': -0.33, 'working': -3.581}},
    period_s=0.5,
    healthy={'tail_pattern': {'stall': 0.0001, 'partial': 0.001, 'working': 0.9989}, 'progress': {'age<0.6': 0.677377, 'age<1.2': 0.300736, 'age<2': 0.000201, 'age<4': 0.000386, 'age>=4': 0.021302}, 'tail_pattern|fresh_progress': {'stall': 0.01, 'partial': 0.05, 'working': 0.94}, 'tail_pattern|nothing_in_flight': {'stall': 0.02, 'partial': 0.07, 'working': 0.91}},
    provenance=PROVENANCE,
)
