"""Judging models: metrics, exact-once validation, collapse, selection, evaluate, reports."""
