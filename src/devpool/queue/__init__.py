"""One run across many CI jobs: a shared queue of tests in PostgreSQL (issue 37).

The first job publishes the run's tests; every job claims what its devices can hold under a
lease its heartbeat renews, reports each test's one final outcome, and `devpool queue
report` renders the run's one verdict. store.py is the database; everything else talks to it.
"""
