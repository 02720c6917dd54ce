"""The storage unit: the actor and the shard it holds (its columns)."""
