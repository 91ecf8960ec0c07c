"""
HARNESS, recording: the steps of an experiment and its record (experiment: write the event, then call the sinks),
what a tag is measured against (baseline: the baseline, the holdout), the sinks (the results row and git note, the
study, artifacts, MLflow, the dashboard), MLflow (tracking), the dashboard and its data (dashboard, pagedata), and
report.py's analysis and figures (analysis, plots).
"""
