"""octstage: stage AI-READI OCT data once, verified, into a fast Zarr cache and a manifest.

octstage never imports torch; the trainer (octtrain) reads only `octstage.manifest`.
"""

__version__ = "0.1.0"
