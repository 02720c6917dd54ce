"""The store controller: the actor, its state, fetches, column-wise puts and samplers."""
