"""`python -m runtime_tests.helpers.fake_server PORT [DELAY] [DRAIN_TIMEOUT]` (tests/ on PYTHONPATH): the real app, runner and signal
handling (`server.drain.serve`) over the fake engine, as its own process, for the SIGTERM drain tests."""

import logging
import sys

from runtime_tests.helpers.fakes import make_config, make_engine
from neuronmodel_runtime.server.app import create_app
from neuronmodel_runtime.server.drain import serve

if __name__ == "__main__":
    port, delay = int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    drain = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = make_config(**{"server.port": port, "server.drain_timeout_s": drain})
    sys.exit(serve(create_app(make_engine(config, delay), config), config))
