"""evo package."""
