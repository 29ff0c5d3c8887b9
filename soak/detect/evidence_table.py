"""pp_tail_stall's evidence table. Written by scripts/fit_evidence.py: do not edit by hand."""

from soak.detect.evidence import EvidenceTable

PROVENANCE = "scripts/fit_evidence.py --healthy-minutes 240 --hangs 24: 12 simulated healthy runs of 20 min (seeds 9000-9011); left out, recorded before client samples dated their tokens (token_silence_s): healthy_agentic.jsonl.gz, healthy_cold_prefill.jsonl.gz, healthy_idle_gaps.jsonl.gz, healthy_spec_burst.jsonl.gz, healthy_startup_pause.jsonl.gz, fault_pp_deadlock.jsonl.gz, fault_pp_deadlock_nvml.jsonl.gz; 24 pp_deadlocks (24 recorded, seeds 9100+, plus any fixture kept), 10 s after each onset. Counts: {'healthy': {'tail_pattern': {'working': 28057}, 'progress': {'age<0.6': 19430, 'age<1.2': 8155, 'age<2': 4, 'age<4': 8, 'age>=4': 460}}, 'hung': {'tail_pattern': {'stall': 698}, 'progress': {'age<0.6': 58, 'age<2': 13, 'age<4': 140, 'age>=4': 452, 'age<1.2': 35}}}. Priors: healthy floors {'stall': 0.0001, 'partial': 0.001}, given fresh progress {'stall': 0.01, 'partial': 0.05}, given nothing in flight {'stall': 0.02, 'partial': 0.07}, real onset {'working': 1, 'partial': 2, 'stall': 17} (issue 37, H100). No real GPU trace is fitted (the device runs are minutes long); their idle readings set the idle floors."

TABLE = EvidenceTable(
    llr={'tail_pattern': {'stall': 9.132, 'partial': 3.919, 'working': -3.674}, 'progress': {'age<0.6': -2.115, 'age<1.2': -1.747, 'age<2': 4.789, 'age<4': 6.495, 'age>=4': 3.673}, 'tail_pattern|fresh_progress': {'stall': 4.526, 'partial': 0.007, 'working': -3.613}, 'tail_pattern|nothing_in_flight': {'stall': 3.833, 'partial': -0.329, 'working': -3.58}},
    period_s=0.5,
    healthy={'tail_pattern': {'stall': 0.0001, 'partial': 0.001, 'working': 0.9989}, 'progress': {'age<0.6': 0.692475, 'age<1.2': 0.29065, 'age<2': 0.00016, 'age<4': 0.000303, 'age>=4': 0.016412}, 'tail_pattern|fresh_progress': {'stall': 0.01, 'partial': 0.05, 'working': 0.94}, 'tail_pattern|nothing_in_flight': {'stall': 0.02, 'partial': 0.07, 'working': 0.91}},
    provenance=PROVENANCE,
)
