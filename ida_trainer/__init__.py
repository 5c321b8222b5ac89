"""SFT trainer with NVFP4 compute and an MXFP8 master (python -m ida_trainer)."""

__all__: list[str] = []
