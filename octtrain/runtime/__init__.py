"""Where the code meets the machine: device backends, host vs global, checkpoints, tracking,
the watchdog and the run folder."""
