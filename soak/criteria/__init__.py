"""Failure criteria beyond hangs: pure constraint functions over the finished
requests, each returning a typed result with its reasons (``soak.criteria.rules``)."""

from soak.criteria.config import CriteriaConfig
from soak.criteria.rules import CriteriaDecision, CriterionResult, CriterionState, RequestTally, judge

__all__ = ["CriteriaConfig", "CriteriaDecision", "CriterionResult", "CriterionState", "RequestTally", "judge"]
