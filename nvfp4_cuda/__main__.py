"""``python -m nvfp4_cuda {build,info}``: compile the CUDA library / report the backend in use."""

import sys

from nvfp4_cuda.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
