"""soak: a long-run soak-test harness for vLLM servers."""

__version__ = "0.1.0"
