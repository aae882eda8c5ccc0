"""The modeldsl passes: one file per pass, each listed once in ``registry.PASSES``."""
