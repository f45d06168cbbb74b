"""What earlier runs left: test duration history and quarantine entries.

The duration history is opened through location.open_history, whatever holds it: a SQLite file
(durations.py, the default) or a fleet's PostgreSQL database (postgres.py); both answer the
queries of sql.py over the rows of results.py.
"""
