"""Typed run settings: shared sections (``sections``), one config per job (``pretrain``,
``finetune``) and the YAML + dotted-override loader (``loader``)."""
