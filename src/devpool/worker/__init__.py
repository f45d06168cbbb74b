"""What runs inside a worker process: its session, protocol, template side, capture."""
