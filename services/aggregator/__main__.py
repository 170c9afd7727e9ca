"""``python -m services.aggregator``: see :mod:`services.aggregator.main`."""

from services.aggregator.main import main

main()
