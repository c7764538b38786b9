"""``python -m labkit.gpu_check`` (same as ``python -m labkit gpu-check``)."""
import sys

from . import main

sys.exit(main())
