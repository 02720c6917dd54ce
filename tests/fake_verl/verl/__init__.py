"""A test-only stand-in for the ``verl`` package (verl itself is not installed for the tests):
only ``verl.protocol.DataProto``. Tests put ``tests/fake_verl`` on ``sys.path``."""
