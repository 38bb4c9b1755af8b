"""The built-in world."""
