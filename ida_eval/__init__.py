"""MBXP evaluation: load MXFP8 checkpoints into transformers, generate, execute in a sandbox, score."""

__all__: list[str] = []
