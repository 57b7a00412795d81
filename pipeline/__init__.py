"""decision-pipeline: the library of stage functions (never imports Prefect)."""
