"""The store controller: the actor, its state (ControllerState and its collaborators), fetches,
column-wise puts and samplers."""
