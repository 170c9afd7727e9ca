"""``python -m services.rebuild``: see :mod:`services.rebuild.main`."""

from services.rebuild.main import main

main()
