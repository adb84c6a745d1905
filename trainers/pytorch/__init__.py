"""The PyTorch trainer: the trial child (``python -m knobtune.trainers.pytorch``) and what it runs.
Users import its public names from ``knobtune.pytorch``.

Nothing is imported here, so that the child can check the torch version before anything imports
torch's submodules.
"""
