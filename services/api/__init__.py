"""The API service: the HTTP and WebSocket edge of Ladder.

- ``__main__.py`` the entry point (``python -m services.api``); ``serving/`` the uvicorn server
  subclass (``uvicorn_server.py``) and the worker processes on one port (``workers.py``).
- ``app.py`` :func:`create_app` and the lifespan that owns every connection and background task.
- The edge: ``state.py`` (what the lifespan opened, as request dependencies), ``auth.py``
  (credentials), ``errors.py`` (problem+json), ``bodies.py`` (request bodies), ``answers.py``
  (answers serialised as they are); ``routes/`` one module per group of endpoints.
- ``write/`` the score write: its models, the atomic write, the rate limits it takes.
- ``reads/`` the read model: which view a read names, pages and cursors, rank styles, a user's
  standing and its ranks everywhere.
- ``relay/`` the outbox relay to the broker; ``push/`` the Pub/Sub hub and the WebSocket.
- ``restorer.py`` the start-up restore of what Redis lost (definitions, friendships), then the
  friend sets' periodic reconcile with MySQL.
"""
