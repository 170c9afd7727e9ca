"""``python -m services.notifier``: see :mod:`services.notifier.main`."""

from services.notifier.main import main

main()
