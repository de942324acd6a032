"""trainer wing of stare_lab."""
