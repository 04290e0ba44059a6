"""Shared by both kinds: metrics, bootstrap intervals, collapse, model selection, exact-once
validation, the k-NN probe and PCA pictures (pure where they can be)."""
