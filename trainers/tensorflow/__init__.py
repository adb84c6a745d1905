"""The TensorFlow trainer (Keras 3): the trial child (``python -m knobtune.trainers.tensorflow``) and
what it runs. Users import its public names from ``knobtune.tensorflow``.

Nothing else is imported here, so that the child can check the TensorFlow and Keras versions before
anything imports Keras.
"""
from __future__ import annotations

import os

# Before TensorFlow loads: its C++ start-up chatter would bury a crash's real last lines.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
