"""octtrain: V-JEPA pretraining and diabetes fine-tuning of 3D ViTs on the octstage cache.

octtrain reads data only through an octstage manifest (``octstage.manifest``,
``octstage.volumestore``) and writes checkpoints through ``octstage.storage``.
"""

__version__ = "0.1.0"
