"""The reaper process: `python -I -S <this file> <socket descriptor> [<start helper>]` (`reaper_client.py`).

Run as a file, with the standard library alone on its path, it finds its own modules as the package `reaper`
(this folder, from its parent); `python -m gpuyard.services.executor.reaper` runs the same."""

import os
import sys

if __package__:
    from .loop import main
else:
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # the same function as above, found under this folder's own name (mypy sees two different ones)
    from reaper.loop import main  # type: ignore[no-redef]

main()
