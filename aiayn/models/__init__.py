"""§3 and the families it replaced."""
