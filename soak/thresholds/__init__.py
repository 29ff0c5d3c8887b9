"""k6-style thresholds on a run's figures (docs/nightly.md): the metric-name table
(``metrics``), expressions (``expr``), the config section (``config``), pure
evaluation (``evaluate``) and the run-directory adapter (``rundir``)."""
