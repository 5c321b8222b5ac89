"""Entry point of ``python -m mxfp8_codec`` (see :mod:`mxfp8_codec.cli`)."""

from mxfp8_codec.cli import main

raise SystemExit(main())
