"""The store's client side: Store, its blocking face, the streaming loader and checkpoints."""
