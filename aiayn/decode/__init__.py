"""§6.1's search."""
