"""What earlier runs left: test duration history and quarantine entries."""
