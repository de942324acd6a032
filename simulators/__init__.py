"""simulators wing of stare_lab."""
