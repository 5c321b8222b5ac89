"""MXFP8 checkpoint codec: OCP E4M3 payload + UE8M0 scale per 32 values, in safetensors files."""

__all__: list[str] = []
