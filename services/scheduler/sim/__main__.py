import sys

from gpuyard.services.scheduler.sim.cli import main

sys.exit(main())
