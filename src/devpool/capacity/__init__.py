"""What a suite costs and how it splits: the capacity report, shards, their CLI."""
