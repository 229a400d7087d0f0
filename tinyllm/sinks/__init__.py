"""Where a run's figures and spans go: the per-step reporter and its sinks (``metrics.py``: console, JSONL),
TensorBoard, MLflow (the sink and its delivery process), and tracing (whether and where; the OTLP export)."""
