"""OCT evaluation: `evaluate` (classification and regression), per-group breakdowns with
participant intervals, the shared report, and `probe` (frozen tokens, attentive and linear
probes)."""
