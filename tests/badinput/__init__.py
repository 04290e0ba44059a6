"""Bad input, damaged caches and repeated commands: a clear error, nothing lost."""
