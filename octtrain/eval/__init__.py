"""Judging models, by kind: `oct/` (evaluate, per-group breakdowns, probes), `cellpainting/`
(well profiles, JUMP's recipe, retrieval mAP) and `common/` (what both share: metrics, bootstrap,
exact-once validation, collapse, selection, the k-NN probe)."""
