"""``octstage build-cache``: decode each DICOM once into the compressed uint8 Zarr cache.

``plan`` (pure: what to build, cache keys, remembered verdicts), ``task`` (one file on a worker),
``normalize`` (the pixel recipe), ``cluster`` (dask: local or a scheduler address), ``qc`` (the
QC figure), ``lock`` (the cache folder: one build at a time, temporaries cleaned) and ``run``
(the command: plan, fan out, collect, write the manifest last).
"""
