"""A discrete-event simulation of a mobile game that feeds Ladder through its public API.

``python -m sim`` runs it (``make demo`` under supervisord); ``python -m sim.set NAME VALUE``
changes a parameter of every running simulation. See ``docs/simulation.md``.
"""
