"""Prefect flows: thin orchestration over the stage functions in `pipeline` (added by later issues)."""
