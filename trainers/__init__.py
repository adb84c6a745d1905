"""Framework trainers. Each sub-package (pytorch, tensorflow) is run as a child process.

Only ``knobtune.trainers.<framework>`` imports a framework; ``knobtune.trainers.common`` is
framework-free and is shared by both trainers and by the engine.
"""
