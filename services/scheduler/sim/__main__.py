import sys

from services.scheduler.sim.cli import main

sys.exit(main())
