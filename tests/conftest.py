"""Shared fixtures. Heavy fixtures (cloud doubles, datasets) live beside the tests that use them."""

pytest_plugins = ["tests.doubles.fixtures"]
