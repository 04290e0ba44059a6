"""Shared fixtures. Heavy fixtures (cloud doubles, datasets) live beside the tests that use them."""

import os

# fake-gcs-server serves no gRPC storage-layout API; gcsfs would spend 60 s per bucket probing
# it. Set before anything imports gcsfs (octtrain's checkpoint folder sets it too, for users).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

pytest_plugins = ["tests.doubles.fixtures"]
