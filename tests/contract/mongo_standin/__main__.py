"""`python -m tests.contract.mongo_standin [--standalone] [--port N]`: a stand-in to point GPUYARD_STORE at,
until Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import threading

from tests.contract.mongo_standin import MongoStandIn


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.contract.mongo_standin", description=__doc__)
    parser.add_argument("--standalone", action="store_true", help="a standalone server (no transactions)")
    parser.add_argument("--port", type=int, default=27017)
    args = parser.parse_args()
    with MongoStandIn(standalone=args.standalone, port=args.port) as standin:
        print(standin.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
