"""``soak report DIR`` on recorded run directories: a pass, a fail with an incident,
a cut-off run. The page shows the verdict and the incident, every image decodes,
and junit.xml validates against the published Ant JUnit schema."""

from __future__ import annotations

import base64
import io
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import matplotlib.image as mpimg
import pytest
import xmlschema

from report_paths import JUNIT_XSD


def _report(run_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "soak", "report", str(run_dir)], capture_output=True, text=True,
                          timeout=120)


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)]


@pytest.fixture(scope="module")
def schema():
    return xmlschema.XMLSchema(str(JUNIT_XSD))


def _check_images(page: str) -> None:
    images = _images(page)
    assert len(images) == 5  # heatmap, token rates, TTFT, context length, hit ratio
    for png in images:
        pixels = mpimg.imread(io.BytesIO(png), format="png")
        assert pixels.shape[0] > 100 and pixels.shape[1] > 500


def test_failing_run_shows_verdict_incident_watchdog_and_flight_recorder(run_copy, schema):
    run = run_copy("fail")
    log = run / "incidents" / "1" / "log_tail.txt"  # a log line that must not become markup
    log.write_text(log.read_text() + "TimeoutError: RPC call to sample_tokens timed out. <script>alert(1)</script>\n")
    done = _report(run)
    assert done.returncode == 0, done.stderr
    assert "demo-fail: fail" in done.stdout
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "class='banner fail'" in page and ">FAIL<" in page
    assert "Incident 1: hang" in page and "gen_tokens_frozen" in page
    assert "GPU 7 reads 0%" in page  # the incident's summary
    assert "watchdog_failure" in page and "40427" in page  # parsed watchdog lines
    assert "rank 7 never enqueued collective 40427" in page  # the flight-recorder table
    assert re.search(r"<tr class=\"behind\"><td>7</td><td class=\"num\">40426</td>", page)
    # time at risk, as soak history counts it (soak.exposure): load start to the onset, 117 s; not the
    # 214.5 s of load, which holds the 95 s the server was already hung before the detector decided
    assert "1 hang in 117 s: MTBF 117 s" in page
    assert "<script>" not in page and "&lt;script&gt;alert(1)" in page
    _check_images(page)
    schema.validate(str(run / "junit.xml"))
    suite = ET.parse(run / "junit.xml").getroot()
    # The soak case and one case per failure criterion; the 12 streams reset at
    # the kill are 31% of the finished requests, so error_rate fails beside the hang.
    # (work_evidence is a fourth case: the server did work before the hang, so it passes; work_rate,
    # server_work and wrong_model are three more, each passing or not checked on this fixture.)
    assert suite.get("tests") == "7" and suite.get("failures") == "2"
    failure = suite.find("testcase/failure")
    assert failure.get("type") == "hang" and "GPU 7 reads 0%" in failure.get("message")
    cases = {case.get("name"): case for case in suite.findall("testcase")}
    assert cases["criteria.error_rate"].find("failure").get("type") == "criterion"
    assert "12 of 39 finished requests failed" in cases["criteria.error_rate"].find("failure").get("message")
    assert cases["criteria.no_success"].find("failure") is None
    assert cases["criteria.work_evidence"].find("failure") is None


def test_passing_run_states_the_mtbf_bound(run_copy, schema):
    run = run_copy("pass")
    assert _report(run).returncode == 0
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "class='banner pass'" in page and ">PASS<" in page
    assert "no hang in 3.9 min: MTBF above 79 s at 95% confidence" in page
    assert "Incident" not in page
    _check_images(page)
    schema.validate(str(run / "junit.xml"))
    suite = ET.parse(run / "junit.xml").getroot()
    assert (suite.get("failures"), suite.get("errors")) == ("0", "0")
    assert suite.find("testcase/failure") is None


def test_cut_off_run_renders_marked_cut_off(run_copy, schema):
    run = run_copy("cutoff")
    assert not (run / "summary.json").exists()  # the harness died before writing it
    done = _report(run)
    assert done.returncode == 0, done.stderr
    assert "(cut off)" in done.stdout
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "(cut off)" in page and "This run was cut off" in page
    assert "events.jsonl: 1 unreadable line skipped" in page  # the torn last line
    _check_images(page)
    assert (run / "summary.json").is_file()
    schema.validate(str(run / "junit.xml"))
    suite = ET.parse(run / "junit.xml").getroot()
    assert suite.get("errors") == "1" and suite.find("testcase/error").get("type") == "cut_off"


def test_run_with_almost_nothing_recorded_still_renders(tmp_path, schema):
    run = tmp_path / "early"
    run.mkdir()
    (run / "events.jsonl").write_text('{"ts": 1764690000.0, "type": "run_started", "run_id": "x"}\n')
    assert _report(run).returncode == 0
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "no GPU samples" not in page  # text is drawn inside the image, not the page
    _check_images(page)
    schema.validate(str(run / "junit.xml"))


def test_not_a_run_directory_is_one_line_exit_2(tmp_path):
    done = _report(tmp_path / "missing")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "not a run directory" in done.stderr
    assert "Traceback" not in done.stderr


def test_real_recorded_deadlock_run_renders_the_incident(run_copy, schema):
    run = run_copy("real_fail")  # recorded by `soak run` against the simulator's pp_deadlock
    done = _report(run)
    assert done.returncode == 0, done.stderr
    page = (run / "report.html").read_text(encoding="utf-8")
    assert ">FAIL<" in page and "Incident 1: hang" in page and "pp_tail_stall" in page
    assert "last stage GPU 7 at 0%" in page  # the decision's reasons from incident.json
    assert "tail_gpus" in page  # the signals in force
    _check_images(page)
    schema.validate(str(run / "junit.xml"))
    assert ET.parse(run / "junit.xml").getroot().find("testcase/failure").get("type") == "hang"


def test_real_recorded_passing_run_renders(run_copy, schema):
    run = run_copy("real_pass")  # recorded by `soak run workloads/demo.yaml --duration 40s`
    done = _report(run)
    assert done.returncode == 0, done.stderr
    page = (run / "report.html").read_text(encoding="utf-8")
    assert ">PASS<" in page and "no hang in 40 s: MTBF above 13 s at 95% confidence" in page
    assert "Incident" not in page and "ok: 86" in page
    _check_images(page)
    schema.validate(str(run / "junit.xml"))


def test_a_stage_cpu_run_says_stage_cpu_not_gpu(run_copy):
    # vLLM's CPU build: the readings are each pipeline stage's CPU (soak.probes.stage_cpu)
    run = run_copy("pass")
    samples = run / "samples.jsonl"
    samples.write_text(samples.read_text().replace('"source":"sim"', '"source":"stage_cpu"'))
    done = _report(run)
    assert done.returncode == 0, done.stderr
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "Stage CPU" in page and "GPU utilization" not in page
    _check_images(page)
