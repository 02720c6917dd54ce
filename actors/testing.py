"""A pytest plugin for rayless users and this project's tests (registered as ``rayless``).

The ``local_cluster`` fixture arrives with the actor runtime.
"""
