"""Framework trainers. Each sub-package (pytorch, tensorflow) is run as a child process.

Only ``trainers.<framework>`` imports a framework; ``trainers.common`` is framework-free and is
shared by both trainers and by the engine.
"""
