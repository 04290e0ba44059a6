"""octtrain: V-JEPA (3D OCT) and DINOv2 (Cell Painting) pretraining, fine-tuning, evaluation and
the export of every item's embedding, on the octstage cache.

octtrain imports one octstage module, the manifest (``octstage.manifest``): it reads the cache only
through it, and never lists a folder or a bucket.
"""

__version__ = "0.1.0"
