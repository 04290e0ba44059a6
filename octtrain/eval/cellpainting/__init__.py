"""Cell Painting evaluation: well profiles, JUMP's profiling recipe, copairs retrieval mAP,
CellProfiler features (cp-measure) and `profile` (DINO against its baselines)."""
