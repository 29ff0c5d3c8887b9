"""Failure criteria beyond hangs: pure constraint functions over the finished
requests (``soak.criteria.rules`` tallies them), each returning a typed result
with its reasons (``soak.criteria.constraints``)."""

from soak.criteria.config import CriteriaConfig
from soak.criteria.constraints import CriteriaDecision, CriterionResult, judge
from soak.criteria.rules import CriterionState, RequestTally

__all__ = ["CriteriaConfig", "CriteriaDecision", "CriterionResult", "CriterionState", "RequestTally", "judge"]
