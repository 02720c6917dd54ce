"""Weight sync's transfer paths: one module per path behind one interface, and their registry.

``base`` holds the interface (:class:`~rayless.weights.paths.base.WeightPath`: publish →
entry, read an entry → a sink); ``shm``, ``cuda``, ``relay`` and ``dist`` the paths;
``registry`` the table keyed by :class:`~rayless.weights.messages.PathKind` that a client
chooses from. A new path is a module here, a ``PathKind`` member and a line in that table.
"""
