"""Ensembles of finite networks at initialization."""
