import sys

from gpuyard.shared.scheduling.sim.cli import main

sys.exit(main())
