"""Model backends behind one small interface, registered by name."""
