"""Manifest-fed volumes: the dataset, samplers, loaders, splits and masks."""
