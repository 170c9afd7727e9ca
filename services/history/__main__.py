"""``python -m services.history``: see :mod:`services.history.main`."""

from services.history.main import main

main()
