"""``python -m nvfp4_cuda {build,info}``: compile the CUDA library / report the backend in use."""

from nvfp4_cuda.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
