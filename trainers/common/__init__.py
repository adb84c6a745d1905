"""Framework-free pieces shared by every trainer (and by the engine)."""
