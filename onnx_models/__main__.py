"""``python -m onnx_models profile PIPELINE …``: the profile command on its own."""

import sys

from onnx_models.cli import main

sys.exit(main())
