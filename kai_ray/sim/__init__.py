"""The simulator: the unchanged scheduling cycle on an in-memory cluster on a virtual clock."""
