"""Tokens without a model: the deterministic tokenizer and chat template.

The simulator serves with them, and the workload counts a simulator target's
prompt tokens with them exactly, in process. A leaf, so neither imports the other.
"""
