"""The fault suite: real load, a fault, and the counts afterwards (``make test-faults``).

"Nothing accepted is lost, nothing counts twice", checked under the faults that threaten it.
Each test drives an asyncio httpx client posting distinct events at the four services running as
processes under supervisord, injects one fault, lets the system recover, and then checks, and
prints as a ``FIGURES`` line, the counts: events sent, accepted (2xx), stored in MySQL,
duplicates; that every accepted event is in MySQL exactly once and nothing else is; that every
all-time regional board equals ``SUM(value)`` of its history and the global view the sum of the
regions; that the outbox and every queue are drained, nothing dead-lettered, and each consumer
back on its queue.

The faults are done to servers of the suite's own (:mod:`tests.faults.servers`: a Redis, a
RabbitMQ node and a MariaDB per test module, on ports and directories of their own), never to
the machine's, so nothing else running here notices.

========================================  ===============================================
module                                    fault
========================================  ===============================================
``test_broker.py``                        RabbitMQ stopped under load and started again; a
                                          channel closed before its ack; a consumer
                                          restarted while the broker is down
``test_consumers.py``                     aggregator, history and notifier each SIGKILLed
                                          mid-stream, restarted by supervisord
``test_mysql.py``                         MySQL stopped under load and started again;
                                          history restarted while MySQL is down
``test_messages.py``                      poison messages in the fanout under load; a relay
                                          killed between the broker's confirm and the
                                          outbox removal, two API processes on one outbox
``test_rebuild.py``                       Redis flushed, then ``make rebuild``: every view
                                          equal to before, twice; a rebuild under load
========================================  ===============================================

A consumer restarted while its broker or its database is down waits for it, and catches up
exactly once it is back.

Every test is marked ``faults``; ``make test`` leaves them out, ``make test-faults`` runs them
alone, with the figures (``-rP``). They need root or the right to run ``mariadbd`` (as root it
is started as ``mysql``), and the Debian packages ``redis-server``, ``rabbitmq-server`` and
``mariadb-server`` (``make infra`` installs them).
"""
