"""soak held against the facts extracted from the vLLM wheels and dcgm-exporter's
sources (soak/upstream/*.json, made by scripts/upstream-facts): one test per
version for the name table, the log watcher, the title parser and the simulator."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from soak import metric_names
from soak.metric_names import BASE_LABELS, VLLM_METRICS, MetricType, ProcessRole, parse_process_title
from soak.probes.gpu import parse_dcgm
from soak.probes.logwatch import parse_log_line
from soak.probes.metrics import parse_metrics
from soak.sim.config import SIM_VLLM_VERSIONS, SimConfig
from soak.sim.gpus import dcgm_text
from soak.sim.metrics import SimMetrics
from soak.versions import covered_versions, profile_for, upstream_facts

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "soak" / "upstream"
VERSIONS = covered_versions()
DCGM = sorted(UPSTREAM.glob("dcgm-exporter-*.json"))


def test_the_claimed_versions_are_all_covered():
    assert {"0.11.0", "0.11.2", "0.33.0"} <= set(VERSIONS)
    for version in VERSIONS:
        source = upstream_facts()[version]["source"]
        assert source["version"] == version and len(source["sha256"]) == 64 and source["wheel"].endswith(".whl")


def _sim_version_for(version: str) -> str:
    basis = profile_for(version).basis
    return basis if basis in SIM_VLLM_VERSIONS else min(SIM_VLLM_VERSIONS, key=lambda v: abs(float(v[2:]) - float(basis[2:])))


@pytest.mark.parametrize("version", VERSIONS)
def test_name_table_matches_the_wheel(version):
    facts = upstream_facts()[version]["metrics"]
    relied_on = ("num_requests_running", "kv_cache_usage_perc", "prompt_tokens", "generation_tokens",
                 "prefix_cache_queries", "prefix_cache_hits", "request_success", "iteration_tokens_total",
                 "time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds")
    for key in relied_on:
        assert VLLM_METRICS[key].exposed in facts, f"{version} lacks {key}"
    for key, spec in VLLM_METRICS.items():
        fact = facts.get(spec.exposed)
        if fact is None:
            # a name the version lacks is expected missing: no warning, rules degrade
            assert not profile_for(version).exposes(spec.exposed)
            continue
        assert fact["type"] == spec.type.value, (version, key)
        assert fact["labelnames"] == list(BASE_LABELS + spec.extra_labels), (version, key)
        assert fact["hidden"] == spec.hidden, (version, key)
        if spec.type is MetricType.HISTOGRAM:
            if isinstance(fact["buckets"], list):
                assert [float(b) for b in fact["buckets"]] == [float(b) for b in spec.buckets], (version, key)
            else:  # token-count histograms: build_1_2_5_buckets(max_model_len)
                assert spec.buckets == () and "build_1_2_5_buckets" in fact["buckets"]["call"], (version, key)


def test_033_drops_tpot_and_the_hidden_names_and_adds_finish_reasons():
    new, old = upstream_facts()["0.33.0"], upstream_facts()["0.11.2"]
    assert "vllm:time_per_output_token_seconds" in old["metrics"]
    assert "vllm:time_per_output_token_seconds" not in new["metrics"]
    assert "vllm:gpu_cache_usage_perc" not in new["metrics"]
    assert {"error", "repetition"} <= set(new["finish_reasons"]) and "error" not in old["finish_reasons"]
    assert old["usage"]["include_usage_default"] is True and new["usage"]["include_usage_default"] is False
    assert old["usage"]["cached_tokens_omitted_when_zero"] is True
    assert new["usage"]["cached_tokens_omitted_when_zero"] is False
    # a 0.33 /metrics without tpot is complete: nothing reported missing for it
    sim = SimMetrics(SimConfig(vllm_version="0.33.0"))
    parsed = parse_metrics(sim.render().decode(), profile=profile_for("0.33.0"))
    assert parsed.missing == ()
    assert "time_per_output_token_seconds" in parse_metrics(sim.render().decode()).missing  # without the profile


@pytest.mark.parametrize("version", VERSIONS)
def test_log_watcher_matches_the_wheels_strings(version):
    logs = upstream_facts()[version]["logs"]
    cyan = "\x1b[1;36m" if logs["process_prefix"]["cyan"] else ""
    reset = "\x1b[0;0m" if cyan else ""
    prefix = f"{cyan}(EngineCore_DP0 pid=4100){reset} "
    assert logs["shm_broadcast_wait"]["found"] and logs["engine_dead"]["found"]
    shm = parse_log_line(f"{prefix}INFO 12-02 16:43:28 [shm_broadcast.py:466] {logs['shm_broadcast_wait']['needle']}"
                         " in 60 seconds. This typically happens when some processes are hanging.")
    assert shm is not None and shm.signature == "shm_broadcast_wait" and shm.fields["pid"] == 4100
    assert logs["rpc_timeout"]["methods"], version
    for method in logs["rpc_timeout"]["methods"]:
        line = prefix + "TimeoutError: " + logs["rpc_timeout"]["needle"].format(method=method)
        match = parse_log_line(line)
        assert match is not None and match.signature == "sample_tokens_timeout" and match.fatal
        assert match.fields["method"] == method and match.fields["worker"] == "EngineCore_DP0"
    dead = parse_log_line(f"{prefix}vllm.v1.engine.exceptions.EngineDeadError: {logs['engine_dead']['needle']}")
    assert dead is not None and dead.signature == "engine_dead"


@pytest.mark.parametrize("version", VERSIONS)
def test_title_parser_reads_every_worker_title_the_wheel_can_make(version):
    titles = upstream_facts()[version]["titles"]
    assert titles["format"] == "{prefix}::{name}" and titles["worker_base"] == "Worker"
    parts = titles["worker_parts"]
    assert set(parts) <= set(metric_names.WORKER_GROUPS)
    full = "Worker" + "".join(f"_{g}{i + 1}" for i, g in enumerate(parts))
    parsed = parse_process_title(f"VLLM::{full}")
    assert parsed is not None and parsed.role is ProcessRole.WORKER
    assert [g for g, _ in parsed.groups] == parts
    assert parsed.pipeline_stage == parts.index("PP") + 1
    assert parse_process_title("VLLM::Worker_DP0_PP3_TP1").pipeline_stage == 3
    bare = parse_process_title("VLLM::Worker")
    assert bare is not None and bare.pipeline_stage is None  # not placed until its groups exist
    assert titles["bare_worker_before_groups"] == (version == "0.33.0")
    api = parse_process_title("VLLM::" + titles["api_server"].format(index=2))
    assert api.role is ProcessRole.API_SERVER and api.index == 2
    # one API server is untitled: only the multi-server worker procs call set_process_title("APIServer", ...)
    assert all(where.endswith(":run_api_server_worker_proc") for where in titles["api_server_titled_in"])
    assert parse_process_title("/usr/bin/python3 /usr/local/bin/vllm serve m --port 8000") is None


@pytest.mark.parametrize("version", VERSIONS)
def test_simulator_speaks_the_version(version):
    facts = upstream_facts()[version]
    sim_version = _sim_version_for(version)
    config = SimConfig(vllm_version=sim_version, max_model_len=4096)
    metrics = SimMetrics(config)
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    sim_facts = upstream_facts()[sim_version]["metrics"]
    for spec in VLLM_METRICS.values():
        exposed = spec.exposed
        if exposed in families:
            assert exposed in sim_facts, f"simulator {sim_version} exposes {exposed}, vLLM {sim_version} does not"
        elif exposed in sim_facts and not sim_facts[exposed]["hidden"]:
            assert spec.spec_decode_only and not config.spec_decode, f"simulator lacks {exposed}"
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples if "finished_reason" in s.labels}
    assert reasons == set(upstream_facts()[sim_version]["finish_reasons"])
    if sim_version == version:
        assert config.profile.include_usage_default == facts["usage"]["include_usage_default"]
        assert config.profile.cached_tokens_omitted_when_zero == facts["usage"]["cached_tokens_omitted_when_zero"]
    usage_fields = set(facts["usage"]["usage_info"]["fields"])
    assert {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"} <= usage_fields
    assert "cached_tokens" in facts["usage"]["prompt_token_usage_info"]["fields"]


def test_an_uncovered_version_warns_naming_the_covered_ones():
    profile = profile_for("0.12.0")
    assert not profile.covered and profile.basis == "0.11.2"
    for version in VERSIONS:
        assert version in profile.warning
    assert "0.12.0" in profile.warning
    assert profile_for("0.11.2").warning is None and profile_for("0.33.0").warning is None
    assert profile_for(None).warning is not None  # no /version answer: said, not guessed silently


@pytest.mark.parametrize("path", DCGM, ids=lambda p: p.stem)
def test_dcgm_fields_and_labels_match_the_exporter(path):
    facts = json.loads(path.read_text())
    counters = facts["default_counters"]
    for key in ("util", "mem_used_mib", "mem_free_mib", "power_w", "sm_clock_mhz", "xid_errors", "energy_mj"):
        assert metric_names.DCGM_FIELDS[key].exposed in counters, (path.name, key)
    assert facts["collect_interval_ms_default"] == 30000  # why the compose file sets -c
    hostname = facts["hostname_label"]
    assert hostname in ("Hostname", "hostname")
    # the harness parses the exporter's text whichever hostname spelling it uses
    text = dcgm_text([], hostname="h")  # header only
    labels = f'gpu="3",UUID="GPU-x",device="nvidia3",modelName="RTX 3090",{hostname}="box"'
    text += f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} 97\nDCGM_FI_DEV_FB_USED{{{labels}}} 22000\n"
    if "DCGM_FI_DEV_PCIE_TX_THROUGHPUT" in counters:
        text += f"DCGM_FI_DEV_PCIE_TX_THROUGHPUT{{{labels}}} 1234\n"
    (reading,) = parse_dcgm(text)
    assert reading.index == 3 and reading.util_pct == 97
    if "DCGM_FI_DEV_PCIE_TX_THROUGHPUT" in counters:
        assert reading.pcie_tx_kbs == 1234


def test_simulated_dcgm_speaks_the_compose_images_labels():
    facts = json.loads((UPSTREAM / "dcgm-exporter-3.3.5-3.4.1.json").read_text())
    from prometheus_client.parser import text_string_to_metric_families

    from soak.sim.gpus import gpu_readings, Activity

    config = SimConfig(pp_size=2)
    text = dcgm_text(gpu_readings(config, Activity.IDLE, [None, None], [True, True]), hostname="box", energy_mj=[1.0, 2.0])
    for family in text_string_to_metric_families(text):
        assert family.name in facts["default_counters"], family.name
        for sample in family.samples:
            assert set(sample.labels) <= set(facts["gpu_labels"]), sample.labels


def test_compose_runs_dcgm_exporter_with_a_sub_second_collect_interval():
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.fail("docker-compose is not installed; scripts/test installs it (Debian's docker-compose)")
    result = subprocess.run([tool, "-f", str(ROOT / "docker-compose.yml"), "--profile", "dcgm", "config"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    command = [str(x) for x in yaml.safe_load(result.stdout)["services"]["dcgm-exporter"]["command"]]
    flag = next(i for i, arg in enumerate(command) if arg in ("-c", "--collect-interval"))
    interval_ms = int(command[flag + 1])
    from soak.detect.config import DetectorConfig

    assert interval_ms < 1000 and interval_ms / 1000 < DetectorConfig().pp_tail_stall.window
