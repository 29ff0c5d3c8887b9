"""Kubernetes on paper: the fleet nightly's Indexed Job manifest is checked by a
real schema validator (kubernetes-validate, strict: an unknown or misspelt field
fails), and it keeps the shape the Slurm fleet has."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "soak-fleet-indexed-job.yaml"


def test_the_fleet_manifest_is_a_valid_indexed_job():
    doc = yaml.safe_load(MANIFEST.read_text())
    kubernetes_validate.validate(doc, "1.30.0", strict=True)
    spec = doc["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["backoffLimit"] == 0  # a failed night is never retried into another
    container = spec["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["SOAK_HISTORY_RENDER"]["value"] == "0"  # pooled once, after every box
    assert "value" not in env["HF_TOKEN"]  # the secret comes from a Secret, never the manifest


def test_the_validator_rejects_a_misspelt_field():
    doc = yaml.safe_load(MANIFEST.read_text())
    doc["spec"]["completionMod"] = doc["spec"].pop("completionMode")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
