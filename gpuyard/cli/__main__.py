"""`python -m gpuyard.cli ARGS` is `gpuyard ARGS`."""

import sys

from gpuyard.cli import main

sys.exit(main())
