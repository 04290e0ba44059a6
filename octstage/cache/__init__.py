"""The cache on disk or in a bucket: one OME-Zarr group per volume (``volumestore``) and
``octstage verify``, which checks a cache against its manifest."""
