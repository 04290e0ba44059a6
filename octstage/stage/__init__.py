"""``octstage stage``: a built cache from a bucket onto a host's local disk, verified.

``run``: the command (every volume or pack fetched, checked against the manifest, the manifest
written last); ``destination``: what the folder may already hold and how ``--replace`` sweeps it.
"""

from octstage.stage.run import run_stage as run_stage
from octstage.stage.run import shard_keys as shard_keys
from octstage.stage.run import volume_paths as volume_paths
