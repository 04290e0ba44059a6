"""``octstage mirror``: copy a B2 or S3 bucket to GCS once, verified end to end.

``inventory`` (pure: the source listing with hashes, the plan), ``rclone`` (the one subprocess
edge: an rclone daemon driven over its rc API), ``source_hashes`` (``--hash-missing``: SHA1s the
source does not list), ``verify`` (destination against inventory), ``report`` (the run's report
and summary table) and ``run`` (the command).
"""
