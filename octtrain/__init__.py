"""octtrain: V-JEPA pretraining and diabetes fine-tuning of 3D ViTs on the octstage cache.

octtrain imports one octstage module, the manifest (``octstage.manifest``): it reads the cache only
through it, and never lists a folder or a bucket.
"""

__version__ = "0.1.0"
