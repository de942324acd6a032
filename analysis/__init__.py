"""analysis wing of stare_lab."""
