"""Cell Painting (JUMP layout), the second data kind: the synthetic twin, the load-data and
perturbation tables, and build-cache's adapter that writes uint8 ``[C, Y, X]`` fields."""
