"""The watchdog line as real torch 2.11 prints it (no "last started work")."""

from pathlib import Path

from soak.probes.logwatch import parse_log_line

REAL_LOG = Path(__file__).parent.parent / "fixtures" / "flight_recorder" / "real" / "nccl_timeout" / "watchdog.log"


def test_torch_211_failure_line_carries_enqueued_and_completed() -> None:
    line = next(l for l in REAL_LOG.read_text().splitlines() if "failure detected by watchdog" in l)
    match = parse_log_line(line)
    assert match is not None and match.signature == "nccl_watchdog_failure" and match.fatal
    assert match.fields["pg_name"] == "pp_broadcast" and match.fields["seq"] == 13
    assert (match.fields["last_enqueued"], match.fields["last_completed"]) == (13, 12)
    assert "last_started" not in match.fields
