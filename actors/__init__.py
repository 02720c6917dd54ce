"""The runtime: head, node agents, actor processes, handles, supervision, local clusters.

Imports ``transport`` and ``placement``; never ``store``.
"""
